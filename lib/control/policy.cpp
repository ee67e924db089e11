// SPDX-License-Identifier: Apache-2.0
#include "control/policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::control {

using json::Json;
using json::Node;

// ---------------------------------------------------------------- config

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// Reads the members of one section, remembering which keys it knows, so
/// that an unknown (misspelt) key is an error.
class Section {
 public:
  Section(const Node& parent, std::string_view key) : parent_(parent), key_(key) {
    node_ = parent.find(key);
    if (node_) node_->expect_object();
  }
  void number(std::string_view key, double& out) {
    known_.insert(std::string(key));
    if (node_ && node_->has(key)) out = node_->number(key);
  }
  void integer(std::string_view key, int& out) {
    known_.insert(std::string(key));
    if (node_ && node_->has(key)) {
      auto v = node_->integer(key);
      if (v < -1000000 || v > 1000000) node_->at(key).fail("out of range, got " + std::to_string(v));
      out = static_cast<int>(v);
    }
  }
  void seed(std::string_view key, std::uint64_t& out) {
    known_.insert(std::string(key));
    if (node_ && node_->has(key)) out = static_cast<std::uint64_t>(node_->positive_integer(key, true));
  }
  void numbers(std::string_view key, std::vector<double>& out) {
    known_.insert(std::string(key));
    if (!node_ || !node_->has(key)) return;
    const Node a = node_->at(key);
    a.expect_array();
    out.clear();
    for (const auto& n : a.items()) out.push_back(n.number());
  }
  void one_of(std::string_view key, std::string& out, const std::vector<std::string>& choices) {
    known_.insert(std::string(key));
    if (node_ && node_->has(key)) out = node_->one_of(key, choices);
  }
  void finish() const {
    if (!node_) return;
    for (const auto& [k, v] : node_->value().items())
      if (!known_.count(k)) Node(v, node_->child_path(k)).fail("unknown field (misspelt?)");
  }

 private:
  const Node& parent_;
  std::string key_;
  std::optional<Node> node_;
  std::set<std::string> known_;
};

void check(bool ok, const std::string& path, const std::string& why, double got) {
  if (!ok) throw InputError(path + ": " + why + ", got " + num(got));
}
/// Durations (keys ending in "_s") become int64 milliseconds: past about
/// 9e15 s the conversion is undefined (in practice INT64_MIN, "at once"),
/// so none may exceed a billion seconds (31 years: "never" enough).
constexpr double kMaxSeconds = 1e9;
/// The longest hold-off after rollbacks from a gear: a day.
constexpr double kMaxBackoffS = 86400;
void bounded(const std::string& path, double v) {
  if (path.size() > 2 && path.compare(path.size() - 2, 2, "_s") == 0)
    check(v <= kMaxSeconds, path, "must be at most 1e9 s", v);
}
void positive(const std::string& path, double v) {
  check(std::isfinite(v) && v > 0, path, "must be positive", v);
  bounded(path, v);
}
void nonneg(const std::string& path, double v) {
  check(std::isfinite(v) && v >= 0, path, "must not be negative", v);
  bounded(path, v);
}
void ratio(const std::string& path, double v) { check(v > 0 && v <= 1, path, "must be a ratio in (0, 1]", v); }

const std::vector<std::string> kLatencyMetrics = {"ttft", "tpot", "e2e"};

}  // namespace

Json to_json(const PolicyConfig& c) {
  const auto& p = c.predictor;
  const auto& k = c.capacity;
  const auto& g = c.gear_shifter;
  const auto& r = c.rollback;
  const auto& t = c.tp_planner;
  return Json{
      {"kind", doc::kind::policy},
      {"predictor",
       {{"alpha", p.alpha},
        {"horizon_s", p.horizon_s},
        {"peak_window_s", p.peak_window_s},
        {"alpha_period_s", p.alpha_period_s}}},
      {"capacity",
       {{"safe_fraction", k.safe_fraction},
        {"refresh_every_s", k.refresh_every_s},
        {"window_s", k.window_s},
        {"saturation_queue", k.saturation_queue}}},
      {"gear_shifter",
       {{"min_dwell_s", g.min_dwell_s},
        {"up_dwell_s", g.up_dwell_s},
        {"down_peak_window_s", g.down_peak_window_s},
        {"up_threshold", g.up_threshold},
        {"down_threshold", g.down_threshold},
        {"down_fit", g.down_fit},
        {"confirmations", g.confirmations},
        {"confirmation_period_s", g.confirmation_period_s},
        {"min_agreeing_signals", g.min_agreeing_signals},
        {"queue_depth_up", g.queue_depth_up},
        {"queue_depth_down", g.queue_depth_down},
        {"queue_time_up_ms", g.queue_time_up_ms},
        {"queue_time_down_ms", g.queue_time_down_ms},
        {"bubble_ratio", g.bubble_ratio},
        {"contention_index", g.contention_index},
        {"load", g.work_load ? "work" : "requests"},
        {"backlog_up_s", g.backlog_up_s},
        {"backlog_drive_s", g.backlog_drive_s},
        {"backlog_derate_floor", g.backlog_derate_floor},
        {"ttft_slo_ms", g.ttft_slo_ms},
        {"tpot_slo_ms", g.tpot_slo_ms},
        {"latency_hold_s", g.latency_hold_s},
        {"urgent_backlog_s", g.urgent_backlog_s},
        {"backlog_lead_s", g.backlog_lead_s},
        {"urgent_ramp", g.urgent_ramp},
        {"urgent_ramp_step_s", g.urgent_ramp_step_s},
        {"burst_return_s", g.burst_return_s},
        {"kv_pressure_up", g.kv_pressure_up},
        {"kv_pressure_down", g.kv_pressure_down},
        {"memory_guard_kv", g.memory_guard_kv},
        {"memory_guard_exit_kv", g.memory_guard_exit_kv},
        {"replicas", g.replicas},
        {"stagger_max_s", g.stagger_max_s},
        {"seed", g.seed},
        {"shift_timeout_s", g.shift_timeout_s}}},
      {"rollback",
       {{"p99_factor", r.p99_factor},
        {"window_s", r.window_s},
        {"watch_s", r.watch_s},
        {"baseline_window_s", r.baseline_window_s}}},
      {"tp_planner",
       {{"loop_ms", t.loop_ms},
        {"alpha", t.alpha},
        {"target_utilization", t.target_utilization},
        {"scale_down_utilization", t.scale_down_utilization},
        {"scale_down_after_s", t.scale_down_after_s},
        {"min_switch_interval_s", t.min_switch_interval_s},
        {"latency_metric", t.latency_metric},
        {"latency_target_ms", t.latency_target_ms},
        {"latency_feedback", t.latency_feedback},
        {"min_tp", t.min_tp},
        {"max_tp", t.max_tp},
        {"flops_per_token", t.flops_per_token},
        {"device_tflop_s", t.device_tflop_s},
        {"default_prompt_tokens", t.default_prompt_tokens},
        {"reserve_ahead_s", t.reserve_ahead_s}}},
      {"naive", {{"threshold", c.naive.threshold}}},
  };
}

