// SPDX-License-Identifier: Apache-2.0
// simulate-bench: how fast `ftp-plan simulate` replays, end to end in one
// process (cluster spec -> topology -> planned gear table -> trace ->
// replay through the gear shifter against the SIMULATED service: the
// engine model, simulated engines behind the real scheduler, by default;
// --service queueing for the queueing model). Two cases, the goals of
// issues #6 and #18:
//   azure-conv-8gpu  the 1 h Azure LLM 2023 conversation trace on
//                    examples/clusters/a100-8x-nvlink (8 GPUs), goal < 10 s
//   synthetic-512gpu a 512-GPU cluster generated here (64 nodes x 8
//                    A100-80GB, NVSwitch inside, 200 Gb/s InfiniBand
//                    between) with 1 h of synthetic gamma arrivals on a day
//                    curve up to 0.8 x the performance gear, goal < 60 s
// For each: wall time (and its parts), virtual time, requests, the work
// served (prompt and decode tokens, preemptions: the replay's cost grows
// with them), wall / goal and virtual / wall, measured in this run. It
// prints; it gates nothing.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "cli/tool.hpp"
#include "control/policy.hpp"
#include "control/replay.hpp"
#include "control/trace.hpp"
#include "doc/cluster.hpp"
#include "plan/model_shape.hpp"
#include "plan/planner.hpp"
#include "sim/engine_replay.hpp"
#include "sim/simulate.hpp"
#include "test_data.hpp"

using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// 64 nodes x 8 A100-SXM4-80GB: NVSwitch in each node, one InfiniBand fabric between them.
json::Json cluster_512() {
  json::Json nodes = json::Json::array(), fabrics = json::Json::array(), all = json::Json::array();
  for (int i = 0; i < 64; ++i) {
    const std::string id = "n" + std::to_string(i);
    nodes.push_back({{"id", id},
                     {"hostname", "node-" + std::to_string(i)},
                     {"cpu_cores", 128},
                     {"memory_gib", 2048},
                     {"devices", json::Json::array({{{"id", "gpu"},
                                                     {"count", 8},
                                                     {"type", "gpu"},
                                                     {"name", "NVIDIA A100-SXM4-80GB"},
                                                     {"memory_gib", 80},
                                                     {"tflop_s", 312},
                                                     {"dtype", "bf16"},
                                                     {"memory_bandwidth_gb_s", 2039},
                                                     {"compute_units", 108}}})}});
    fabrics.push_back({{"id", "nvswitch-" + id}, {"type", "nvswitch"}, {"nodes", json::Json::array({id})},
                       {"bandwidth_gb_s", 300}, {"latency_us", 2}});
    all.push_back(id);
  }
  fabrics.push_back({{"id", "ib"}, {"type", "infiniband"}, {"nodes", all}, {"bandwidth_gb_s", 25}, {"latency_us", 5}});
  return {{"kind", "ftp.cluster/v1"}, {"name", "sim-512-a100"}, {"nodes", nodes}, {"fabrics", fabrics}};
}

struct Case {
  std::string name;
  double goal_s;
  std::function<json::Json()> spec;                           // the cluster spec
  std::function<control::Trace(const doc::GearTable&)> trace;  // the arrivals for the planned table
};

