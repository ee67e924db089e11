// SPDX-License-Identifier: Apache-2.0
#include "control/queueing_model.hpp"

#include <algorithm>
#include <cmath>

#include "control/policy.hpp"
#include "core/error.hpp"

namespace ftp::control {

double erlang_c(int c, double a) {
  if (a <= 0) return 0;
  if (a >= c) return 1;
  double b = 1;  // Erlang B by recursion: B(k) = a B(k-1) / (k + a B(k-1))
  for (int k = 1; k <= c; ++k) b = a * b / (k + a * b);
  return c * b / (c - a * (1 - b));
}

QueueingModelSim::QueueingModelSim(const doc::GearTable& table, const std::string& start_gear, VirtualClock& clock,
                                   QueueingModelConfig config)
    : config_(config), clock_(clock), gear_(start_gear) {
  for (const auto& g : table.gears) {
    const auto& cap = g.measured ? g.measured : g.estimated;
    if (!cap || cap->max_rps <= 0) throw InputError("gear \"" + g.name + "\" has no capacity to simulate");
    max_rps_[g.name] = cap->max_rps;
  }
  max_rps(start_gear);
}

double QueueingModelSim::max_rps(const std::string& gear) const {
  auto it = max_rps_.find(gear);
  if (it == max_rps_.end()) throw InputError("gear: \"" + gear + "\" is not in the gear table");
  return it->second;
}

double QueueingModelSim::capacity_now() const {
  if (shift_to_.empty()) return max_rps(gear_);
  return config_.shift_capacity_factor * std::min(max_rps(gear_), max_rps(shift_to_));
}

bool QueueingModelSim::start_shift(const std::string& to) {
  max_rps(to);
  if (!shift_to_.empty() || to == gear_) return false;
  shift_to_ = to;
  shift_end_ms_ = clock_.now_ms() + static_cast<std::int64_t>(config_.shift_duration_s * 1000);
  ++shifts_;
  return true;
}

void QueueingModelSim::step(double lambda) {
  lambda = std::max(0.0, lambda);
  const double dt = static_cast<double>(config_.step_ms) / 1000.0;
  const double S = config_.service_time_s;
  const double mu = capacity_now();
  const int c = std::max(1, static_cast<int>(std::lround(mu * S)));
  const double service_rate = c / S;  // requests/s the servers complete at full occupation

  backlog_ = std::max(0.0, backlog_ + (lambda - service_rate) * dt);
  const double w_b = backlog_ / service_rate;
  const double slack = config_.sla_ms / 1000.0 - S;
  double attained;
  double C = 1, decay = 0;
  if (lambda < service_rate) {
    C = erlang_c(c, lambda * S);
    decay = service_rate - lambda;  // P(W > x) = C exp(-decay x)
    attained = w_b >= slack ? 0 : 1 - C * std::exp(-decay * (slack - w_b));
    lq_ = C * lambda * S / (c - lambda * S);
    wait_mean_s_ = w_b + C / decay;
    p50_s_ = w_b + (C > 0.5 ? std::log(C / 0.5) / decay : 0);
    p99_s_ = w_b + (C > 0.01 ? std::log(C / 0.01) / decay : 0);
  } else {
    attained = w_b < slack ? 1 : 0;
    lq_ = 0;
    wait_mean_s_ = p50_s_ = p99_s_ = w_b;
  }
  arrivals_ += lambda * dt;
  attained_ += std::clamp(attained, 0.0, 1.0) * lambda * dt;
  util_ = std::min(1.0, lambda / service_rate);

  clock_.advance(config_.step_ms);
  const std::int64_t now = clock_.now_ms();
  rates_.emplace_back(now, lambda);
  queues_.emplace_back(now, backlog_ + lq_);
  auto trim = [now](auto& q, double window_s) {
    while (!q.empty() && q.front().first <= now - static_cast<std::int64_t>(window_s * 1000)) q.pop_front();
  };
  trim(rates_, config_.observation_window_s);
  trim(queues_, config_.queue_mean_window_s);
  rate_ = lambda;
  if (!shift_to_.empty() && now >= shift_end_ms_) {
    gear_ = shift_to_;
    shift_to_.clear();
  }
}

doc::Observation QueueingModelSim::observe() const {
  doc::Observation o;
  o.t_ms = clock_.now_ms();
  o.gear = gear_;
  o.shifting = !shift_to_.empty();
  auto mean = [](const auto& q) {
    double s = 0;
    for (const auto& [t, v] : q) s += v;
    return q.empty() ? 0.0 : s / static_cast<double>(q.size());
  };
  o.request_rate = mean(rates_);
  o.queue_depth = backlog_ + lq_;
  o.queue_depth_mean = mean(queues_);
  o.est_queue_time_ms = wait_mean_s_ * 1000;
  o.kv_watermark = std::min(1.0, config_.kv_at_full_load * util_);
  const double S_ms = config_.service_time_s * 1000;
  o.e2e_ms = {S_ms + p50_s_ * 1000, S_ms + p99_s_ * 1000};
  o.devices.push_back(doc::DeviceLoad{"sim0", util_});
  (void)rate_;
  return o;
}

int run_policy_loop(Policy& policy, QueueingModelSim& sim, VirtualClock& clock, const PolicyLoop& loop) {
  std::int64_t next_obs = clock.now_ms() + loop.observation_period_ms;
  std::string pending_to;
  std::int64_t pending_at = 0;
  int decisions = 0;
  for (std::size_t i = 0; i < loop.steps; ++i) {
    const double lambda = loop.load(i, clock.now_ms());
    if (loop.before_step) loop.before_step(i);
    sim.step(lambda);
    if (!pending_to.empty() && clock.now_ms() >= pending_at && !sim.shifting()) {
      sim.start_shift(pending_to);
      pending_to.clear();
    }
    const bool observing = clock.now_ms() >= next_obs;
    if (observing) next_obs += loop.observation_period_ms;
    doc::Observation o = sim.observe();
    if (loop.after_step) loop.after_step(i, o, observing);
    if (!observing) continue;
    doc::Decision d = policy.observe(o);
    if (d.action == "shift" && pending_to.empty() && !sim.shifting()) {
      ++decisions;
      pending_to = d.to;
      pending_at = std::max(d.not_before_ms, clock.now_ms());
    }
  }
  return decisions;
}

SimulationReport simulate(Policy& policy, QueueingModelSim& sim, VirtualClock& clock,
                          const std::function<double(std::int64_t)>& load, std::int64_t duration_ms,
                          std::int64_t observation_period_ms) {
  const std::int64_t start = clock.now_ms();
  const int shifts0 = sim.shifts();
  const std::int64_t step_ms = sim.step_ms();
  PolicyLoop loop;
  loop.steps = static_cast<std::size_t>(std::max<std::int64_t>(0, (duration_ms + step_ms - 1) / step_ms));
  loop.observation_period_ms = observation_period_ms;
  loop.load = [&](std::size_t, std::int64_t t_ms) { return load(t_ms); };
  run_policy_loop(policy, sim, clock, loop);
  SimulationReport r;
  r.duration_s = static_cast<double>(clock.now_ms() - start) / 1000.0;
  r.shifts = sim.shifts() - shifts0;
  r.sla_attainment = sim.sla_attainment();
  return r;
}

}  // namespace ftp::control