PolicyConfig policy_config_from_json(const Json& j) {
  Node root(j, "");
  json::expect_kind(root, doc::kind::policy);
  PolicyConfig c;
  {
    Section s(root, "predictor");
    s.number("alpha", c.predictor.alpha);
    s.number("alpha_period_s", c.predictor.alpha_period_s);
    s.number("horizon_s", c.predictor.horizon_s);
    s.number("peak_window_s", c.predictor.peak_window_s);
    s.finish();
  }
  {
    Section s(root, "capacity");
    s.number("safe_fraction", c.capacity.safe_fraction);
    s.number("refresh_every_s", c.capacity.refresh_every_s);
    s.number("window_s", c.capacity.window_s);
    s.number("saturation_queue", c.capacity.saturation_queue);
    s.finish();
  }
  {
    auto& g = c.gear_shifter;
    Section s(root, "gear_shifter");
    s.number("min_dwell_s", g.min_dwell_s);
    s.number("up_dwell_s", g.up_dwell_s);
    s.number("down_peak_window_s", g.down_peak_window_s);
    s.number("up_threshold", g.up_threshold);
    s.number("down_threshold", g.down_threshold);
    s.number("down_fit", g.down_fit);
    s.integer("confirmations", g.confirmations);
    s.number("confirmation_period_s", g.confirmation_period_s);
    s.integer("min_agreeing_signals", g.min_agreeing_signals);
    s.number("queue_depth_up", g.queue_depth_up);
    s.number("queue_depth_down", g.queue_depth_down);
    s.number("queue_time_up_ms", g.queue_time_up_ms);
    s.number("queue_time_down_ms", g.queue_time_down_ms);
    s.number("bubble_ratio", g.bubble_ratio);
    s.number("contention_index", g.contention_index);
    std::string load = g.work_load ? "work" : "requests";
    s.one_of("load", load, {"work", "requests"});
    g.work_load = load == "work";
    s.number("backlog_up_s", g.backlog_up_s);
    s.number("backlog_drive_s", g.backlog_drive_s);
    s.number("backlog_derate_floor", g.backlog_derate_floor);
    s.number("ttft_slo_ms", g.ttft_slo_ms);
    s.number("tpot_slo_ms", g.tpot_slo_ms);
    s.number("latency_hold_s", g.latency_hold_s);
    s.number("urgent_backlog_s", g.urgent_backlog_s);
    s.number("backlog_lead_s", g.backlog_lead_s);
    s.numbers("urgent_ramp", g.urgent_ramp);
    s.number("urgent_ramp_step_s", g.urgent_ramp_step_s);
    s.number("burst_return_s", g.burst_return_s);
    s.number("kv_pressure_up", g.kv_pressure_up);
    s.number("kv_pressure_down", g.kv_pressure_down);
    s.number("memory_guard_kv", g.memory_guard_kv);
    s.number("memory_guard_exit_kv", g.memory_guard_exit_kv);
    s.integer("replicas", g.replicas);
    s.number("stagger_max_s", g.stagger_max_s);
    s.seed("seed", g.seed);
    s.number("shift_timeout_s", g.shift_timeout_s);
    s.finish();
  }
  {
    Section s(root, "rollback");
    s.number("p99_factor", c.rollback.p99_factor);
    s.number("window_s", c.rollback.window_s);
    s.number("watch_s", c.rollback.watch_s);
    s.number("baseline_window_s", c.rollback.baseline_window_s);
    s.finish();
  }
  {
    auto& t = c.tp_planner;
    Section s(root, "tp_planner");
    s.number("loop_ms", t.loop_ms);
    s.number("alpha", t.alpha);
    s.number("target_utilization", t.target_utilization);
    s.number("scale_down_utilization", t.scale_down_utilization);
    s.number("scale_down_after_s", t.scale_down_after_s);
    s.number("min_switch_interval_s", t.min_switch_interval_s);
    s.one_of("latency_metric", t.latency_metric, kLatencyMetrics);
    s.number("latency_target_ms", t.latency_target_ms);
    s.number("latency_feedback", t.latency_feedback);
    s.integer("min_tp", t.min_tp);
    s.integer("max_tp", t.max_tp);
    s.number("flops_per_token", t.flops_per_token);
    s.number("device_tflop_s", t.device_tflop_s);
    s.number("default_prompt_tokens", t.default_prompt_tokens);
    s.number("reserve_ahead_s", t.reserve_ahead_s);
    s.finish();
  }
  {
    Section s(root, "naive");
    s.number("threshold", c.naive.threshold);
    s.finish();
  }
  static const std::set<std::string> kSections = {"kind",     "predictor",  "capacity", "gear_shifter",
                                                  "rollback", "tp_planner", "naive"};
  for (const auto& [k, v] : j.items())
    if (!kSections.count(k)) Node(v, k).fail("unknown section (expected predictor, capacity, gear_shifter, rollback, tp_planner or naive)");
  validate(c);
  return c;
}

