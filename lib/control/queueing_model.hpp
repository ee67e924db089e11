// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "control/clock.hpp"
#include "doc/control.hpp"
#include "doc/gear_table.hpp"

namespace ftp::control {

class Policy;

/// Parameters of QueueingModelSim.
struct QueueingModelConfig {
  double service_time_s = 1.0;         ///< time one request spends in service (prefill + decode), s
  double sla_ms = 3000;                ///< E2E latency target a request attains, ms
  double shift_duration_s = 45;        ///< reserve + warm + ramp + drain of one shift, s
  double shift_capacity_factor = 0.5;  ///< capacity during a shift: this x the smaller of the two gears
  std::int64_t step_ms = 1000;         ///< integration step, ms
  double observation_window_s = 10;    ///< request_rate in an observation: mean arrivals over this span, s
  double queue_mean_window_s = 30;     ///< queue_depth_mean: sliding mean over this span, s
  double kv_at_full_load = 0.8;        ///< KV watermark when the gear runs at its max
};

/// A SIMULATED service, not an engine: a model of queueing that stands in
/// for the simulated engine (ARCHITECTURE.md §2) until it exists, so that
/// policies can be compared over hours of virtual time.
///
/// Each gear is an M/M/c queue with c = round(max_rps x service_time_s)
/// servers of rate 1/service_time_s, plus a fluid backlog for overload.
/// Per step of dt, with arrivals lambda and capacity mu (= max_rps, or
/// shift_capacity_factor x the smaller gear's max_rps while a shift runs):
///
///   backlog Q <- max(0, Q + (lambda - mu) dt)           fluid part, requests
///   w_b = Q / mu                                        wait behind the backlog, s
///   C   = Erlang C(c, lambda x service_time_s)          when lambda < mu, else 1
///   P(wait > x) = C exp(-(c / service_time_s - lambda) x)    stationary part
///   attained = 1 - C exp(-(c / service_time_s - lambda)(slack - w_b)), slack = sla - service_time
///              (0 when w_b >= slack; the fluid part alone when lambda >= mu)
///
/// SLA attainment is the arrival-weighted mean of `attained`. Observations
/// carry request_rate (mean over observation_window_s), queue_depth (Q +
/// Erlang-C mean queue), its 30 s mean, est_queue_time_ms (mean wait), E2E
/// P50/P99 (service time + backlog wait + stationary wait quantiles),
/// device utilization = min(1, lambda / mu) and kv_watermark =
/// kv_at_full_load x utilization. Time is the VirtualClock it is given.
class QueueingModelSim {
 public:
  /// The gears' capacities are their measured capacity, else the estimate.
  QueueingModelSim(const doc::GearTable& table, const std::string& start_gear, VirtualClock& clock,
                   QueueingModelConfig config = {});

  /// Starts a shift to `to` now (a no-op while one runs or when to is the current gear).
  bool start_shift(const std::string& to);
  /// Advances the clock by one step with arrivals at `arrival_rps`.
  void step(double arrival_rps);
  /// The observation an observer would record now.
  doc::Observation observe() const;

  const std::string& gear() const noexcept { return gear_; }
  bool shifting() const noexcept { return !shift_to_.empty(); }
  /// The gear a running shift goes to; empty when none runs.
  const std::string& shift_target() const noexcept { return shift_to_; }
  int shifts() const noexcept { return shifts_; }
  /// Share of arrivals so far that met the SLA, 0..1.
  double sla_attainment() const noexcept { return arrivals_ > 0 ? attained_ / arrivals_ : 1.0; }
  double arrivals() const noexcept { return arrivals_; }
  std::int64_t step_ms() const noexcept { return config_.step_ms; }

 private:
  double max_rps(const std::string& gear) const;
  double capacity_now() const;

  QueueingModelConfig config_;
  VirtualClock& clock_;
  std::map<std::string, double> max_rps_;
  std::string gear_, shift_to_;
  std::int64_t shift_end_ms_ = 0;
  int shifts_ = 0;
  double backlog_ = 0, arrivals_ = 0, attained_ = 0;
  double rate_ = 0, lq_ = 0, wait_mean_s_ = 0, p50_s_ = 0, p99_s_ = 0, util_ = 0;
  std::deque<std::pair<std::int64_t, double>> rates_, queues_;
};

/// Erlang C: probability that an arrival waits in an M/M/c queue with
/// offered load a = lambda / mu_server (a < c), computed stably.
double erlang_c(int c, double a);

/// Result of simulate().
struct SimulationReport {
  double duration_s = 0;
  int shifts = 0;
  double sla_attainment = 1;   ///< 0..1
  double shifts_per_10min() const { return duration_s > 0 ? shifts * 600.0 / duration_s : 0; }
  double shifts_per_day() const { return duration_s > 0 ? shifts * 86400.0 / duration_s : 0; }
};

/// The loop of simulate() and replay(): `steps` steps of the model, each
/// driven by load(step, t_ms) (arrivals, req/s, at the step's start t_ms).
/// After each step a shift decided earlier starts once its not_before_ms has
/// come and no shift runs; then after_step(step, observation, observing) sees
/// the model's observation, and when observing (every
/// observation_period_ms) the policy sees that observation as after_step left
/// it, and a shift decision is taken when none is pending or running.
struct PolicyLoop {
  std::size_t steps = 0;
  std::int64_t observation_period_ms = 10000;
  std::function<double(std::size_t step, std::int64_t t_ms)> load;
  std::function<void(std::size_t step)> before_step;  ///< optional
  std::function<void(std::size_t step, doc::Observation& o, bool observing)> after_step;  ///< optional
};
/// Runs the loop; returns the number of shift decisions taken.
int run_policy_loop(Policy& policy, QueueingModelSim& sim, VirtualClock& clock, const PolicyLoop& loop);

/// Runs a policy against QueueingModelSim in virtual time: every step the
/// load function gives arrivals (req/s) at time t_ms; every
/// observation_period_ms the policy sees an observation, and a shift
/// decision starts a shift at its not_before_ms.
SimulationReport simulate(Policy& policy, QueueingModelSim& sim, VirtualClock& clock,
                          const std::function<double(std::int64_t t_ms)>& load, std::int64_t duration_ms,
                          std::int64_t observation_period_ms = 10000);

}  // namespace ftp::control
