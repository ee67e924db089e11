// SPDX-License-Identifier: Apache-2.0
#include "sim/serving.hpp"

#include <cctype>
#include <fstream>

#include "core/error.hpp"
#include "doc/kinds.hpp"
#include "model/tokenizer.hpp"

namespace ftp::sim {

void check_engine_name(const std::string& name) {
  if (name != "real" && name != "sim")
    throw InputError("--engine: unknown engine \"" + name + "\"; expected \"real\" or \"sim\"");
}

model::Model load_sim_model(const std::string& path, const std::string& tokenizer_path, plan::ModelShape& shape) {
  shape = plan::read_model_input(path);
  std::ifstream in(path, std::ios::binary);
  char first = 0;
  in >> first;  // skips white space, as read_model_input does
  if (first != '{') {
    // A model file: its vocabulary; the weights are mapped, never read.
    model::Model m = model::load_model(path, tokenizer_path);
    m.format += " (simulated engine)";
    return m;
  }
  model::Model m;
  m.hparams = hparams_of(shape);
  m.tokenizer = sim_byte_tokenizer(shape.vocab_size);
  m.path = path;
  m.format = "model-shape (simulated engine, byte-level stand-in tokenizer)";
  return m;
}

std::function<std::unique_ptr<engine::Engine>(const doc::Replica&, const engine::DomainConfig&)> engine_factory(
    const plan::ModelShape& shape, const model::Model& model, doc::Topology topo, plan::Calibration calibration,
    Pacing pacing) {
  const std::shared_ptr<const model::Tokenizer> tok_of = model::tokenizer_of(model);
  const model::Tokenizer& tok = *tok_of;
  std::vector<int> ids, avoid;
  if (model.format.rfind("model-shape", 0) == 0) {
    for (char c = 'a'; c <= 'z'; ++c) ids.push_back(3 + static_cast<unsigned char>(c));
    ids.push_back(259);
  } else {
    for (int t = 0; t < tok.n_vocab(); ++t)
      // Also byte tokens (<0xNN>): alone they are pieces of UTF-8 characters.
      if (tok.is_control(t) || tok.is_eog(t) || t == tok.bos() || t == tok.eos() ||
          (tok.token_text(t).size() == 6 && tok.token_text(t).compare(0, 3, "<0x") == 0))
        avoid.push_back(t);
  }
  return [shape, topo = std::move(topo), calibration, pacing, ids, avoid](const doc::Replica& rep,
                                                                           const engine::DomainConfig& dc) {
    SimulatedEngineOptions o;
    o.shape = shape;
    o.stages = replica_stages(shape, topo, rep, dc);
    o.calibration = calibration;
    o.kv_blocks = dc.kv_blocks;
    o.block_tokens = dc.block_tokens;
    o.token_ids = ids;
    o.avoid = avoid;
    o.pacing = pacing;
    return std::unique_ptr<engine::Engine>(std::make_unique<SimulatedEngine>(std::move(o)));
  };
}

json::Json calibration_to_json(const plan::Calibration& c, const plan::GroupPerf& p, double rms_error,
                               const std::vector<BoundHit>& at_bound) {
  json::Json bounds = json::Json::array();
  for (const auto& h : at_bound)
    bounds.push_back(json::Json{{"term", h.term}, {"bound", h.upper ? "upper" : "lower"}, {"value", h.value}});
  json::Json j{{"kind", std::string(doc::kind::sim_calibration)},
                    {"compute_efficiency", c.compute_efficiency},
                    {"attention_efficiency", c.attention_efficiency},
                    {"memory_efficiency", c.memory_efficiency},
                    {"layer_overhead_s", c.layer_overhead_s},
                    {"row_overhead_s", c.row_overhead_s},
                    {"row_tile", c.row_tile},
                    {"pass_efficiency", c.pass_efficiency},
                    {"overlap", c.overlap},
                    {"fitted_on", json::Json{{"tflop_s", p.tflop_s}, {"gb_s", p.gb_s}}},
                    {"rms_relative_error", rms_error},
                    {"at_bound", bounds}};
  if (c.kv_efficiency > 0) j["kv_efficiency"] = c.kv_efficiency;
  return j;
}

plan::Calibration read_calibration(const std::string& path) {
  return json::parse_file(path, [](const json::Json& j) {
    const std::string k = j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "";
    if (k != doc::kind::sim_calibration)
      throw InputError("kind: expected \"" + std::string(doc::kind::sim_calibration) + "\", got \"" + k + "\"");
    plan::Calibration c;
    auto num = [&](const char* key, double& out, bool positive) {
      if (!j.contains(key)) return;
      if (!j[key].is_number()) throw InputError(std::string(key) + ": expected a number");
      out = j[key].get<double>();
      if (positive ? !(out > 0) : out < 0)
        throw InputError(std::string(key) + ": must be " + (positive ? "positive" : "non-negative") + ", got " +
                         std::to_string(out));
      // Efficiencies are shares of a peak and overheads seconds per layer
      // or row: far outside these, a step's time overflows the clock.
      if (positive ? (out < 1e-6 || out > 1e3) : out > 1.0)
        throw InputError(std::string(key) + ": " + std::to_string(out) + " is out of range (" +
                         (positive ? "1e-6 to 1000" : "0 to 1 s") + ")");
    };
    num("compute_efficiency", c.compute_efficiency, true);
    num("attention_efficiency", c.attention_efficiency, true);
    num("memory_efficiency", c.memory_efficiency, true);
    num("kv_efficiency", c.kv_efficiency, true);
    num("layer_overhead_s", c.layer_overhead_s, false);
    num("row_overhead_s", c.row_overhead_s, false);
    num("pass_efficiency", c.pass_efficiency, true);
    if (j.contains("row_tile")) {
      const json::Json& v = j["row_tile"];
      if (!v.is_number_integer()) throw InputError("row_tile: expected a whole number of rows");
      const auto n = v.get<std::int64_t>();
      if (n < 0 || n > 1024) throw InputError("row_tile: " + std::to_string(n) + " is out of range (0 to 1024)");
      c.row_tile = static_cast<int>(n);
    }
    if (j.contains("overlap")) {
      if (!j["overlap"].is_boolean()) throw InputError("overlap: expected true or false");
      c.overlap = j["overlap"].get<bool>();
    }
    return c;
  });
}

}  // namespace ftp::sim