void validate(const PolicyConfig& c) {
  ratio("predictor.alpha", c.predictor.alpha);
  nonneg("predictor.alpha_period_s", c.predictor.alpha_period_s);
  nonneg("predictor.horizon_s", c.predictor.horizon_s);
  nonneg("predictor.peak_window_s", c.predictor.peak_window_s);

  ratio("capacity.safe_fraction", c.capacity.safe_fraction);
  positive("capacity.refresh_every_s", c.capacity.refresh_every_s);
  positive("capacity.window_s", c.capacity.window_s);
  positive("capacity.saturation_queue", c.capacity.saturation_queue);

  const auto& g = c.gear_shifter;
  nonneg("gear_shifter.min_dwell_s", g.min_dwell_s);
  nonneg("gear_shifter.up_dwell_s", g.up_dwell_s);
  nonneg("gear_shifter.down_peak_window_s", g.down_peak_window_s);
  ratio("gear_shifter.down_threshold", g.down_threshold);
  check(g.up_threshold > g.down_threshold && g.up_threshold <= 1, "gear_shifter.up_threshold",
        "must be in (down_threshold, 1] = (" + num(g.down_threshold) + ", 1]", g.up_threshold);
  check(g.down_fit >= 0 && g.down_fit < g.up_threshold, "gear_shifter.down_fit",
        "must be in [0, up_threshold) = [0, " + num(g.up_threshold) + ")", g.down_fit);
  check(g.confirmations >= 1, "gear_shifter.confirmations", "must be at least 1", g.confirmations);
  nonneg("gear_shifter.confirmation_period_s", g.confirmation_period_s);
  check(g.min_agreeing_signals >= 1 && g.min_agreeing_signals <= 7, "gear_shifter.min_agreeing_signals",
        "must be in [1, 7] (there are 7 load signals)", g.min_agreeing_signals);
  nonneg("gear_shifter.queue_depth_down", g.queue_depth_down);
  check(g.queue_depth_up > g.queue_depth_down, "gear_shifter.queue_depth_up",
        "must exceed queue_depth_down (" + num(g.queue_depth_down) + ")", g.queue_depth_up);
  nonneg("gear_shifter.queue_time_down_ms", g.queue_time_down_ms);
  check(g.queue_time_up_ms > g.queue_time_down_ms, "gear_shifter.queue_time_up_ms",
        "must exceed queue_time_down_ms (" + num(g.queue_time_down_ms) + ")", g.queue_time_up_ms);
  positive("gear_shifter.backlog_up_s", g.backlog_up_s);
  nonneg("gear_shifter.backlog_drive_s", g.backlog_drive_s);
  nonneg("gear_shifter.ttft_slo_ms", g.ttft_slo_ms);
  nonneg("gear_shifter.tpot_slo_ms", g.tpot_slo_ms);
  nonneg("gear_shifter.latency_hold_s", g.latency_hold_s);
  nonneg("gear_shifter.urgent_backlog_s", g.urgent_backlog_s);
  nonneg("gear_shifter.backlog_lead_s", g.backlog_lead_s);
  for (std::size_t i = 0; i < g.urgent_ramp.size(); ++i)
    check(g.urgent_ramp[i] > 0 && g.urgent_ramp[i] <= 1 && (i == 0 || g.urgent_ramp[i] > g.urgent_ramp[i - 1]),
          "gear_shifter.urgent_ramp[" + std::to_string(i) + "]", "shares must increase within (0, 1]", g.urgent_ramp[i]);
  if (!g.urgent_ramp.empty())
    check(g.urgent_ramp.back() == 1.0, "gear_shifter.urgent_ramp", "must end at 1 (100 %)", g.urgent_ramp.back());
  nonneg("gear_shifter.urgent_ramp_step_s", g.urgent_ramp_step_s);
  nonneg("gear_shifter.burst_return_s", g.burst_return_s);
  check(g.backlog_derate_floor > 0 && g.backlog_derate_floor <= 1, "gear_shifter.backlog_derate_floor",
        "must be in (0, 1]", g.backlog_derate_floor);
  ratio("gear_shifter.kv_pressure_down", g.kv_pressure_down);
  check(g.kv_pressure_up > g.kv_pressure_down && g.kv_pressure_up <= 1, "gear_shifter.kv_pressure_up",
        "must be in (kv_pressure_down, 1] = (" + num(g.kv_pressure_down) + ", 1]", g.kv_pressure_up);
  ratio("gear_shifter.bubble_ratio", g.bubble_ratio);
  ratio("gear_shifter.contention_index", g.contention_index);
  ratio("gear_shifter.memory_guard_kv", g.memory_guard_kv);
  check(g.memory_guard_exit_kv > 0 && g.memory_guard_exit_kv < g.memory_guard_kv, "gear_shifter.memory_guard_exit_kv",
        "must be in (0, memory_guard_kv) = (0, " + num(g.memory_guard_kv) + ")", g.memory_guard_exit_kv);
  check(g.replicas >= 1, "gear_shifter.replicas", "must be at least 1", g.replicas);
  nonneg("gear_shifter.stagger_max_s", g.stagger_max_s);
  positive("gear_shifter.shift_timeout_s", g.shift_timeout_s);

  check(c.rollback.p99_factor > 1, "rollback.p99_factor", "must exceed 1", c.rollback.p99_factor);
  positive("rollback.window_s", c.rollback.window_s);
  check(c.rollback.watch_s >= c.rollback.window_s, "rollback.watch_s",
        "must be at least window_s (" + num(c.rollback.window_s) + ")", c.rollback.watch_s);
  positive("rollback.watch_s", c.rollback.watch_s);
  positive("rollback.baseline_window_s", c.rollback.baseline_window_s);

  const auto& t = c.tp_planner;
  positive("tp_planner.loop_ms", t.loop_ms);
  check(t.loop_ms <= kMaxSeconds * 1000, "tp_planner.loop_ms", "must be at most 1e12 ms", t.loop_ms);
  ratio("tp_planner.alpha", t.alpha);
  ratio("tp_planner.target_utilization", t.target_utilization);
  check(t.scale_down_utilization > 0 && t.scale_down_utilization < t.target_utilization,
        "tp_planner.scale_down_utilization",
        "must be in (0, target_utilization) = (0, " + num(t.target_utilization) + ")", t.scale_down_utilization);
  nonneg("tp_planner.scale_down_after_s", t.scale_down_after_s);
  nonneg("tp_planner.min_switch_interval_s", t.min_switch_interval_s);
  if (std::find(kLatencyMetrics.begin(), kLatencyMetrics.end(), t.latency_metric) == kLatencyMetrics.end())
    throw InputError("tp_planner.latency_metric: must be one of ttft, tpot, e2e, got \"" + t.latency_metric + "\"");
  positive("tp_planner.latency_target_ms", t.latency_target_ms);
  ratio("tp_planner.latency_feedback", t.latency_feedback);
  check(t.min_tp >= 1, "tp_planner.min_tp", "must be at least 1", t.min_tp);
  check(t.max_tp == 0 || t.max_tp >= t.min_tp, "tp_planner.max_tp", "must be 0 (the table's largest) or >= min_tp (" + std::to_string(t.min_tp) + ")", t.max_tp);
  nonneg("tp_planner.flops_per_token", t.flops_per_token);
  positive("tp_planner.device_tflop_s", t.device_tflop_s);
  positive("tp_planner.default_prompt_tokens", t.default_prompt_tokens);
  nonneg("tp_planner.reserve_ahead_s", t.reserve_ahead_s);

  positive("naive.threshold", c.naive.threshold);
}

// ---------------------------------------------------------------- rollback

void RollbackMonitor::start(std::int64_t t_ms, double baseline_p99_ms, double queue_depth) {
  start_ms_ = t_ms;
  baseline_ = baseline_p99_ms;
  start_queue_ = queue_depth;
  breach_since_.reset();
  state_ = baseline_p99_ms > 0 ? Verdict::watching : Verdict::committed;
}

RollbackMonitor::Verdict RollbackMonitor::observe(const doc::Observation& o) {
  if (state_ != Verdict::watching) return state_;
  const bool draining = o.queue_depth_mean < start_queue_;
  if (o.e2e_ms.p99 > config_.p99_factor * baseline_ && !draining) {
    if (!breach_since_) breach_since_ = o.t_ms;
    if (o.t_ms - *breach_since_ >= static_cast<std::int64_t>(config_.window_s * 1000)) state_ = Verdict::rollback;
  } else {
    breach_since_.reset();
    if (o.t_ms - start_ms_ >= static_cast<std::int64_t>(config_.watch_s * 1000)) state_ = Verdict::committed;
  }
  return state_;
}

// ---------------------------------------------------------------- helpers

namespace {

std::vector<int> normal_gears(const doc::GearTable& t) {
  std::vector<int> v;
  for (std::size_t i = 0; i < t.gears.size(); ++i)
    if (t.gears[i].role == "normal") v.push_back(static_cast<int>(i));
  if (v.empty()) throw InputError("gears: the gear table has no gear with role \"normal\"");
  return v;
}

/// The ladder from the smallest safe capacity to the largest, as the
/// tracker has them now (measured capacities need not follow the table's
/// order, and they change as they are refreshed); ties keep table order.
/// The first device of `g` that the observation says is lost, or empty.
std::string lost_device_of(const doc::Gear& g, const doc::Observation& o) {
  for (const auto& rep : g.replicas)
    for (const auto& st : rep.stages)
      for (const auto& dev : st.devices)
        for (const auto& l : o.lost_devices)
          if (l.id == dev) return dev;
  return {};
}

/// The gears of `ladder` without a lost device.
std::vector<int> without_lost(const std::vector<int>& ladder, const doc::GearTable& t, const doc::Observation& o) {
  std::vector<int> out;
  for (int i : ladder)
    if (lost_device_of(t.gears[static_cast<std::size_t>(i)], o).empty()) out.push_back(i);
  return out;
}

/// The first device of `g` whose GPU signals (o.gpus) say other processes
/// take more than `limit` of its SMs, with that share; empty when none.
std::pair<std::string, double> contended_device_of(const doc::Gear& g, const doc::Observation& o, double limit) {
  for (const auto& rep : g.replicas)
    for (const auto& st : rep.stages)
      for (const auto& dev : st.devices)
        for (const auto& gpu : o.gpus)
          if (gpu.id == dev && gpu.other_compute > limit) return {dev, gpu.other_compute};
  return {};
}

std::vector<int> by_safe_capacity(std::vector<int> ladder, const doc::GearTable& t, const CapacityTracker& cap) {
  std::stable_sort(ladder.begin(), ladder.end(), [&](int a, int b) {
    return cap.capacity(t.gears[static_cast<std::size_t>(a)].name).safe_rps <
           cap.capacity(t.gears[static_cast<std::size_t>(b)].name).safe_rps;
  });
  return ladder;
}

int gear_index(const doc::GearTable& t, const doc::Observation& o) {
  int i = t.index_of(o.gear);
  if (i < 0) {
    std::string names;
    for (const auto& g : t.gears) names += (names.empty() ? "" : ", ") + g.name;
    throw InputError("gear: \"" + o.gear + "\" is not in the gear table (" + names + ")");
  }
  return i;
}

doc::Decision hold(const doc::Observation& o, std::string_view policy, std::string reason,
                   std::vector<doc::Signal> signals = {}) {
  doc::Decision d;
  d.t_ms = o.t_ms;
  d.action = "hold";
  d.from = o.gear;
  d.policy = std::string(policy);
  d.reason = std::move(reason);
  d.signals = std::move(signals);
  return d;
}

std::string secs(std::int64_t ms) { return num(static_cast<double>(ms) / 1000.0) + " s"; }

}  // namespace

