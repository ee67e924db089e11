// SPDX-License-Identifier: Apache-2.0
#include "control/replay.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::control {
namespace {

// Weighted quantile of (value, weight) pairs; 0 when the weights sum to 0.
double weighted_quantile(std::vector<std::pair<double, double>> v, double q) {
  std::sort(v.begin(), v.end());
  double total = 0;
  for (const auto& [x, w] : v) total += w;
  if (total <= 0) return 0;
  double acc = 0;
  for (const auto& [x, w] : v) {
    acc += w;
    if (acc >= q * total) return x;
  }
  return v.back().first;
}

double round3(double x) { return std::round(x * 1000) / 1000; }

json::Json pct(double p50, double p99) { return {{"p50", round3(p50)}, {"p99", round3(p99)}}; }

double gear_max_rps(const doc::Gear& g) {
  const auto& cap = g.measured ? g.measured : g.estimated;
  return cap ? cap->max_rps : 0;
}

}  // namespace

PolicySpec parse_policy_spec(std::string_view spec) {
  PolicySpec p;
  auto colon = spec.find(':');
  std::string name(spec.substr(0, colon));
  std::string rest = colon == std::string_view::npos ? "" : std::string(spec.substr(colon + 1));
  if (name == "static") {
    p.name = "static";
    auto c2 = rest.find(':');
    p.gear = rest.substr(0, c2);
    if (c2 != std::string::npos) p.config_path = rest.substr(c2 + 1);
    if (p.gear.empty()) throw InputError("--policy: static needs a gear, as in static:economy");
  } else if (name == "dynamic-tp" || name == "tp-planner" || name == "gear-shifter" || name == "naive") {
    p.name = name == "dynamic-tp" ? "tp-planner" : name;
    p.config_path = rest;
  } else {
    throw InputError("--policy: unknown policy \"" + name +
                     "\" (expected static:GEAR, dynamic-tp, gear-shifter or naive, each optionally :CONFIG.json)");
  }
  if (colon != std::string_view::npos && p.name != "static" && p.config_path.empty())
    throw InputError("--policy: empty config path after \"" + name + ":\"");
  return p;
}

doc::Decision StaticGear::observe(const doc::Observation& o) {
  doc::Decision d;
  d.t_ms = o.t_ms;
  d.from = o.gear;
  d.policy = "static";
  if (o.gear != gear_ && !o.shifting) {
    d.action = "shift";
    d.to = gear_;
    d.reason = "static: back to " + gear_;
  } else {
    d.reason = "static: stay on " + gear_;
  }
  return d;
}

std::unique_ptr<Policy> make_replay_policy(const PolicySpec& spec, const doc::GearTable& table,
                                           const PolicyConfig& config) {
  if (spec.name == "static") {
    if (!table.find(spec.gear)) throw InputError("--policy: static:" + spec.gear + ": gear \"" + spec.gear + "\" is not in the gear table");
    return std::make_unique<StaticGear>(spec.gear);
  }
  return make_policy(spec.name, table, config);
}

