// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>

#include "control/policy.hpp"
#include "control/replay.hpp"
#include "control/trace.hpp"
#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"
#include "plan/shift_cost.hpp"

/// `ftp-plan simulate` on the engine's own model: the trace served by
/// simulated engines behind the real domain scheduler, in virtual time.
namespace ftp::sim {

/// Parameters of replay_engine besides the slice, intervals and SLOs of
/// control::ReplayConfig (whose queueing-model fields it does not read).
struct EngineReplayConfig {
  plan::ModelShape shape;              ///< the model the gears serve
  doc::Topology topology;              ///< the devices and links the gears name
  plan::Calibration calibration;       ///< the cost model's constants (ftp.sim-calibration/v1)
  int block_tokens = 16;               ///< KV page size, positions
  int max_running = plan::kMaxDecodeBatch;  ///< running batch of one domain at most (the planner's assumption)
  int slow_start_steps = 20;           ///< a new domain runs at 70 % of max_running for this many steps
  double rollback_p99_factor = 1.5;    ///< a ramp check fails when the new domains' P99 E2E > this x the baseline
  /// After the slice: no more arrivals, in-flight requests go on being
  /// served for at most this long (virtual s); what is left then is
  /// counted unfinished.
  double tail_s = 600;
  /// Router rule: a prompt of at least this many tokens goes to the serving
  /// domain of the largest TP degree (during a shift, old and new gears
  /// serve together); 0: off (as ftp-serve's --route-long-prompt-tokens).
  int long_prompt_tokens = 0;
  plan::ShiftCostConfig shift;         ///< reserve, warm-up, weight reload, ramp
};

/// KV pages of one domain of `gear` on the devices of `replica`: on each
/// stage's smallest rank, kv_cache_cap x (memory - weights - activations at
/// the gear's max_batched_tokens) / (block_tokens x layers x
/// kv_bytes_per_token_layer(tp)), the least over stages; at most what
/// max_running requests of the full context take. Throws InputError naming
/// the gear when a stage has no room for one page.
int kv_pages_for(const plan::ModelShape& shape, const doc::Topology& topo, const doc::Gear& gear,
                 const doc::Replica& replica, int block_tokens, int max_running);

/// Replays a trace in virtual time through a policy against SIMULATED
/// engines (SimulatedEngine: cost-model steps) behind the real scheduler
/// (engine::Domain: continuous batching, chunked prefill under the gear's
/// max_batched_tokens, paged KV under kv_pages_for with preemption and
/// recompute, the gear's micro-batches), one domain per replica.
///
/// Discrete events: the clock jumps to the next arrival, the next end of a
/// domain's step, the next control tick (1 s queue samples, observations,
/// intervals) or the next phase of a shift; a domain steps again when its
/// step ends and it has work. Domains that share a device take turns (a
/// step waits for the device). Arrivals go to the serving domains by
/// traffic share through control::Router, as the daemon routes: smooth
/// weighted round robin, shares in proportion to each domain's capacity
/// (control::capacity_shares of plan::estimate_replica at the trace's mean
/// mix), long prompts to the largest TP when long_prompt_tokens is set. A shift follows the
/// daemon's: reserve (plan::reserve_phase_s), warm (a one-token request on
/// each new domain plus plan::ShiftCostConfig::warm_s), the ramp's shares
/// with a check after each wait (errors or P99 E2E over the factor roll it
/// back), then the old domains drain while the new ones serve and retire
/// when idle. Every observation_period_s the policy sees an observation
/// built as the daemon's (man ftp-plan(1), SIMULATE), with the queue's
/// token backlog (queued_prompt_tokens) and the bubble ratio of the last step, and a shift decision
/// starts a shift at its not_before_ms.
///
/// `emit` gets one ftp.sim-interval/v1 record per interval_s; the return
/// value is the ftp.sim-summary/v1 ("service": "simulated-engine").
/// Deterministic: the same inputs give the same records.
json::Json replay_engine(const control::Trace& trace, control::Policy& policy, const std::string& policy_spec,
                         const doc::GearTable& table, const std::string& start_gear,
                         const control::ReplayConfig& config, const EngineReplayConfig& engine,
                         const std::function<void(const json::Json&)>& emit);

}  // namespace ftp::sim