// ---------------------------------------------------------------- gear shifter

GearShifter::GearShifter(const doc::GearTable& table, const PolicyConfig& config)
    : table_(table),
      config_(config),
      capacity_(table, config.capacity),
      predictor_(config.predictor),
      rollback_(config.rollback),
      rng_(config.gear_shifter.seed),
      ladder_(normal_gears(table)) {
  validate(config_);
  for (std::size_t i = 0; i < table.gears.size(); ++i)
    if (table.gears[i].role == "memory-guard") guard_ = static_cast<int>(i);
}

int GearShifter::target_for(double forecast, const std::vector<int>& ranked) const {
  const auto& gs = config_.gear_shifter;
  for (int i : ranked)
    if (load_on(table_.gears[i].name, forecast) <= gs.up_threshold * safe_of(table_.gears[i].name))
      return i;
  return ranked.back();
}

double GearShifter::safe_of(const std::string& gear) const {
  const auto d = derate_.find(gear);
  return capacity_.capacity(gear).safe_rps * (d == derate_.end() ? 1.0 : d->second);
}

double GearShifter::load_on(const std::string& gear, double rps) const {
  // Until both lengths are seen (no request finished yet), requests: a mix
  // of prompt tokens alone would count a fraction of the work.
  if (!config_.gear_shifter.work_load || !(mix_prompt_ > 0 && mix_output_ > 0)) return rps;
  return work_rps(capacity_.capacity(gear), rps, mix_prompt_, mix_output_);
}

double GearShifter::baseline_p99() const {
  if (p99_history_.empty()) return 0;
  double sum = 0;
  for (const auto& [t, v] : p99_history_) sum += v;
  return sum / static_cast<double>(p99_history_.size());
}

doc::Decision GearShifter::shift(const doc::Observation& o, std::string to, std::string reason,
                                 std::vector<doc::Signal> signals, bool stagger, bool load_driven) {
  doc::Decision d = hold(o, name(), std::move(reason), std::move(signals));
  d.action = "shift";
  d.to = to;
  const auto& gs = config_.gear_shifter;
  std::int64_t start = o.t_ms;
  if (stagger && gs.replicas > 1 && gs.stagger_max_s > 0) {
    std::uniform_int_distribution<std::int64_t> offset(0, static_cast<std::int64_t>(gs.stagger_max_s * 1000));
    start += offset(rng_);
    d.not_before_ms = start;
    d.reason += "; staggered by " + secs(start - o.t_ms) + " (" + std::to_string(gs.replicas) + " replicas)";
  }
  pending_ = Pending{to, o.gear, start + static_cast<std::int64_t>(gs.shift_timeout_s * 1000), load_driven,
                     baseline_p99()};
  confirm_dir_ = confirm_count_ = 0;
  return d;
}

