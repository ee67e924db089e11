// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "control/capacity.hpp"
#include "control/predictor.hpp"
#include "core/json.hpp"
#include "doc/control.hpp"
#include "doc/gear_table.hpp"

namespace ftp::control {

/// Gear-shifter parameters (ARCHITECTURE.md §4; those marked "ours" are not
/// in the design and were chosen here).
struct GearShifterConfig {
  double min_dwell_s = 300;            ///< no load-driven shift sooner after the last shift, s (up-shifts: up_dwell_s)
  /// ours: no load-driven up-shift sooner after the last shift, s; < 0:
  /// min_dwell_s. Shorter than the down dwell: a gear too small for a burst
  /// costs the SLA at once, one too large only GPU-hours.
  double up_dwell_s = 60;
  /// ours: a down-shift's target must also carry the highest forecast level
  /// of this window, in its own work (after a down-shift the next up-shift
  /// waits up_dwell_s and its confirmations, so the smaller gear must carry
  /// what the recent past brought), and no down-shift comes before the
  /// shifter has seen this long; 0: off (the forecast and the rate now only)
  double down_peak_window_s = 300;
  double up_threshold = 0.85;          ///< up-shift when forecast > up_threshold x safe capacity
  double down_threshold = 0.30;        ///< down-shift when forecast < down_threshold x safe capacity
  /// ours: down-shift also when the forecast, in the next smaller gear's
  /// work, is under down_fit x that gear's safe capacity: the band's lower
  /// edge follows the ladder's spacing (a fixed down_threshold of the
  /// current gear is 0.47 of TP4's capacity from TP8, 0.54 from TP4 to
  /// TP2, and held TP8 where TP4 carried the load); 0: off (down_threshold alone)
  double down_fit = 0.7;
  int confirmations = 3;               ///< consecutive agreeing observations needed
  double confirmation_period_s = 10;   ///< spacing of the observations that count as confirmations, s
  int min_agreeing_signals = 2;        ///< signals that must agree, the forecast included
  double queue_depth_up = 8;           ///< ours: queue_depth_mean above which the queue votes up, requests
  double queue_depth_down = 1;         ///< ours: below which it votes down
  double queue_time_up_ms = 1000;      ///< ours: est_queue_time_ms above which it votes up
  double queue_time_down_ms = 100;     ///< ours: below which it votes down
  double bubble_ratio = 0.2;           ///< bubble ratio above which the pipeline shape no longer fits (votes for any shift)
  double contention_index = 0.3;       ///< ours: contention above which the gear is short of compute (votes up)
  /// ours: the load the forecast is weighed in: true ("work"): the forecast
  /// request rate at the observed mix of prompt and output tokens, as
  /// control::work_rps makes it (a gear's capacity without token rates
  /// counts requests); false ("requests"): requests/s alone.
  bool work_load = true;
  /// ours: queued prompt tokens / the gear's prefill_tokens_s above which
  /// the token backlog votes up, s (it never votes down: an empty queue is
  /// the queue-depth signal's to say)
  double backlog_up_s = 2;
  /// ours: a token backlog over this many seconds of the gear's prefill
  /// gives the up direction by itself, with the forecast inside the band
  /// (the gear serves less than its capacity says); the target then holds
  /// the forecast plus the backlog drained over the predictor's horizon.
  /// 0: off (the backlog only votes)
  double backlog_drive_s = 2;
  /// ours: a backlog-driven up-shift from a gear at work load L says the
  /// gear carries less than its capacity: its safe capacity, and that of
  /// every smaller gear, is scaled down to L for the rest of
  /// the run, by a factor of no less than this. 1: off (the capacities stay
  /// as the table and the capacity refresh say).
  double backlog_derate_floor = 0.25;
  /// ours: TTFT P99 above which, with the queue's 30 s mean at most
  /// queue_depth_down, the gear is too slow per request (long prompts), not
  /// too small: that gives the up direction by itself, one step up at
  /// least, and needs no second signal (its condition is two already), ms;
  /// 0: off
  double ttft_slo_ms = 2000;
  /// ours: TPOT P99 above which the gear's steps are too slow for the SLO
  /// (prefill chunks between the decodes of a small TP), queue or not: the
  /// latency drive's second condition, as ttft_slo_ms, ms; 0: off
  double tpot_slo_ms = 100;
  /// ours: a gear left by the latency drive is no target of a load-driven
  /// shift down for this long, s (it would be too slow again)
  double latency_hold_s = 1800;
  /// ours: the urgent path. With the up direction and a token backlog over
  /// this many seconds of the gear's prefill, the queue's tail already
  /// misses the TTFT SLO and each confirmation costs more than a bad shift:
  /// the up-shift is decided at once, with no confirmation, second signal
  /// or up dwell; 0: off
  double urgent_backlog_s = 2;
  /// ours: the ramp of an urgent up-shift (new domains' traffic shares,
  /// increasing, ending at 1), with urgent_ramp_step_s of wait and a check
  /// before each share under 1. The executor's ramp (10 %, 50 %, 100 %, 1 s
  /// each) guards against a bad new domain, but with the old gear past the
  /// SLO already, every second it keeps 90 % or 50 % of a burst costs more
  /// than the risk; one half-second step at 50 % keeps one check (a
  /// failing new domain is rolled back at its end). {1}: no check; empty:
  /// the executor's ramp
  std::vector<double> urgent_ramp{0.5, 1.0};
  double urgent_ramp_step_s = 0.5;     ///< ours: the wait at each step of urgent_ramp, s
  /// ours: the backlog drive and the urgent path weigh the token backlog
  /// this far ahead, s, at its growth since the last observation (only
  /// growth counts): a shift takes seconds, and a queue that grows past
  /// the SLO by then is better met now; 0: the backlog now
  double backlog_lead_s = 0;
  /// ours: after an urgent up-shift the gear it left is taken back, by
  /// itself (no dwell, forecast or down-peak window, which the burst
  /// inflated), once for this long the queue is empty (30 s mean at most
  /// queue_depth_down, no token backlog) and the rate now, in that gear's
  /// work, is within up_threshold x its safe capacity: a burst shorter than
  /// the dwell costs its own length in the larger gear, and the urgent path
  /// catches the next one, s; 0 (the default: on the traces of
  /// examples/scenarios (c) it cost SLA attainment for few GPU-hours): off,
  /// the down rules decide
  double burst_return_s = 0;
  double kv_pressure_up = 0.8;         ///< ours: KV watermark above which KV pressure votes up
  double kv_pressure_down = 0.5;       ///< ours: below which it votes down
  double memory_guard_kv = 0.90;       ///< KV watermark above which the memory-guard gear is taken at once
  double memory_guard_exit_kv = 0.70;  ///< ours: KV watermark below which the memory guard may be left
  int replicas = 1;                    ///< replicas that would shift together; > 1 turns on the stagger
  double stagger_max_s = 300;          ///< random start offset within [0, stagger_max_s], s
  std::uint64_t seed = 0;              ///< seed of the stagger's std::mt19937_64; give each replica its own
  double shift_timeout_s = 600;        ///< ours: a decided shift not seen done by not_before + this is forgotten, s
};

/// Rollback after a shift (part of the gear shifter).
struct RollbackConfig {
  double p99_factor = 1.5;             ///< roll back when E2E P99 > p99_factor x the pre-shift baseline ...
  double window_s = 180;               ///< ... for this long without a break, s
  double watch_s = 600;                ///< ours: the shift is committed after this long without such a breach, s
  double baseline_window_s = 60;       ///< ours: the baseline is the mean E2E P99 over this span before the decision, s
};

/// TP-planner parameters (ARCHITECTURE.md §4).
struct TpPlannerConfig {
  double loop_ms = 500;                ///< evaluation period; observations closer than this are held, ms
  double alpha = 0.25;                 ///< EWMA weight of the rate predictor (design: 0.2-0.3)
  double target_utilization = 0.5;     ///< target TP sizes devices to this utilisation
  double scale_down_utilization = 0.4; ///< scale down only when device utilisation stays below this ...
  double scale_down_after_s = 300;     ///< ... for this long, s
  double min_switch_interval_s = 10;   ///< no two switches closer than this, s
  std::string latency_metric = "e2e";  ///< which P99 the feedback watches: ttft, tpot or e2e
  double latency_target_ms = 1000;     ///< ours: the latency target of that P99, ms
  double latency_feedback = 0.8;       ///< force one step up when P99 > latency_feedback x target
  int min_tp = 1;                      ///< clamp of the target TP
  int max_tp = 0;                      ///< 0: the largest TP in the gear table
  double flops_per_token = 0;          ///< prefill FLOPs per token; 0: 2 x model.n_params of the gear table
  double device_tflop_s = 100;         ///< ours: per-device dense TFLOP/s (ftp-probe's gemm_tflop_s)
  double default_prompt_tokens = 512;  ///< ours: prefill length when the observation has none
  double reserve_ahead_s = 5;          ///< reserve devices when the forecast this far ahead needs more TP, s
};

/// The naive comparison policy: no forecast, dwell, band or confirmation.
struct NaiveConfig {
  double threshold = 1.0;              ///< fit: rate <= threshold x safe capacity
};

/// ftp.policy/v1: every parameter of the control policies.
struct PolicyConfig {
  /// The gear shifter's forecast: alpha per 10 s (alpha_period_s), the
  /// observation period it was chosen for, whatever the observer's period.
  PredictorConfig predictor{.alpha_period_s = 10};
  CapacityConfig capacity;
  GearShifterConfig gear_shifter;
  RollbackConfig rollback;
  TpPlannerConfig tp_planner;
  NaiveConfig naive;
};

json::Json to_json(const PolicyConfig& c);
/// Parses and validates ftp.policy/v1. Missing sections and fields take the
/// defaults; unknown fields are errors (a typo must not silently keep a
/// default). Errors name the path: "gear_shifter.up_threshold: must be in
/// (down_threshold, 1], got 0.2".
PolicyConfig policy_config_from_json(const json::Json& j);
/// The checks of policy_config_from_json on a config built in code.
void validate(const PolicyConfig& c);

/// Watches latency after a shift and says when to roll it back: when E2E
/// P99 stays above p99_factor x baseline for window_s without a break. An
/// observation whose queue is shorter than the queue at the shift's end
/// breaks a breach: a backlog from before the shift is draining, and the
/// requests finishing then are the ones that waited longest, so P99 rises
/// although the new gear carries the load.
class RollbackMonitor {
 public:
  enum class Verdict { idle, watching, rollback, committed };

