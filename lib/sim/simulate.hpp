// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>

#include "control/replay.hpp"
#include "control/trace.hpp"
#include "core/json.hpp"
#include "plan/planner.hpp"
#include "sim/engine_replay.hpp"

/// `ftp-plan simulate`: its inputs read and checked, the replay chosen.
namespace ftp::sim {

/// What serves the replayed trace.
enum class Service {
  engine,    ///< the simulated engine behind the real scheduler (replay_engine); the default
  queueing,  ///< the M/M/c queueing model (control::replay): a fast first estimate
};
/// "engine" or "queueing"; throws InputError ("--service: ...") otherwise.
Service service_from_name(const std::string& name);

/// The inputs of simulate(), as the command line gives them.
struct SimulateOptions {
  Service service = Service::engine;
  std::string gears_path;              ///< the table to replay; empty: planned from topology and model
  std::string topology_path;           ///< ftp.topology/v1 or ftp.cluster/v1 (the engine model needs it)
  std::string model_path;              ///< model file or ftp.model-shape/v1 (the engine model needs it)
  std::string calibration_path;        ///< ftp.sim-calibration/v1; empty: the planner's constants
  std::string trace_path;              ///< or synthetic arrivals:
  control::SyntheticConfig synth;      ///< pattern, burstiness, seed, length distributions
  std::string policy = "gear-shifter"; ///< a PolicySpec
  std::string start_gear;              ///< empty: the static gear, else the first
  control::ReplayConfig replay;        ///< slice, intervals, SLOs; queueing-model parameters
  EngineReplayConfig engine;           ///< engine-model parameters (shape and topology are read here)
  plan::PlanOptions plan;              ///< for a table planned here
};

/// Reads the inputs, builds the policy and the trace, and replays it with
/// the chosen service: interval records to `emit`, the summary returned.
/// Errors name the file and field (InputError).
json::Json simulate(SimulateOptions o, const std::function<void(const json::Json&)>& emit);

}  // namespace ftp::sim