doc::Decision GearShifter::observe(const doc::Observation& o) {
  const auto& gs = config_.gear_shifter;
  const int cur = gear_index(table_, o);
  capacity_.observe(o);
  capacity_.refresh(o.t_ms);
  predictor_.observe(o.t_ms, o.request_rate);

  // A gear change we see is a shift done, whoever made it; dwell counts from it.
  if (!last_gear_.empty() && o.gear != last_gear_ && !o.shifting) last_shift_ms_ = o.t_ms;
  if (!o.shifting) last_gear_ = o.gear;

  // The token mix per request: prompt tokens of the arrivals, output tokens of the finished.
  if (o.request_rate > 0 && o.prompt_token_rate > 0) mix_prompt_ = o.prompt_token_rate / o.request_rate;
  else if (o.mean_prompt_tokens > 0) mix_prompt_ = o.mean_prompt_tokens;
  if (o.mean_output_tokens > 0) mix_output_ = o.mean_output_tokens;

  const doc::Capacity& cap = capacity_.capacity(o.gear);
  const double safe = safe_of(o.gear);
  const double forecast = predictor_.forecast();
  const double load = load_on(o.gear, forecast);  // in work on this gear
  const bool in_guard = table_.gears[cur].role == "memory-guard";

  // The forecasts of the down-peak window, its peak in front.
  if (!first_t_ms_) first_t_ms_ = o.t_ms;
  const auto peak_window_ms = static_cast<std::int64_t>(gs.down_peak_window_s * 1000);
  while (!peak_history_.empty() && peak_history_.back().second <= forecast) peak_history_.pop_back();
  peak_history_.emplace_back(o.t_ms, forecast);
  while (peak_history_.front().first < o.t_ms - peak_window_ms) peak_history_.pop_front();

  // The queue's token backlog in seconds of this gear's prefill (0: not measured).
  const double backlog_s = cap.prefill_tokens_s > 0 ? o.queued_prompt_tokens / cap.prefill_tokens_s : 0;
  // The backlog backlog_lead_s ahead at its growth since the last
  // observation (only growth counts): what the drive and the urgent path
  // weigh, so that a shift starts before the queue is past the SLO.
  double backlog_ahead_s = backlog_s;
  if (gs.backlog_lead_s > 0 && last_backlog_ && o.t_ms > last_backlog_->first && cap.prefill_tokens_s > 0) {
    const double growth = (o.queued_prompt_tokens - last_backlog_->second) /
                          (static_cast<double>(o.t_ms - last_backlog_->first) / 1000.0);
    backlog_ahead_s += std::max(0.0, growth) * gs.backlog_lead_s / cap.prefill_tokens_s;
  }
  last_backlog_ = std::make_pair(o.t_ms, o.queued_prompt_tokens);
  // Load direction from the forecast, or up from a token backlog the gear
  // does not clear; the other signals vote.
  int dir = 0;
  bool backlog_driven = false;
  // Slow per request, not short of capacity: TTFT over the SLO with no
  // queue, or TPOT over the SLO (no queue wait is in it: the gear's steps
  // are too slow).
  const bool ttft_slow = gs.ttft_slo_ms > 0 && o.ttft_ms.p99 > gs.ttft_slo_ms &&
                         o.queue_depth_mean <= gs.queue_depth_down && o.queue_depth <= gs.queue_depth_down;
  const bool tpot_slow = gs.tpot_slo_ms > 0 && o.tpot_ms.p99 > gs.tpot_slo_ms;
  const bool too_slow = ttft_slow || tpot_slow;
  bool latency_driven = false;
  // The lower edge of the band, in this gear's work: down_threshold x its
  // safe capacity, or, higher, the load at which the next smaller gear
  // would run at down_fit x its own safe capacity (the band then follows
  // the ladder's spacing: hysteresis against that gear's up_threshold).
  // The gears without a lost device, by safe capacity: the ladder every
  // rule below walks (the capacities were refreshed above).
  const std::vector<int> ranked = by_safe_capacity(without_lost(ladder_, table_, o), table_, capacity_);
  double down_line = gs.down_threshold * safe;
  if (gs.down_fit > 0) {
    const auto at = std::find(ranked.begin(), ranked.end(), cur);
    if (at != ranked.end() && at != ranked.begin()) {
      const std::string& smaller = table_.gears[static_cast<std::size_t>(*(at - 1))].name;
      const double per_rps_here = load_on(o.gear, 1.0), per_rps_there = load_on(smaller, 1.0);
      if (per_rps_there > 0)
        down_line = std::max(down_line, gs.down_fit * safe_of(smaller) * per_rps_here / per_rps_there);
    }
  }
  if (!in_guard) {
    if (load > gs.up_threshold * safe) dir = +1;
    else if (gs.backlog_drive_s > 0 && backlog_ahead_s > gs.backlog_drive_s) dir = +1, backlog_driven = true;
    else if (too_slow) dir = +1, latency_driven = true;
    else if (load < down_line) dir = -1;
  }
  // The urgent path: the queue's tail already misses the TTFT SLO.
  const bool urgent = dir > 0 && gs.urgent_backlog_s > 0 && backlog_ahead_s > gs.urgent_backlog_s;
  const std::string fc = num(forecast) + " req/s" + (load != forecast ? " (" + num(load) + " req/s in work)" : "");
  // A signal with a band: it agrees going up above `up`, going down below `down`.
  auto band = [dir](const char* name, double value, double up, double down) {
    return doc::Signal{name, value, dir < 0 ? down : up, dir > 0 ? value > up : dir < 0 && value < down};
  };
  std::vector<doc::Signal> sig;
  sig.push_back(band("forecast_load", load, gs.up_threshold * safe, down_line));
  sig.push_back(band("queue_depth", o.queue_depth_mean, gs.queue_depth_up, gs.queue_depth_down));
  sig.push_back(band("queue_time_ms", o.est_queue_time_ms, gs.queue_time_up_ms, gs.queue_time_down_ms));
  sig.push_back({"token_backlog_s", backlog_s, gs.backlog_up_s, dir > 0 && backlog_s > gs.backlog_up_s});
  sig.push_back(band("kv_pressure", o.kv_watermark, gs.kv_pressure_up, gs.kv_pressure_down));
  if (gs.ttft_slo_ms > 0) sig.push_back({"ttft_slo_ms", o.ttft_ms.p99, gs.ttft_slo_ms, dir > 0 && ttft_slow});
  if (gs.tpot_slo_ms > 0) sig.push_back({"tpot_slo_ms", o.tpot_ms.p99, gs.tpot_slo_ms, dir > 0 && tpot_slow});
  sig.push_back({"bubble_ratio", o.bubble_ratio, gs.bubble_ratio, dir != 0 && o.bubble_ratio > gs.bubble_ratio});
  sig.push_back({"contention_index", o.contention_index, gs.contention_index,
                 dir > 0 && o.contention_index > gs.contention_index});
  sig.push_back({"kv_watermark", o.kv_watermark, in_guard ? gs.memory_guard_exit_kv : gs.memory_guard_kv,
                 !in_guard && o.kv_watermark > gs.memory_guard_kv});

  // 1. A shift in progress: signals muted, evaluated afresh after it. A
  // decided shift to a gear that has lost a device since cannot happen.
  if (pending_ && !o.shifting && table_.index_of(pending_->to) >= 0 &&
      !lost_device_of(table_.gears[static_cast<std::size_t>(table_.index_of(pending_->to))], o).empty())
    pending_.reset();
  if (pending_) {
    if (o.gear == pending_->to && !o.shifting) {
      last_shift_ms_ = o.t_ms;
      if (pending_->load_driven) {
        rollback_.start(o.t_ms, pending_->baseline_p99, o.queue_depth_mean);
        rollback_to_ = pending_->from;
      } else {
        rollback_.stop();  // a guard or rollback shift ends the watch of the shift before it
      }
      pending_.reset();
    } else if (o.t_ms <= pending_->deadline_ms) {
      confirm_dir_ = confirm_count_ = 0;
      return hold(o, name(),
                  std::string(o.shifting ? "shift in progress" : "waiting for the shift") + " to " + pending_->to +
                      "; signals muted until it is done",
                  sig);
    } else {
      pending_.reset();  // never seen done: forget it and decide afresh
    }
  }
  if (o.shifting) {
    confirm_dir_ = confirm_count_ = 0;
    p99_history_.clear();
    return hold(o, name(), "shift in progress; signals muted until it is done", sig);
  }

  p99_history_.emplace_back(o.t_ms, o.e2e_ms.p99);
  while (!p99_history_.empty() &&
         p99_history_.front().first < o.t_ms - static_cast<std::int64_t>(config_.rollback.baseline_window_s * 1000))
    p99_history_.pop_front();

  // 1b. Lost devices: the current gear uses one, so its domains cannot
  // serve. At once (no dwell, confirmation or stagger) to the gear without
  // lost devices that holds the forecast (the largest of them when none).
  if (const std::string lost = lost_device_of(table_.gears[static_cast<std::size_t>(cur)], o); !lost.empty()) {
    rollback_.stop();
    const std::vector<int>& usable = ranked;
    if (usable.empty())
      return hold(o, name(), o.gear + " uses lost device " + lost + ", and every other gear uses a lost device too", sig);
    const int target = target_for(forecast, usable);
    return shift(o, table_.gears[static_cast<std::size_t>(target)].name,
                 "lost device: " + o.gear + " uses " + lost + "; " + table_.gears[static_cast<std::size_t>(target)].name +
                     " uses none that is lost",
                 sig, false, false);
  }

  // 1c. GPU contention (issue 17, FlexPipe's seed): other processes take
  // a share of a current device's SMs above contention_index. That votes
  // to move away from the device, not up: to the gear without contended
  // (or lost) devices that holds the forecast, once it is confirmed over
  // `confirmations` observations and the dwell has passed. With no such
  // gear the load rules below decide as before.
  if (const auto [dev, share] = contended_device_of(table_.gears[static_cast<std::size_t>(cur)], o, gs.contention_index);
      !dev.empty()) {
    std::vector<int> free_of;
    for (int i : without_lost(ladder_, table_, o))
      if (contended_device_of(table_.gears[static_cast<std::size_t>(i)], o, gs.contention_index).first.empty())
        free_of.push_back(i);
    sig.push_back({"gpu_contention", share, gs.contention_index, !free_of.empty()});
    if (!free_of.empty()) {
      const auto period_ms = static_cast<std::int64_t>(gs.confirmation_period_s * 1000);
      if (contention_count_ == 0 || o.t_ms - contention_t_ms_ >= period_ms) {
        contention_count_ = std::min(contention_count_ + 1, gs.confirmations);
        contention_t_ms_ = o.t_ms;
      }
      const std::string what = "contention: other processes take " + num(share) + " of " + dev + "'s SMs (> " +
                               num(gs.contention_index) + ")";
      if (contention_count_ < gs.confirmations)
        return hold(o, name(), what + "; confirmation " + std::to_string(contention_count_) + " of " +
                                   std::to_string(gs.confirmations), sig);
      const auto dwell_ms = static_cast<std::int64_t>(gs.min_dwell_s * 1000);
      if (last_shift_ms_ && o.t_ms - *last_shift_ms_ < dwell_ms)
        return hold(o, name(), what + " confirmed, but dwell: " + secs(o.t_ms - *last_shift_ms_) + " of " +
                                   secs(dwell_ms) + " since the last shift", sig);
      contention_count_ = 0;
      const int target = target_for(forecast, by_safe_capacity(free_of, table_, capacity_));
      return shift(o, table_.gears[static_cast<std::size_t>(target)].name,
                   what + "; " + table_.gears[static_cast<std::size_t>(target)].name + " uses no contended device", sig,
                   false, false);
    }
  } else {
    contention_count_ = 0;
  }

  // 2. Memory guard (before rollback: a rollback out of a gear whose KV is
  // over the guard's threshold would only be followed by the guard).
  if (!in_guard && o.kv_watermark > gs.memory_guard_kv) {
    rollback_.stop();
    if (guard_ >= 0 && !lost_device_of(table_.gears[static_cast<std::size_t>(guard_)], o).empty())
      return hold(o, name(), "KV watermark " + num(o.kv_watermark) + " > " + num(gs.memory_guard_kv) +
                                 " but the memory-guard gear uses a lost device", sig);
    if (guard_ >= 0)
      return shift(o, table_.gears[guard_].name,
                   "memory guard: KV watermark " + num(o.kv_watermark) + " > " + num(gs.memory_guard_kv), sig, false,
                   false);
    return hold(o, name(), "KV watermark " + num(o.kv_watermark) + " > " + num(gs.memory_guard_kv) +
                               " but the gear table has no memory-guard gear", sig);
  }

  // 3. Rollback after a load-driven shift.
  if (rollback_.active()) {
    auto v = rollback_.observe(o);
    sig.push_back({"p99_regression_ms", o.e2e_ms.p99, config_.rollback.p99_factor * rollback_.baseline_ms(),
                   o.e2e_ms.p99 > config_.rollback.p99_factor * rollback_.baseline_ms()});
    if (v == RollbackMonitor::Verdict::committed) backoff_.erase(o.gear);  // it held: a later shift to it is new
    if (v == RollbackMonitor::Verdict::rollback && table_.index_of(rollback_to_) >= 0 && rollback_to_ != o.gear &&
        lost_device_of(table_.gears[static_cast<std::size_t>(table_.index_of(rollback_to_))], o).empty()) {
      // The same load would lead back to this gear after the dwell: hold
      // off a load-driven shift to it for twice the longer of the dwell and
      // the rollback window, doubling with each rollback from it in a row.
      Backoff& b = backoff_[o.gear];
      b.rollbacks = std::min(b.rollbacks + 1, 20);
      const double base_s = std::max(gs.min_dwell_s, config_.rollback.window_s);
      const double wait_s = std::min(kMaxBackoffS, base_s * std::ldexp(1.0, b.rollbacks));
      b.not_before_ms = o.t_ms + static_cast<std::int64_t>(wait_s * 1000);
      return shift(o, rollback_to_,
                   "rollback: E2E P99 " + num(o.e2e_ms.p99) + " ms > " + num(config_.rollback.p99_factor) +
                       " x pre-shift baseline " + num(rollback_.baseline_ms()) + " ms for " +
                       num(config_.rollback.window_s) + " s",
                   sig, false, false);
    }
  }

  // 3b. Burst return: after an urgent up-shift, back to the gear it left
  // once the queue has been empty for burst_return_s and the rate now fits it.
  if (!urgent_from_.empty() && (gs.burst_return_s <= 0 || o.gear == urgent_from_ || in_guard))
    urgent_from_.clear(), calm_since_ms_.reset();
  if (!urgent_from_.empty() && table_.index_of(urgent_from_) >= 0) {
    const doc::Gear& back = table_.gears[static_cast<std::size_t>(table_.index_of(urgent_from_))];
    const double now_load = load_on(back.name, o.request_rate);
    const bool calm = o.queue_depth_mean <= gs.queue_depth_down && o.queue_depth <= gs.queue_depth_down &&
                      o.queued_prompt_tokens <= 0 && now_load <= gs.up_threshold * safe_of(back.name) && !too_slow;
    if (!calm) calm_since_ms_.reset();
    else if (!calm_since_ms_) calm_since_ms_ = o.t_ms;
    const auto b = backoff_.find(back.name);
    if (calm && o.t_ms - *calm_since_ms_ >= static_cast<std::int64_t>(gs.burst_return_s * 1000) &&
        lost_device_of(back, o).empty() && (b == backoff_.end() || o.t_ms >= b->second.not_before_ms)) {
      const std::string reason = "burst return: queue empty for " + secs(o.t_ms - *calm_since_ms_) +
                                 " after the urgent shift from " + back.name + ", rate now " + num(o.request_rate) +
                                 " req/s (" + num(now_load) + " in its work) within " + num(gs.up_threshold) +
                                 " x its safe capacity " + num(safe_of(back.name));
      urgent_from_.clear();
      calm_since_ms_.reset();
      rollback_ = RollbackMonitor(config_.rollback);
      return shift(o, back.name, reason, sig, true, true);
    }
  }

  // 4. Load.
  int agree = 0;
  if (in_guard) {
    if (o.kv_watermark < gs.memory_guard_exit_kv) dir = -2;  // leave the guard, by load
    agree = dir ? gs.min_agreeing_signals : 0;
  } else {
    for (const auto& s : sig)
      if (s.agrees && s.name != "kv_watermark" && s.name != "p99_regression_ms") ++agree;  // load signals only
    if (latency_driven || urgent) agree = std::max(agree, gs.min_agreeing_signals);
  }
  // Gears with a lost device are no target.
  if (ranked.empty()) return hold(o, name(), "every normal gear uses a lost device", sig);
  // Up and down by safe capacity, not by place in the table.
  auto rank = [&](int i) { return static_cast<int>(std::find(ranked.begin(), ranked.end(), i) - ranked.begin()); };
  if (dir < 0 && !in_guard && cur == ranked.front()) {
    confirm_dir_ = confirm_count_ = 0;
    return hold(o, name(), "forecast " + fc + " below the band of " + o.gear +
                               ", already the smallest gear", sig);
  }
  if (dir == 0) {
    confirm_dir_ = confirm_count_ = 0;
    if (in_guard)
      return hold(o, name(), "memory guard: KV watermark " + num(o.kv_watermark) + " not below " +
                                 num(gs.memory_guard_exit_kv), sig);
    return hold(o, name(), "forecast " + fc + " inside the band [" + num(down_line) +
                               ", " + num(gs.up_threshold * safe) + "] of " + o.gear + "'s safe capacity " + num(safe),
                sig);
  }
  const char* what = dir > 0 ? "up" : dir < 0 && !in_guard ? "down" : "leave the memory guard";
  if (agree < gs.min_agreeing_signals) {
    confirm_dir_ = confirm_count_ = 0;
    return hold(o, name(), std::string(what) + ": only " + std::to_string(agree) + " of " +
                               std::to_string(gs.min_agreeing_signals) + " signals agree", sig);
  }
  const auto period_ms = static_cast<std::int64_t>(gs.confirmation_period_s * 1000);
  if (confirm_dir_ != dir || confirm_count_ == 0) {
    confirm_dir_ = dir;
    confirm_count_ = 1;
    confirm_t_ms_ = o.t_ms;
  } else if (o.t_ms - confirm_t_ms_ >= period_ms && confirm_count_ < gs.confirmations) {
    ++confirm_count_;
    confirm_t_ms_ = o.t_ms;
  }
  if (urgent) confirm_count_ = gs.confirmations;  // the urgent path: at once
  if (confirm_count_ < gs.confirmations)
    return hold(o, name(), std::string(what) + ": confirmation " + std::to_string(confirm_count_) + " of " +
                               std::to_string(gs.confirmations), sig);
  const auto dwell_ms = static_cast<std::int64_t>((dir > 0 ? gs.up_dwell_s : gs.min_dwell_s) * 1000);
  if (!urgent && last_shift_ms_ && o.t_ms - *last_shift_ms_ < dwell_ms)
    return hold(o, name(), std::string(what) + " confirmed, but dwell: " + secs(o.t_ms - *last_shift_ms_) + " of " +
                               secs(dwell_ms) + " since the last shift", sig);
  // Down: the smaller gear must also carry the rate seen now (after a step
  // drop the forecast's level undershoots it for a while) and the peak of
  // the down-peak window, which must have been seen whole.
  if (dir == -1 && o.t_ms - *first_t_ms_ < peak_window_ms)
    return hold(o, name(), "down confirmed, but only " + secs(o.t_ms - *first_t_ms_) + " of the " +
                               secs(peak_window_ms) + " down-peak window seen", sig);
  const double peak = peak_history_.front().second;
  // Up: the forecast plus the queued prompts drained over the horizon.
  const double backlog_rps = mix_prompt_ > 0 && config_.predictor.horizon_s > 0
                                 ? o.queued_prompt_tokens / mix_prompt_ / config_.predictor.horizon_s
                                 : 0;
  const double demand = dir < 0 ? std::max({forecast, o.request_rate, peak}) : forecast + backlog_rps;
  int target = target_for(demand, ranked);
  // A backlog the gear does not clear says it carries less than its capacity: one step up at least.
  if ((backlog_driven || latency_driven) && rank(target) <= rank(cur) && rank(cur) + 1 < static_cast<int>(ranked.size()))
    target = ranked[static_cast<std::size_t>(rank(cur) + 1)];
  if ((dir > 0 && rank(target) <= rank(cur)) || (dir == -1 && rank(target) >= rank(cur))) {
    // Resolve by position on the ladder: one step further than the fit says is never taken.
    return hold(o, name(), std::string(what) + ": no " + (dir > 0 ? "larger" : "smaller") + " gear fits " +
                               (dir > 0 ? "forecast " : "the window's peak, forecast and rate now: ") + num(demand) +
                               " req/s", sig);
  }
  if (auto h = latency_hold_.find(table_.gears[target].name);
      dir == -1 && h != latency_hold_.end() && o.t_ms < h->second)
    return hold(o, name(), std::string(what) + ": " + table_.gears[target].name +
                               " was left for TTFT or TPOT over the SLO; held off for " + secs(h->second - o.t_ms) + " more",
                sig);
  if (auto b = backoff_.find(table_.gears[target].name); b != backoff_.end() && o.t_ms < b->second.not_before_ms)
    return hold(o, name(), std::string(what) + ": " + table_.gears[target].name + " was rolled back from " +
                               std::to_string(b->second.rollbacks) + " time(s) in a row; held off for " +
                               secs(b->second.not_before_ms - o.t_ms) + " more",
                sig);

  if (backlog_driven && gs.backlog_derate_floor < 1) {
    // This gear and the smaller ones carry less than their capacity says:
    // at most the load they could not keep up with, as safe capacity.
    const auto d = derate_.find(o.gear);
    const double f = std::clamp((d == derate_.end() ? 1.0 : d->second) * load / safe,
                                gs.backlog_derate_floor, 1.0);
    for (int i : ranked) {
      double& di = derate_.try_emplace(table_.gears[static_cast<std::size_t>(i)].name, 1.0).first->second;
      di = std::min(di, f);
      if (i == cur) break;
    }
  }
  if (latency_driven)
    latency_hold_[o.gear] = o.t_ms + static_cast<std::int64_t>(gs.latency_hold_s * 1000);
  // An urgent up-shift remembers the gear it left (the burst return's); any other shift forgets it.
  if (dir > 0 && urgent && gs.burst_return_s > 0) {
    if (urgent_from_.empty()) urgent_from_ = o.gear;
  } else {
    urgent_from_.clear();
  }
  calm_since_ms_.reset();
  // The backlog as weighed: now, or backlog_lead_s ahead at its growth.
  const std::string weighed =
      num(backlog_s) + " s" +
      (backlog_ahead_s != backlog_s ? " (" + num(backlog_ahead_s) + " s in " + num(gs.backlog_lead_s) + " s at its growth)"
                                    : "");
  std::string reason =
      std::string(what) + ": " + (urgent ? "urgent, token backlog " + weighed + " > " +
                                               num(gs.urgent_backlog_s) + " s of " + o.gear + "'s prefill; " : "") +
      (latency_driven ? (ttft_slow ? "TTFT P99 " + num(o.ttft_ms.p99) + " ms > SLO " + num(gs.ttft_slo_ms) + " ms"
                                   : "TPOT P99 " + num(o.tpot_ms.p99) + " ms > SLO " + num(gs.tpot_slo_ms) + " ms") +
                            " of " + o.gear + " with queue " + num(o.queue_depth_mean) + ", forecast " + fc
       : backlog_driven ? "token backlog " + weighed + " > " + num(gs.backlog_drive_s) + " s of " + o.gear +
                            "'s prefill, forecast " + fc
                      : "forecast " + fc + " " +
                            (dir > 0 ? "> " + num(gs.up_threshold) + " x safe " + num(safe)
                             : dir == -1 ? "< " + num(down_line) + " (the band's lower edge)"
                                         : "vs safe " + num(safe)) +
                            " of " + o.gear) +
      ", " + std::to_string(agree) + " signals agree over " + std::to_string(gs.confirmations) + " observations";
  rollback_ = RollbackMonitor(config_.rollback);
  doc::Decision d = shift(o, table_.gears[target].name, reason, sig, true, true);
  if (urgent && dir > 0 && !gs.urgent_ramp.empty()) {
    // The old gear is past the SLO already: its own, shorter ramp.
    d.ramp = gs.urgent_ramp;
    d.ramp_step_ms = static_cast<std::int64_t>(gs.urgent_ramp_step_s * 1000);
  }
  return d;
}