json::Json run_case(const Case& c, const plan::ModelShape& model, sim::Service service, double duration_s) {
  const auto t0 = Clock::now();
  doc::Topology topo = doc::topology_from_cluster_spec(c.spec());
  plan::Plan p = plan::plan(topo, model, plan::PlanOptions{});
  const double plan_s = since(t0);
  auto t1 = Clock::now();
  control::Trace trace = c.trace(p.table);
  const double trace_s = since(t1);
  t1 = Clock::now();
  auto policy = control::make_policy("gear-shifter", p.table, control::PolicyConfig{});
  control::ReplayConfig rc;
  rc.duration_s = duration_s;
  std::size_t intervals = 0;
  auto count = [&](const json::Json&) { ++intervals; };
  json::Json summary;
  if (service == sim::Service::queueing) {
    summary = control::replay(trace, *policy, "gear-shifter", p.table, p.table.gears.front().name, rc, count);
  } else {
    sim::EngineReplayConfig ec;
    ec.shape = model;
    ec.topology = topo;
    summary = sim::replay_engine(trace, *policy, "gear-shifter", p.table, p.table.gears.front().name, rc, ec, count);
  }
  const double replay_s = since(t1);
  const double wall_s = since(t0);
  const double virtual_s = summary.at("duration_s").get<double>();
  return {{"case", c.name},
          {"service", summary.at("service")},
          {"devices", topo.devices.size()},
          {"gears", p.table.gears.size()},
          {"candidates", p.candidates.size()},
          {"requests", trace.requests.size()},
          {"intervals", intervals},
          {"shifts", summary.at("shifts")},
          {"preemptions", summary.contains("preemptions") ? summary.at("preemptions") : json::Json(0)},
          {"prompt_tokens", summary.contains("prompt_tokens") ? summary.at("prompt_tokens") : json::Json(0)},
          {"decode_tokens", summary.contains("decode_tokens") ? summary.at("decode_tokens") : json::Json(0)},
          {"sla_attainment", summary.at("sla_attainment")},
          {"gpu_hours", summary.at("gpu_hours")},
          {"plan_s", plan_s},
          {"trace_s", trace_s},
          {"replay_s", replay_s},
          {"wall_s", wall_s},
          {"virtual_s", virtual_s},
          {"goal_s", c.goal_s},
          {"wall_over_goal", wall_s / c.goal_s},
          {"virtual_over_wall", virtual_s / wall_s}};
}

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("simulate-bench",
                 "Replay speed of ftp-plan simulate: the 1 h Azure conversation trace on 8 GPUs (goal < 10 s) and\n"
                 "1 h of synthetic traffic on a generated 512-GPU cluster (goal < 60 s); prints wall time, virtual\n"
                 "time and wall / goal, measured in this run.");
  const char* root_env = std::getenv("FTP_SOURCE_ROOT");
  const std::string root = root_env ? root_env : ".";
  const std::string data = test::data_dir();
  std::string model_path, cluster_path, trace_path, service = "engine";
  double duration_s = 3600;
  auto& app = tool.app();
  app.add_option("--model", model_path, "Model shape (default: examples/models/llama-70b.json)")->option_text("FILE");
  app.add_option("--cluster", cluster_path, "8-GPU cluster spec (default: examples/clusters/a100-8x-nvlink.json)")
      ->option_text("FILE");
  app.add_option("--trace", trace_path,
                 "Azure conversation trace (default: $FTP_TEST_DATA/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv)")
      ->option_text("FILE");
  app.add_option("--duration", duration_s, "Virtual seconds of each case (default 3600; the goals are for 3600)")
      ->check(cli::positive());
  app.add_option("--service", service, "engine (default) or queueing, as ftp-plan simulate --service")
      ->check(CLI::IsMember({"engine", "queueing"}))
      ->option_text("NAME");
  return tool.run(argc, argv, [&]() -> int {
    if (model_path.empty()) model_path = root + "/examples/models/llama-70b.json";
    if (cluster_path.empty()) cluster_path = root + "/examples/clusters/a100-8x-nvlink.json";
    if (trace_path.empty()) trace_path = data + "/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv";
    const plan::ModelShape model = plan::read_model_shape(model_path);

    std::vector<Case> cases;
    if (std::filesystem::exists(trace_path)) {
      cases.push_back({"azure-conv-8gpu", 10, [&] { return json::read_file(cluster_path); },
                       [&](const doc::GearTable&) { return control::read_trace(trace_path); }});
    } else {
      std::fprintf(stderr, "SKIP: azure-conv-8gpu: %s not found (set FTP_TEST_DATA to ../shared/data)\n",
                   trace_path.c_str());
    }
    cases.push_back({"synthetic-512gpu", 60, cluster_512, [&](const doc::GearTable& t) {
                       double top = 0;
                       for (const auto& g : t.gears) top = std::max(top, g.estimated ? g.estimated->max_rps : 0.0);
                       control::SyntheticConfig s;
                       // A day curve compressed into the hour: trough at 1/5 of the peak, peak at 0.8 x the largest gear.
                       char pattern[96];
                       std::snprintf(pattern, sizeof pattern, "day:%.3f,%.3f@3600", 0.16 * top, 0.8 * top);
                       s.pattern = pattern;
                       s.duration_s = duration_s;
                       s.burstiness = 2;
                       return control::synthesize(s);
                     }});
    json::Json results = json::Json::array();
    for (const auto& c : cases) {
      json::Json r = run_case(c, model, sim::service_from_name(service), duration_s);
      std::fprintf(stderr,
                   "simulate-bench: %s: %lld devices, %lld requests, %.0f s virtual in %.3f s wall (plan %.3f, trace %.3f, "
                   "replay %.3f) = %.4f of the %.0f s goal; %.0fx real time; %s\n",
                   c.name.c_str(), r.at("devices").get<long long>(), r.at("requests").get<long long>(),
                   r.at("virtual_s").get<double>(), r.at("wall_s").get<double>(), r.at("plan_s").get<double>(),
                   r.at("trace_s").get<double>(), r.at("replay_s").get<double>(), r.at("wall_over_goal").get<double>(),
                   c.goal_s, r.at("virtual_over_wall").get<double>(), r.at("service").get<std::string>().c_str());
      results.push_back(std::move(r));
    }
    tool.emit(json::Json{{"kind", "ftp.simulate-bench/v1"},
                         {"service", service == "engine" ? "simulated-engine" : "queueing-model"},
                         {"policy", "gear-shifter"},
                         {"model", model.name},
                         {"cases", results}});
    return 0;
  });
}
