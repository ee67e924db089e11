// SPDX-License-Identifier: Apache-2.0
#include "sim/simulate.hpp"

#include "core/error.hpp"
#include "doc/gear_table.hpp"
#include "sim/serving.hpp"
#include "sim/simulated_engine.hpp"

namespace ftp::sim {

Service service_from_name(const std::string& name) {
  if (name == "engine") return Service::engine;
  if (name == "queueing") return Service::queueing;
  throw InputError("--service: unknown service \"" + name + "\" (expected engine or queueing)");
}

json::Json simulate(SimulateOptions o, const std::function<void(const json::Json&)>& emit) {
  const bool engine = o.service == Service::engine;
  if (o.trace_path.empty() == o.synth.pattern.empty()) throw InputError("simulate: give one of --trace and --rate-pattern");
  if (engine && (o.topology_path.empty() || o.model_path.empty()))
    throw InputError("simulate: the engine model needs --topology and --model (the cluster and the model the gears "
                     "serve); --service queueing replays a gear table alone");
  if (!engine && o.gears_path.empty() && (o.topology_path.empty() || o.model_path.empty()))
    throw InputError("simulate: give --gears, or --topology and --model");
  if (!engine && !o.gears_path.empty() && (!o.topology_path.empty() || !o.model_path.empty()))
    throw InputError("simulate: --gears is the table to replay; --topology and --model plan one instead, give either");

  doc::Topology topo;
  plan::ModelShape shape;
  if (!o.topology_path.empty()) topo = read_topology(o.topology_path);
  if (!o.model_path.empty()) shape = plan::read_model_input(o.model_path);
  doc::GearTable table;
  if (!o.gears_path.empty()) {
    table = json::parse_file(o.gears_path, [](const json::Json& j) { return doc::gear_table_from_json(j); });
    if (engine) {
      try {
        doc::validate_against(table, topo);
      } catch (const std::exception& e) {
        json::rethrow_with_source(o.gears_path, e);
      }
      if (table.model.n_layers != shape.n_layers || table.model.n_heads != shape.n_heads ||
          table.model.n_kv_heads != shape.n_kv_heads)
        throw InputError(o.gears_path + ": the table's model (" + std::to_string(table.model.n_layers) + " layers, " +
                         std::to_string(table.model.n_heads) + " heads) is not " + o.model_path + " (" +
                         std::to_string(shape.n_layers) + " layers, " + std::to_string(shape.n_heads) + " heads)");
    }
  } else {
    table = plan::plan(topo, shape, o.plan).table;
  }

  const auto spec = control::parse_policy_spec(o.policy);
  control::PolicyConfig config;
  if (!spec.config_path.empty())
    config = json::parse_file(spec.config_path, [](const json::Json& j) { return control::policy_config_from_json(j); });
  std::unique_ptr<control::Policy> policy;
  try {
    policy = control::make_replay_policy(spec, table, config);
  } catch (const std::exception& e) {
    if (o.gears_path.empty()) throw;
    json::rethrow_with_source(o.gears_path, e);  // the table's errors name its file, as decide's do
  }
  if (o.start_gear.empty()) o.start_gear = spec.name == "static" ? spec.gear : table.gears.front().name;
  if (!table.find(o.start_gear)) throw InputError("--start-gear: gear \"" + o.start_gear + "\" is not in the gear table");

  control::Trace trace;
  if (!o.trace_path.empty()) {
    trace = control::read_trace(o.trace_path);
  } else {
    o.synth.duration_s = o.replay.duration_s;
    trace = control::synthesize(o.synth);
    o.replay.start_s = 0;
    // Replay the whole pattern, a quiet tail with no arrivals included.
    if (o.replay.duration_s <= 0) o.replay.duration_s = control::pattern_length_s(o.synth.pattern);
  }
  if (!engine) return control::replay(trace, *policy, o.policy, table, o.start_gear, o.replay, emit);
  o.engine.shape = shape;
  o.engine.topology = std::move(topo);
  if (!o.calibration_path.empty()) o.engine.calibration = read_calibration(o.calibration_path);
  return replay_engine(trace, *policy, o.policy, table, o.start_gear, o.replay, o.engine, emit);
}

}  // namespace ftp::sim