// ---------------------------------------------------------------- TP planner

TpPlanner::TpPlanner(const doc::GearTable& table, const PolicyConfig& config)
    : table_(table),
      config_(config.tp_planner),
      predictor_(PredictorConfig{.alpha = config.tp_planner.alpha,
                                  .horizon_s = config.tp_planner.reserve_ahead_s,
                                  .peak_window_s = 0,
                                  .alpha_period_s = 0}),  // per sample, as the design's planner
      ladder_(normal_gears(table)) {
  validate(config);
  flops_per_token_ = config_.flops_per_token > 0 ? config_.flops_per_token : 2.0 * static_cast<double>(table.model.n_params);
  if (flops_per_token_ <= 0)
    throw InputError("tp_planner.flops_per_token: needed, since the gear table's model has no n_params");
  max_tp_ = config_.max_tp;
  if (max_tp_ == 0)
    for (int i : ladder_) max_tp_ = std::max(max_tp_, table.gears[i].tp);
}

int TpPlanner::target_tp(double rate, double prompt_tokens) const {
  double demand = rate * prompt_tokens * flops_per_token_;  // FLOP/s of prefill
  double per_device = config_.target_utilization * config_.device_tflop_s * 1e12;
  int tp = static_cast<int>(std::ceil(demand / per_device - 1e-9));
  return std::clamp(tp, config_.min_tp, std::max(config_.min_tp, max_tp_));
}

