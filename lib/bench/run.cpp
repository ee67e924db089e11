// SPDX-License-Identifier: Apache-2.0
#include <cstdio>

#include "bench/bench.hpp"
#include <algorithm>

#include "control/trace.hpp"
#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::bench {

Report run_bench(const BenchSpec& spec, std::int64_t t_ms, const std::function<void(std::string_view)>& progress,
                 const std::function<void(const Sample&)>& on_sample) {
  Report rep;
  std::vector<Planned> traced;
  if (!spec.trace_path.empty()) {
    const control::Trace tr = control::read_trace(spec.trace_path);
    for (const auto& q : tr.requests) {
      const double at = q.t_ms / 1000.0;
      if (spec.requests > 0 ? static_cast<int>(traced.size()) >= spec.requests : at >= spec.duration_s) break;
      auto cap = [](int v, int limit) { return std::max(1, limit > 0 ? std::min(v, limit) : v); };
      traced.push_back({at, cap(q.prompt_tokens, spec.max_prompt_tokens), cap(q.output_tokens, spec.max_output_tokens)});
    }
    if (traced.empty()) throw InputError(spec.trace_path + ": no request in the trace (within the limits given)");
  }
  rep.served_model = probe(spec.target);
  const std::size_t n_runs = traced.empty() ? spec.rates.size() : 1;
  for (std::size_t i = 0; i < n_runs; ++i) {
    std::vector<Planned> plan = traced;
    double rate = 0;
    if (traced.empty()) {
      rate = spec.rates[i];
      Arrivals a = spec.arrivals;
      a.seed = spec.arrivals.seed + i;
      for (double at : arrival_times(rate, a, spec.requests, spec.duration_s))
        plan.push_back({at, spec.prompt_tokens, spec.output_tokens});
    } else if (plan.size() > 1 && plan.back().at_s > plan.front().at_s) {
      // N arrivals span N - 1 gaps.
      rate = static_cast<double>(plan.size() - 1) / (plan.back().at_s - plan.front().at_s);
    }
    char line[160];
    std::snprintf(line, sizeof line, "rate %g req/s: %zu requests", rate, plan.size());
    if (progress) progress(line);
    double duration = 0;
    auto samples = run_load(spec.target, plan, static_cast<int>(i), duration, [&](int done, int total) {
      char l[96];
      std::snprintf(l, sizeof l, "rate %g req/s: %d/%d done", rate, done, total);
      if (progress) progress(l);
    });
    for (const auto& s : samples) {
      if (on_sample) on_sample(s);
      if (s.ok) continue;
      if (rep.first_error.empty()) rep.first_error = s.error;
      if (s.error.rfind("HTTP 400", 0) == 0 || s.error.rfind("HTTP 413", 0) == 0) {
        if (rep.refused++ == 0) rep.first_refusal = s.error;
      }
    }
    RunSummary r = summarize(samples, rate, duration, plan.empty() ? 0 : plan.back().at_s, spec.slo, spec.sustain);
    std::snprintf(line, sizeof line, "rate %g req/s: %.3g req/s, %.4g tok/s, goodput %.3g, TTFT p99 %.1f ms, %s", rate,
                  r.request_throughput, r.output_throughput, r.goodput, r.ttft_ms.p99,
                  r.sustainable ? "sustained" : "not sustained");
    if (progress) progress(line);
    rep.runs.push_back(r);
    if (!r.sustainable) break;
  }
  rep.capacity = capacity_from_runs(rep.runs, spec.gear, t_ms);
  return rep;
}

json::Json to_json(const BenchSpec& spec, const Report& rep) {
  json::Json j{{"kind", doc::kind::gear_bench}};
  j["url"] = spec.target.url;
  j["model"] = spec.target.model.empty() ? rep.served_model : spec.target.model;
  j["gear"] = spec.gear.empty() ? json::Json(nullptr) : json::Json(spec.gear);
  if (!spec.trace_path.empty()) j["trace"] = spec.trace_path;
  j["arrivals"] = {{"process", spec.trace_path.empty() ? spec.arrivals.process : "trace"},
                   {"burstiness", spec.arrivals.process == "gamma" ? spec.arrivals.burstiness : 1.0},
                   {"seed", spec.arrivals.seed}};
  j["requests_per_run"] = spec.requests > 0 ? json::Json(spec.requests) : json::Json(nullptr);
  j["duration_s_per_run"] = spec.requests > 0 ? json::Json(nullptr) : json::Json(spec.duration_s);
  j["prompt_tokens"] = spec.prompt_tokens;
  j["output_tokens"] = spec.output_tokens;
  auto bound = [](double v) { return v > 0 ? json::Json(v) : json::Json(nullptr); };
  j["slo"] = {{"ttft_ms", bound(spec.slo.ttft_ms)}, {"tpot_ms", bound(spec.slo.tpot_ms)}, {"e2e_ms", bound(spec.slo.e2e_ms)}};
  j["sustain"] = {{"min_attainment", spec.sustain.min_attainment}, {"min_keep_up", spec.sustain.min_keep_up}};
  j["runs"] = json::Json::array();
  for (const auto& r : rep.runs) j["runs"].push_back(to_json(r));
  j["capacity"] = rep.capacity ? doc::to_json(*rep.capacity, true) : json::Json(nullptr);
  return j;
}

void check_report(const Report& report) {
  if (report.refused > 0)
    throw InputError("the server refused " + std::to_string(report.refused) +
                     " request(s) as invalid; first: " + report.first_refusal);
  int completed = 0, failed = 0;
  for (const auto& r : report.runs) {
    completed += r.completed;
    failed += r.failed;
  }
  if (completed == 0 && failed > 0)
    throw Error("every request failed (" + std::to_string(failed) + "); first: " + report.first_error);
}

}  // namespace ftp::bench
