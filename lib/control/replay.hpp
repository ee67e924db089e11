// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "control/policy.hpp"
#include "control/queueing_model.hpp"
#include "control/trace.hpp"
#include "core/json.hpp"
#include "doc/gear_table.hpp"

namespace ftp::control {

/// A --policy of `ftp-plan simulate`: static:GEAR, dynamic-tp (= tp-planner),
/// gear-shifter or naive, each optionally followed by ":CONFIG.json"
/// (ftp.policy/v1).
struct PolicySpec {
  std::string name;            ///< "static", "tp-planner", "gear-shifter", "naive"
  std::string gear;            ///< static only
  std::string config_path;     ///< empty: the built-in defaults
};
/// Throws ftp::InputError ("--policy: ...") for a spec it cannot read.
PolicySpec parse_policy_spec(std::string_view spec);

/// The baseline of a replay: stays on one gear, always holds.
class StaticGear final : public Policy {
 public:
  explicit StaticGear(std::string gear) : gear_(std::move(gear)) {}
  doc::Decision observe(const doc::Observation& o) override;
  std::string_view name() const noexcept override { return "static"; }

 private:
  std::string gear_;
};

/// Builds the policy of a spec; the table must outlive it. Throws
/// ftp::InputError for a static gear the table lacks.
std::unique_ptr<Policy> make_replay_policy(const PolicySpec& spec, const doc::GearTable& table,
                                           const PolicyConfig& config);

/// Parameters of replay().
struct ReplayConfig {
  double start_s = 0;            ///< slice of the trace: from this trace time, s
  double duration_s = 0;         ///< ... for this long (trace time), s; 0: to the end
  double rate_scale = 1;         ///< arrivals are compressed in time by this factor (2: twice the rate)
  double interval_s = 10;        ///< one ftp.sim-interval/v1 record per this much virtual time, s
  double observation_period_s = 1;   ///< the policy sees an observation this often, s (as ftp-serve --auto)
  double slo_ttft_ms = 2000;     ///< a request meets the SLA with TTFT <= this ...
  double slo_tpot_ms = 100;      ///< ... and TPOT <= this, ms
  double prefill_share = 0.2;    ///< share of the service time before the first token
  QueueingModelConfig model;     ///< the service model; its sla_ms is derived from the SLOs
};

/// Replays a trace in virtual time through a policy (the real controller
/// code) against QueueingModelSim, the simulated service, starting on
/// start_gear. Per step of model.step_ms the arrivals of the trace in that
/// step drive the model; every observation_period_s the policy sees the
/// model's observation (with the trace's mean prompt and output tokens) and
/// a shift decision starts a shift at its not_before_ms.
///
/// Latencies: the model has one service time S per request; TTFT = queue
/// wait + prefill_share x S; TPOT = (1 - prefill_share) x S / mean output
/// tokens of the slice, the same for every request. A request attains the
/// SLA when TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms.
///
/// `emit` gets one ftp.sim-interval/v1 record per interval_s; the return
/// value is the ftp.sim-summary/v1 (man ftp-plan(1), SIMULATE, for the fields).
json::Json replay(const Trace& trace, Policy& policy, const std::string& policy_spec, const doc::GearTable& table,
                  const std::string& start_gear, const ReplayConfig& config,
                  const std::function<void(const json::Json&)>& emit);

}  // namespace ftp::control