int TpPlanner::gear_for_tp(int tp) const {
  int best = -1;
  for (int i : ladder_)
    if (table_.gears[i].tp >= tp && (best < 0 || table_.gears[i].tp < table_.gears[best].tp)) best = i;
  if (best >= 0) return best;
  for (int i : ladder_)
    if (best < 0 || table_.gears[i].tp > table_.gears[best].tp) best = i;
  return best;
}

doc::Decision TpPlanner::observe(const doc::Observation& o) {
  const int cur = gear_index(table_, o);
  const int cur_tp = table_.gears[cur].tp;
  predictor_.observe(o.t_ms, o.request_rate);
  if (last_eval_ms_ && o.t_ms - *last_eval_ms_ < static_cast<std::int64_t>(config_.loop_ms))
    return hold(o, name(), "inside the " + num(config_.loop_ms) + " ms loop period");
  last_eval_ms_ = o.t_ms;

  const double prompt = o.mean_prompt_tokens > 0 ? o.mean_prompt_tokens : config_.default_prompt_tokens;
  const int want = target_tp(predictor_.level(), prompt);
  const int ahead = target_tp(predictor_.forecast(), prompt);
  double util = 0;
  if (!o.devices.empty()) {
    for (const auto& d : o.devices) util += d.utilization;
    util /= static_cast<double>(o.devices.size());
  } else {
    util = predictor_.level() * prompt * flops_per_token_ / (cur_tp * config_.device_tflop_s * 1e12);
  }
  const double p99 = config_.latency_metric == "ttft"   ? o.ttft_ms.p99
                     : config_.latency_metric == "tpot" ? o.tpot_ms.p99
                                                        : o.e2e_ms.p99;
  const double p99_limit = config_.latency_feedback * config_.latency_target_ms;

  if (util < config_.scale_down_utilization) {
    if (!low_util_since_) low_util_since_ = o.t_ms;
  } else {
    low_util_since_.reset();
  }
  std::vector<doc::Signal> sig{
      {"predicted_rate", predictor_.level(), 0, false},
      {"target_tp", static_cast<double>(want), static_cast<double>(cur_tp), want != cur_tp},
      {"utilization", util, config_.scale_down_utilization, util < config_.scale_down_utilization},
      {"latency_p99_ms", p99, p99_limit, p99 > p99_limit},
      {"forecast_tp", static_cast<double>(ahead), static_cast<double>(cur_tp), ahead > cur_tp},
  };
  if (o.shifting) return hold(o, name(), "shift in progress", sig);
  if (pending_to_) {
    if (o.gear == *pending_to_) {
      pending_to_.reset();
    } else if (o.t_ms <= pending_deadline_ms_) {
      return hold(o, name(), "waiting for the shift to " + *pending_to_ + " decided " +
                                 secs(o.t_ms - (pending_deadline_ms_ - kPendingMs)) + " ago",
                  sig);
    } else {
      pending_to_.reset();  // not carried out: decide afresh
    }
  }

  auto switch_to = [&](int gear, std::string reason) {
    const auto interval = static_cast<std::int64_t>(config_.min_switch_interval_s * 1000);
    if (last_switch_ms_ && o.t_ms - *last_switch_ms_ < interval)
      return hold(o, name(), reason + "; held by the minimum switch interval (" + secs(o.t_ms - *last_switch_ms_) +
                                 " of " + secs(interval) + ")", sig);
    doc::Decision d = hold(o, name(), std::move(reason), sig);
    d.action = "shift";
    d.to = table_.gears[gear].name;
    last_switch_ms_ = o.t_ms;
    pending_to_ = d.to;
    pending_deadline_ms_ = o.t_ms + kPendingMs;
    reserved_tp_ = 0;
    low_util_since_.reset();
    return d;
  };

  // Latency feedback: one step up, whatever the load model says.
  if (p99 > p99_limit) {
    int next = -1;
    for (int i : ladder_)
      if (table_.gears[i].tp > cur_tp && (next < 0 || table_.gears[i].tp < table_.gears[next].tp)) next = i;
    if (next >= 0)
      return switch_to(next, "latency feedback: " + config_.latency_metric + " P99 " + num(p99) + " ms > " +
                                 num(config_.latency_feedback) + " x target " + num(config_.latency_target_ms) +
                                 " ms, one step up");
  }
  int target = gear_for_tp(want);
  const int target_tp_gear = table_.gears[target].tp;
  if (target_tp_gear > cur_tp)
    return switch_to(target, "up: predicted " + num(predictor_.level()) + " req/s x " + num(prompt) +
                                 " prompt tokens needs tp " + std::to_string(want));
  if (target_tp_gear < cur_tp) {
    const auto after = static_cast<std::int64_t>(config_.scale_down_after_s * 1000);
    if (low_util_since_ && o.t_ms - *low_util_since_ >= after)
      return switch_to(target, "down: utilization " + num(util) + " < " + num(config_.scale_down_utilization) +
                                   " for " + secs(o.t_ms - *low_util_since_) + ", tp " + std::to_string(want) +
                                   " suffices");
    return hold(o, name(), "tp " + std::to_string(want) + " would suffice; down only after utilization < " +
                               num(config_.scale_down_utilization) + " for " + secs(after), sig);
  }
  // Reserve ahead of a predicted up-shift, once per target.
  int ahead_gear = gear_for_tp(ahead);
  if (table_.gears[ahead_gear].tp > cur_tp && table_.gears[ahead_gear].tp != reserved_tp_) {
    reserved_tp_ = table_.gears[ahead_gear].tp;
    sig.push_back({"reserve_tp", static_cast<double>(reserved_tp_), static_cast<double>(cur_tp), true});
    return hold(o, name(), "reserve: devices of " + table_.gears[ahead_gear].name + " (tp " +
                               std::to_string(reserved_tp_) + ") ahead of a predicted up-shift in " +
                               num(config_.reserve_ahead_s) + " s", sig);
  }
  if (table_.gears[ahead_gear].tp <= cur_tp) reserved_tp_ = 0;
  return hold(o, name(), "tp " + std::to_string(cur_tp) + " fits predicted " + num(predictor_.level()) + " req/s",
              sig);
}