  explicit RollbackMonitor(RollbackConfig config = {}) : config_(config) {}
  /// Starts watching a shift that completed at t_ms; baseline is the
  /// pre-shift E2E P99 (ms), queue_depth the queue then. A baseline of 0
  /// (unknown) commits at once.
  void start(std::int64_t t_ms, double baseline_p99_ms, double queue_depth = 0);
  /// Feeds an observation; watching until it says rollback or committed.
  Verdict observe(const doc::Observation& o);
  bool active() const noexcept { return state_ == Verdict::watching; }
  /// Stops watching (a shift that was not load-driven, e.g. into the memory guard, ended the watch).
  void stop() noexcept {
    state_ = Verdict::idle;
    breach_since_.reset();
  }
  double baseline_ms() const noexcept { return baseline_; }
  /// How long the current breach has lasted, ms (0: none).
  std::int64_t breach_ms(std::int64_t now_ms) const noexcept { return breach_since_ ? now_ms - *breach_since_ : 0; }

 private:
  RollbackConfig config_;
  Verdict state_ = Verdict::idle;
  std::int64_t start_ms_ = 0;
  double baseline_ = 0;
  double start_queue_ = 0;
  std::optional<std::int64_t> breach_since_;
};

/// A control policy: one decision (hold or shift) per observation. Time is
/// the observation's t_ms, stamped by an injected Clock.
class Policy {
 public:
  virtual ~Policy() = default;
  /// Throws ftp::InputError when the observation names a gear the table lacks.
  virtual doc::Decision observe(const doc::Observation& o) = 0;
  /// The name in decision records: "gear-shifter", "tp-planner", "naive".
  virtual std::string_view name() const noexcept = 0;
};

/// Gear shifter for fragmented clusters (ARCHITECTURE.md §4). Per
/// observation, in this order:
///
/// 1. A shift in progress (observation.shifting, or a decided shift not yet
///    seen done): hold; signals are reported but muted, confirmations reset.
///    They are evaluated afresh after it.
/// 2. After a load-driven shift, the rollback monitor: a shift back to the
///    previous gear, at once, when it says rollback.
/// 3. Memory guard: KV watermark > memory_guard_kv shifts to the table's
///    memory-guard gear at once (no dwell, confirmation or stagger).
///    It is left, by load, when KV < memory_guard_exit_kv.
/// 4. Load: the forecast, in work (work_rps at the observed token mix),
///    against up/down_threshold x the current gear's safe capacity gives a
///    direction; the other signals (queue depth, queue time, the queue's
///    token backlog in seconds of the gear's prefill, KV pressure, bubble
///    ratio, contention) vote; at least min_agreeing_signals
///    (forecast included) over `confirmations` consecutive observations
///    confirmation_period_s apart, and min_dwell_s since the last shift.
///    Before the load: GPU contention (observation.gpus[].other_compute >
///    contention_index on a device of the current gear) shifts, after the
///    same confirmations and dwell, to the gear that uses no contended or
///    lost device and holds the forecast: away from the device, not up.
///    The target is the smallest normal gear with the forecast, in its own
///    work, <= up_threshold x its safe capacity (the largest when none). With replicas > 1 the shift
///    starts at a random offset within stagger_max_s (not_before_ms).
class GearShifter final : public Policy {
 public:
  GearShifter(const doc::GearTable& table, const PolicyConfig& config);
  doc::Decision observe(const doc::Observation& o) override;
  std::string_view name() const noexcept override { return "gear-shifter"; }