json::Json replay(const Trace& trace, Policy& policy, const std::string& policy_spec, const doc::GearTable& table,
                  const std::string& start_gear, const ReplayConfig& cfg,
                  const std::function<void(const json::Json&)>& emit) {
  if (!(cfg.rate_scale > 0)) throw InputError("--rate-scale: must be > 0");
  if (!(cfg.interval_s > 0)) throw InputError("--interval: must be > 0");
  if (cfg.start_s < 0 || cfg.duration_s < 0) throw InputError("--start, --duration: must be >= 0");
  if (cfg.prefill_share < 0 || cfg.prefill_share >= 1) throw InputError("--prefill-share: must be in [0, 1)");

  // The slice, in trace time, then compressed into virtual time.
  const std::int64_t from_ms = static_cast<std::int64_t>(cfg.start_s * 1000);
  const double span_s = cfg.duration_s > 0 ? cfg.duration_s : std::max(0.0, trace.span_s() - cfg.start_s + 0.001);
  const std::int64_t to_ms = from_ms + static_cast<std::int64_t>(std::ceil(span_s * 1000));
  QueueingModelConfig mc = cfg.model;
  const double S = mc.service_time_s;
  const std::int64_t step_ms = mc.step_ms;
  const double dt = static_cast<double>(step_ms) / 1000.0;
  const double virt_s = span_s / cfg.rate_scale;
  const auto n_steps = static_cast<std::size_t>(std::max(1.0, std::ceil(virt_s * 1000 / static_cast<double>(step_ms))));
  std::vector<double> counts(n_steps, 0), prompt_sum(n_steps, 0);
  double requests = 0, out_tokens = 0, prompt_tokens = 0;
  for (const auto& r : trace.requests) {
    if (r.t_ms < from_ms || r.t_ms >= to_ms) continue;
    const double v_ms = static_cast<double>(r.t_ms - from_ms) / cfg.rate_scale;
    const auto i = std::min(n_steps - 1, static_cast<std::size_t>(v_ms / static_cast<double>(step_ms)));
    counts[i] += 1;
    prompt_sum[i] += r.prompt_tokens;
    requests += 1;
    out_tokens += r.output_tokens;
    prompt_tokens += r.prompt_tokens;
  }
  if (requests == 0)
    throw InputError(trace.source + ": no requests in the slice [" + std::to_string(cfg.start_s) + " s, +" +
                     std::to_string(span_s) + " s)");
  const double mean_out = std::max(1.0, out_tokens / requests), mean_prompt = prompt_tokens / requests;
  const double decode_ms = (1 - cfg.prefill_share) * S * 1000;
  const double tpot_ms = decode_ms / mean_out;
  const bool tpot_ok = tpot_ms <= cfg.slo_tpot_ms;
  // The model's E2E target so that its "attained" is TTFT <= slo_ttft_ms:
  // wait <= sla - S  <=>  wait + prefill <= slo_ttft.
  mc.sla_ms = cfg.slo_ttft_ms + decode_ms;

  VirtualClock clock(0);
  QueueingModelSim sim(table, start_gear, clock, mc);
  auto devices_of = [&](const std::string& g) { return static_cast<double>(table.find(g)->devices().size()); };

  const auto int_ms = static_cast<std::int64_t>(cfg.interval_s * 1000);
  std::int64_t next_int = int_ms;
  double obs_req = 0, obs_prompt = 0, obs_util = 0, obs_steps = 0;  // since the last observation

  // Interval and run accumulators.
  struct Acc {
    double arrivals = 0, attained = 0, util = 0, steps = 0, ttft50 = 0, ttft99 = 0, e2e50 = 0, e2e99 = 0;
    int shifts = 0;
  } iv;
  double total_arr = 0, total_att = 0, util_sum = 0, gpu_s = 0;
  std::vector<std::pair<double, double>> ttft99s, e2e99s;  // (step P99, arrivals)
  std::map<std::string, double> gear_time;
  double att0 = 0, q0 = 0, cap = 0;  // before the step
  int shifts0 = 0;

  PolicyLoop loop;
  loop.steps = n_steps;
  loop.observation_period_ms = static_cast<std::int64_t>(cfg.observation_period_s * 1000);
  loop.load = [&](std::size_t i, std::int64_t) { return counts[i] / dt; };
  loop.before_step = [&](std::size_t i) {
    obs_req += counts[i];
    obs_prompt += prompt_sum[i];
    gpu_s += (devices_of(sim.gear()) + (sim.shifting() ? devices_of(sim.shift_target()) : 0)) * dt;
    gear_time[sim.gear()] += dt;
    att0 = sim.sla_attainment() * sim.arrivals();
    q0 = sim.observe().queue_depth;
    cap = sim.shifting() ? mc.shift_capacity_factor * std::min(gear_max_rps(*table.find(sim.gear())),
                                                               gear_max_rps(*table.find(sim.shift_target())))
                         : gear_max_rps(*table.find(sim.gear()));
    shifts0 = sim.shifts();
  };
  loop.after_step = [&](std::size_t i, doc::Observation& o, bool observing) {
    const double lambda = counts[i] / dt;
    const double att = tpot_ok ? sim.sla_attainment() * sim.arrivals() - att0 : 0;
    const double arr = counts[i];
    // Busy share: the rate served (arrivals less the growth of the queue) over capacity.
    const double util = cap > 0 ? std::clamp((lambda - (o.queue_depth - q0) / dt) / cap, 0.0, 1.0) : 0;
    iv.arrivals += arr;
    iv.attained += att;
    iv.util += util;
    iv.steps += 1;
    iv.shifts += sim.shifts() - shifts0;
    const double ttft50 = o.e2e_ms.p50 - decode_ms, ttft99 = o.e2e_ms.p99 - decode_ms;
    iv.ttft50 += ttft50 * arr;
    iv.e2e50 += o.e2e_ms.p50 * arr;
    if (arr > 0) {
      iv.ttft99 = std::max(iv.ttft99, ttft99);
      iv.e2e99 = std::max(iv.e2e99, o.e2e_ms.p99);
      ttft99s.emplace_back(ttft99, arr);
      e2e99s.emplace_back(o.e2e_ms.p99, arr);
    }
    total_arr += arr;
    total_att += att;
    util_sum += util;
    obs_util += util;
    obs_steps += 1;

    if (clock.now_ms() >= next_int || i + 1 == n_steps) {
      next_int += int_ms;
      const double span = iv.steps * dt;
      const double a = iv.arrivals > 0 ? iv.arrivals : 1;
      json::Json rec = {
          {"kind", doc::kind::sim_interval},
          {"t_s", round3(static_cast<double>(clock.now_ms()) / 1000)},
          {"load_rps", round3(iv.arrivals / span)},
          {"requests", std::llround(iv.arrivals)},
          {"gear", sim.gear()},
          {"shifting", sim.shifting()},
          {"capacity_rps", round3(gear_max_rps(*table.find(sim.gear())))},
          {"devices", std::llround(devices_of(sim.gear()) + (sim.shifting() ? devices_of(sim.shift_target()) : 0))},
          {"ttft_ms", pct(iv.ttft50 / a, iv.arrivals > 0 ? iv.ttft99 : 0)},
          {"tpot_ms", pct(tpot_ms, tpot_ms)},
          {"e2e_ms", pct(iv.e2e50 / a, iv.arrivals > 0 ? iv.e2e99 : 0)},
          {"utilization", round3(iv.util / iv.steps)},
          {"queue_depth", round3(o.queue_depth)},
          {"sla_attainment", round3(iv.arrivals > 0 ? iv.attained / iv.arrivals : 1)},
          {"shifts", iv.shifts},
      };
      if (sim.shifting()) rec["shift_to"] = sim.shift_target();
      emit(rec);
      iv = Acc{};
    }

    if (observing) {  // what the policy sees besides the model's observation
      o.mean_prompt_tokens = obs_req > 0 ? obs_prompt / obs_req : mean_prompt;
      o.mean_output_tokens = mean_out;
      o.ttft_ms = {ttft50, ttft99};
      o.tpot_ms = {tpot_ms, tpot_ms};
      // Like the live observer: the busy share since the last observation.
      if (!o.devices.empty()) o.devices.front().utilization = obs_util / obs_steps;
      obs_req = obs_prompt = obs_util = obs_steps = 0;
    }
  };
  const int decided_shifts = run_policy_loop(policy, sim, clock, loop);

  const double dur_s = static_cast<double>(clock.now_ms()) / 1000;
  json::Json gt = json::Json::object();
  for (const auto& g : table.gears)
    if (gear_time.count(g.name)) gt[g.name] = round3(gear_time[g.name]);
  return {
      {"kind", doc::kind::sim_summary},
      {"service", "queueing-model"},
      {"policy", policy_spec},
      {"policy_name", std::string(policy.name())},
      {"trace",
       {{"source", trace.source},
        {"format", trace.format},
        {"start_s", cfg.start_s},
        {"span_s", round3(span_s)},
        {"rate_scale", cfg.rate_scale},
        {"mean_prompt_tokens", round3(mean_prompt)},
        {"mean_output_tokens", round3(out_tokens / requests)}}},
      {"model",
       {{"service_time_s", S},
        {"prefill_share", cfg.prefill_share},
        {"shift_duration_s", mc.shift_duration_s},
        {"step_ms", step_ms}}},
      {"slo", {{"ttft_ms", cfg.slo_ttft_ms}, {"tpot_ms", cfg.slo_tpot_ms}}},
      {"start_gear", start_gear},
      {"final_gear", sim.gear()},
      {"duration_s", round3(dur_s)},
      {"interval_s", cfg.interval_s},
      {"requests", std::llround(total_arr)},
      {"sla_attainment", round3(total_arr > 0 ? total_att / total_arr : 1)},
      {"goodput_rps", round3(total_att / dur_s)},
      {"p99",
       {{"ttft_ms", round3(weighted_quantile(ttft99s, 0.99))},
        {"tpot_ms", round3(tpot_ms)},
        {"e2e_ms", round3(weighted_quantile(e2e99s, 0.99))}}},
      {"gpu_hours", std::round(gpu_s / 3600 * 1e4) / 1e4},
      {"mean_utilization", round3(util_sum / static_cast<double>(n_steps))},
      {"shifts", sim.shifts()},
      {"shift_decisions", decided_shifts},
      {"gear_time_s", gt},
  };
}

}  // namespace ftp::control