// ---------------------------------------------------------------- naive

NaiveThreshold::NaiveThreshold(const doc::GearTable& table, const PolicyConfig& config)
    : table_(table), config_(config.naive), capacity_(table, config.capacity), ladder_(normal_gears(table)) {
  validate(config);
}

doc::Decision NaiveThreshold::observe(const doc::Observation& o) {
  gear_index(table_, o);
  std::vector<doc::Signal> sig{{"request_rate", o.request_rate,
                                config_.threshold * capacity_.capacity(o.gear).safe_rps, false}};
  if (o.shifting) return hold(o, name(), "shift in progress", sig);
  const std::vector<int> ranked = by_safe_capacity(ladder_, table_, capacity_);
  int target = ranked.back();
  for (int i : ranked)
    if (o.request_rate <= config_.threshold * capacity_.capacity(table_.gears[i].name).safe_rps) {
      target = i;
      break;
    }
  if (table_.gears[target].name == o.gear)
    return hold(o, name(), "rate " + num(o.request_rate) + " req/s fits " + o.gear, sig);
  sig[0].agrees = true;
  doc::Decision d = hold(o, name(), "rate " + num(o.request_rate) + " req/s: smallest gear that holds it is " +
                                        table_.gears[target].name, sig);
  d.action = "shift";
  d.to = table_.gears[target].name;
  return d;
}

// ---------------------------------------------------------------- factory

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {"gear-shifter", "tp-planner", "naive"};
  return names;
}

std::unique_ptr<Policy> make_policy(std::string_view name, const doc::GearTable& table, const PolicyConfig& config) {
  if (name == "gear-shifter") return std::make_unique<GearShifter>(table, config);
  if (name == "tp-planner") return std::make_unique<TpPlanner>(table, config);
  if (name == "naive") return std::make_unique<NaiveThreshold>(table, config);
  throw InputError("policy: must be one of gear-shifter, tp-planner, naive, got \"" + std::string(name) + "\"");
}

}  // namespace ftp::control