  const CapacityTracker& capacity() const noexcept { return capacity_; }
  const Predictor& predictor() const noexcept { return predictor_; }

 private:
  struct Pending {
    std::string to, from;
    std::int64_t deadline_ms;
    bool load_driven;       ///< watched by the rollback monitor once done
    double baseline_p99;
  };
  doc::Decision shift(const doc::Observation& o, std::string to, std::string reason, std::vector<doc::Signal> signals,
                      bool stagger, bool load_driven);
  double baseline_p99() const;
  /// The smallest gear of `ranked` (by_safe_capacity) that holds `forecast`.
  int target_for(double forecast, const std::vector<int>& ranked) const;

  const doc::GearTable& table_;
  PolicyConfig config_;
  CapacityTracker capacity_;
  Predictor predictor_;
  RollbackMonitor rollback_;
  std::mt19937_64 rng_;
  std::vector<int> ladder_;        ///< indices of the normal gears, in table order (ranked by safe capacity when used)
  int guard_ = -1;                 ///< index of the memory-guard gear
  std::optional<Pending> pending_;
  std::string last_gear_, rollback_to_;
  /// Gears rolled back from: a load-driven shift to one waits until
  /// not_before_ms (twice the dwell, doubling per rollback in a row).
  struct Backoff {
    int rollbacks = 0;
    std::int64_t not_before_ms = 0;
  };
  std::map<std::string, Backoff> backoff_;
  /// Gears left by the latency drive: no load-driven shift down to them before this time, ms.
  std::map<std::string, std::int64_t> latency_hold_;
  /// The gear the last urgent up-shift left (empty: none to return to), and
  /// since when the burst-return condition holds, ms.
  std::string urgent_from_;
  std::optional<std::int64_t> calm_since_ms_;
  std::optional<std::int64_t> last_shift_ms_;
  std::optional<std::pair<std::int64_t, double>> last_backlog_;  ///< (t_ms, queued prompt tokens) last observed
  int confirm_dir_ = 0, confirm_count_ = 0;
  std::int64_t confirm_t_ms_ = 0;
  int contention_count_ = 0;           ///< observations in a row with a contended current GPU (o.gpus)
  std::int64_t contention_t_ms_ = 0;
  std::deque<std::pair<std::int64_t, double>> p99_history_;
  /// (t_ms, forecast) of the down_peak_window_s, forecasts decreasing (the window's peak in front).
  std::deque<std::pair<std::int64_t, double>> peak_history_;
  std::optional<std::int64_t> first_t_ms_;
  std::map<std::string, double> derate_;  ///< gear -> factor on its safe capacity, from backlog-driven up-shifts
  /// The safe capacity of `gear` the shifter goes by: the tracker's x its derate factor.
  double safe_of(const std::string& gear) const;
  double mix_prompt_ = 0, mix_output_ = 0;  ///< tokens per request, as last observed
  /// The forecast as gear `gear` sees it: work_rps at the mix, or rps
  /// (work_load false, or before both lengths of the mix are observed).
  double load_on(const std::string& gear, double rps) const;
};

/// Load-following TP planner (ARCHITECTURE.md §4). Every loop_ms:
///
///   target_tp = ceil(rate_level x prompt_tokens x flops_per_token / (target_utilization x device_tflop_s x 1e12))
///
/// clamped to [min_tp, max_tp], mapped to the smallest normal gear with tp >=
/// target (in table order). Up without hesitation; down only after device
/// utilisation < scale_down_utilization for scale_down_after_s; one step up
/// when P99 > latency_feedback x latency_target_ms; never two switches
/// within min_switch_interval_s (counted from the last shift decision). When the forecast reserve_ahead_s ahead
/// needs a larger gear than now, a hold says so once ("reserve"), with a
/// signal reserve_tp, so that devices are reserved before the shift.
class TpPlanner final : public Policy {
 public:
  TpPlanner(const doc::GearTable& table, const PolicyConfig& config);
  doc::Decision observe(const doc::Observation& o) override;
  std::string_view name() const noexcept override { return "tp-planner"; }

