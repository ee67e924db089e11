// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "engine/domain.hpp"
#include "model/model.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"
#include "sim/calibrate.hpp"
#include "sim/simulated_engine.hpp"

/// What `ftp-serve --engine sim` needs: a model without weights, the engine
/// factory, the calibration document.
namespace ftp::sim {

/// The engines ftp-serve can run: "real" (engine::Executor) or "sim".
/// Throws InputError naming the value otherwise.
void check_engine_name(const std::string& name);

/// The model the simulated engine serves: from a model-shape JSON
/// (ftp.model-shape/v1: its hparams and the byte-level stand-in tokenizer,
/// sim_byte_tokenizer), or from a model file (GGUF or llama2.c: its hparams
/// and vocabulary; the weights stay unread). `shape` receives the shape the
/// cost model uses. Errors name the file.
model::Model load_sim_model(const std::string& path, const std::string& tokenizer_path, plan::ModelShape& shape);

/// A factory of simulated engines for the domains of a service: each domain
/// gets its replica's stages on `topo` (replica_stages), the calibration, and
/// a token stream that never produces the tokenizer's control,
/// end-of-generation or byte (<0xNN>) tokens (the byte-level stand-in: lower-case letters and
/// the space, so the text reads as words).
std::function<std::unique_ptr<engine::Engine>(const doc::Replica&, const engine::DomainConfig&)> engine_factory(
    const plan::ModelShape& shape, const model::Model& model, doc::Topology topo, plan::Calibration calibration,
    Pacing pacing);

/// ftp.sim-calibration/v1: the constants of a calibration (plan::Calibration),
/// the device speeds they were fitted against and the constants the fit left
/// at a bound (sim::fit_calibration; "at_bound", informative).
json::Json calibration_to_json(const plan::Calibration& c, const plan::GroupPerf& fitted_on, double rms_error,
                               const std::vector<BoundHit>& at_bound = {});
/// Reads a ftp.sim-calibration/v1 file; errors name the file and the field.
plan::Calibration read_calibration(const std::string& path);

}  // namespace ftp::sim