  /// The TP the planner wants for a rate and prompt length.
  int target_tp(double rate, double prompt_tokens) const;

 private:
  int gear_for_tp(int tp) const;

  const doc::GearTable& table_;
  TpPlannerConfig config_;
  Predictor predictor_;
  double flops_per_token_;
  int max_tp_;
  std::vector<int> ladder_;
  std::optional<std::int64_t> last_eval_ms_, last_switch_ms_, low_util_since_;
  int reserved_tp_ = 0;
  /// The gear of the last shift decided, until an observation shows it (or
  /// kPendingMs pass): the decision is not repeated while it is carried out.
  std::optional<std::string> pending_to_;
  std::int64_t pending_deadline_ms_ = 0;
  static constexpr std::int64_t kPendingMs = 120000;
};

/// For comparison only: shifts to the smallest normal gear whose safe
/// capacity x threshold holds the observed (not forecast) request rate,
/// whenever that differs from the current gear and no shift is in progress.
class NaiveThreshold final : public Policy {
 public:
  NaiveThreshold(const doc::GearTable& table, const PolicyConfig& config);
  doc::Decision observe(const doc::Observation& o) override;
  std::string_view name() const noexcept override { return "naive"; }

 private:
  const doc::GearTable& table_;
  NaiveConfig config_;
  CapacityTracker capacity_;
  std::vector<int> ladder_;
};

/// The policy names make_policy knows.
const std::vector<std::string>& policy_names();
/// Builds a policy by name; the table must outlive it.
std::unique_ptr<Policy> make_policy(std::string_view name, const doc::GearTable& table, const PolicyConfig& config);

}  // namespace ftp::control
