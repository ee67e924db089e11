// SPDX-License-Identifier: Apache-2.0
#include "bench/bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::bench {

std::vector<double> arrival_times(double rate, const Arrivals& a, int requests, double duration_s) {
  if (!(rate > 0) || !std::isfinite(rate)) throw InputError("rate: must be a positive number, got " + std::to_string(rate));
  if (!(a.burstiness > 0)) throw InputError("burstiness: must be positive");
  std::mt19937_64 rng(a.seed);
  const double shape = a.process == "gamma" ? a.burstiness : 1.0;
  std::gamma_distribution<double> gap(shape, 1.0 / (rate * shape));
  std::vector<double> out;
  double t = 0;
  // A hard cap keeps a typo (--rate 1e9) from allocating without bound.
  constexpr std::size_t cap = 10'000'000;
  while (out.size() < cap) {
    t += a.process == "constant" ? 1.0 / rate : gap(rng);
    if (requests > 0) {
      if (static_cast<int>(out.size()) >= requests) break;
    } else if (t >= duration_s) {
      break;
    }
    out.push_back(t);
  }
  return out;
}

std::optional<double> Sample::tpot_ms() const {
  if (!ok || output_tokens < 2) return std::nullopt;
  return (e2e_ms - ttft_ms) / (output_tokens - 1);
}

json::Json to_json(const Sample& s) {
  json::Json j{{"run", s.run}, {"id", s.id}, {"scheduled_s", s.scheduled_s}, {"sent_s", s.sent_s}, {"ok", s.ok}};
  if (!s.ok) j["error"] = s.error;
  j["ttft_ms"] = s.ttft_ms;
  j["e2e_ms"] = s.e2e_ms;
  auto tp = s.tpot_ms();
  j["tpot_ms"] = tp ? json::Json(*tp) : json::Json(nullptr);
  j["itl_ms"] = s.itl_ms;
  j["prompt_tokens"] = s.prompt_tokens;
  j["output_tokens"] = s.output_tokens;
  return j;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

Stats stats(const std::vector<double>& v) {
  Stats s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.p50 = percentile(v, 50);
  s.p90 = percentile(v, 90);
  s.p99 = percentile(v, 99);
  return s;
}

json::Json to_json(const Stats& s) {
  return json::Json{{"n", s.n}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
}

bool meets(const Sample& s, const Slo& slo) {
  if (!s.ok) return false;
  if (slo.ttft_ms > 0 && s.ttft_ms > slo.ttft_ms) return false;
  if (slo.tpot_ms > 0 && s.tpot_ms().value_or(0.0) > slo.tpot_ms) return false;
  if (slo.e2e_ms > 0 && s.e2e_ms > slo.e2e_ms) return false;
  return true;
}

RunSummary summarize(const std::vector<Sample>& samples, double offered_rps, double duration_s,
                     double last_arrival_s, const Slo& slo, const Sustain& sustain) {
  RunSummary r;
  r.offered_rps = offered_rps;
  r.requests = static_cast<int>(samples.size());
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  double out_tokens = 0, all_tokens = 0;
  int good = 0;
  for (const auto& s : samples) {
    if (!s.ok) {
      ++r.failed;
      continue;
    }
    ++r.completed;
    if (meets(s, slo)) ++good;
    out_tokens += s.output_tokens;
    all_tokens += s.output_tokens + s.prompt_tokens;
    ttft.push_back(s.ttft_ms);
    e2e.push_back(s.e2e_ms);
    if (auto t = s.tpot_ms()) tpot.push_back(*t);
    itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
  }
  if (duration_s > 0) {
    r.request_throughput = r.completed / duration_s;
    r.output_throughput = out_tokens / duration_s;
    r.total_token_throughput = all_tokens / duration_s;
    r.goodput = good / duration_s;
  }
  r.slo_attainment = r.requests > 0 ? static_cast<double>(good) / r.requests : 0;
  // Keeping up: every request finished, and the run ended about when it
  // would with no backlog -- the last arrival plus a typical request's E2E.
  // (The achieved rate over the whole run counts the last requests' time to
  // finish, so it falls short of the offered rate even on an idle server.)
  const double typical_e2e_s = e2e.empty() ? 0 : percentile(e2e, 50) / 1000.0;
  const double on_time = duration_s > 0 ? std::min(1.0, (last_arrival_s + typical_e2e_s) / duration_s) : 0;
  r.keep_up = r.requests > 0 ? static_cast<double>(r.completed) / r.requests * on_time : 0;
  r.sustainable = r.requests > 0 && r.slo_attainment >= sustain.min_attainment && r.keep_up >= sustain.min_keep_up;
  r.ttft_ms = stats(ttft);
  r.tpot_ms = stats(tpot);
  r.itl_ms = stats(itl);
  r.e2e_ms = stats(e2e);
  return r;
}

json::Json to_json(const RunSummary& r) {
  return json::Json{{"offered_rps", r.offered_rps},
                    {"requests", r.requests},
                    {"completed", r.completed},
                    {"failed", r.failed},
                    {"duration_s", r.duration_s},
                    {"request_throughput", r.request_throughput},
                    {"output_throughput", r.output_throughput},
                    {"total_token_throughput", r.total_token_throughput},
                    {"goodput", r.goodput},
                    {"slo_attainment", r.slo_attainment},
                    {"keep_up", r.keep_up},
                    {"sustainable", r.sustainable},
                    {"ttft_ms", to_json(r.ttft_ms)},
                    {"tpot_ms", to_json(r.tpot_ms)},
                    {"itl_ms", to_json(r.itl_ms)},
                    {"e2e_ms", to_json(r.e2e_ms)}};
}

std::optional<doc::Capacity> capacity_from_runs(const std::vector<RunSummary>& runs, const std::string& gear,
                                                std::int64_t t_ms, double safe_share) {
  // Only a run with an offered rate shows one (a burst at t = 0 does not),
  // and it shows no more than that rate: its throughput over the run less
  // a typical request's time to finish, at most the offered rate.
  auto shown = [](const RunSummary& r) {
    const double window_s = r.duration_s - r.e2e_ms.p50 / 1000.0;
    const double rps = window_s > 0 ? r.completed / window_s : r.request_throughput;
    return std::min(r.offered_rps, rps);
  };
  const RunSummary* best = nullptr;
  for (const auto& r : runs)
    if (r.sustainable && r.offered_rps > 0 && r.completed > 1 && (!best || shown(r) > shown(*best))) best = &r;
  if (!best) return std::nullopt;
  doc::Capacity c;
  c.gear = gear;
  c.max_rps = shown(*best);
  c.safe_rps = safe_share * c.max_rps;
  c.max_tokens_s = best->request_throughput > 0 ? best->output_throughput / best->request_throughput * c.max_rps : 0;
  c.safe_tokens_s = safe_share * c.max_tokens_s;
  c.source = "bench";
  c.t_ms = t_ms;
  c.window_s = best->duration_s;
  return c;
}

namespace {

json::Json read_table(const std::string& path, const std::string& gear, std::size_t& index) {
  json::Json j = json::read_file(path);
  try {
    doc::GearTable t = doc::gear_table_from_json(j);
    const int i = t.index_of(gear);
    if (i < 0) {
      std::string names;
      for (const auto& g : t.gears) names += (names.empty() ? "" : ", ") + g.name;
      throw InputError("no gear named \"" + gear + "\" (the table has " + names + ")");
    }
    index = static_cast<std::size_t>(i);
  } catch (const std::exception& e) {
    json::rethrow_with_source(path, e);
  }
  return j;
}

}  // namespace

void check_gear(const std::string& path, const std::string& gear) {
  std::size_t i = 0;
  read_table(path, gear, i);
}

void check_table_model(const std::string& path, const std::string& served_model) {
  const json::Json j = json::read_file(path);
  const std::string table_model =
      j.contains("model") && j["model"].is_object() && j["model"].contains("name") && j["model"]["name"].is_string()
          ? j["model"]["name"].get<std::string>()
          : "";
  if (!table_model.empty() && !served_model.empty() && table_model != served_model)
    throw InputError(path + ": model.name: the table is for \"" + table_model + "\", the daemon serves \"" +
                     served_model + "\"; a capacity measured on one model does not belong to another");
}

void write_capacity(const std::string& path, const std::string& gear, const doc::Capacity& c) {
  std::size_t i = 0;
  json::Json j = read_table(path, gear, i);
  j["gears"][i]["measured"] = doc::to_json(c, false);
  try {
    doc::gear_table_from_json(j);
  } catch (const std::exception& e) {
    json::rethrow_with_source(path, e);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json::dump(j, json::Style::pretty) << '\n';
    out.flush();
    if (!out) throw Error(path + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot replace the file");
  }
}

std::string synthetic_prompt(int tokens) {
  std::string s;
  for (int i = 0; i < tokens; ++i) s += i == 0 ? "the" : " the";
  return s;
}

double parse_duration_s(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw InputError("duration: expected a number with an optional unit (ms, s, m), got \"" + text + "\"");
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "ms") scale = 1e-3;
  else if (unit == "m") scale = 60;
  if (scale == 0 || !(v > 0) || !std::isfinite(v))
    throw InputError("duration: expected a positive number with an optional unit (ms, s, m), got \"" + text + "\"");
  return v * scale;
}

std::vector<double> parse_rates(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(v > 0) || !std::isfinite(v))
      throw InputError("rates: \"" + item + "\" is not a positive number (in \"" + text + "\")");
    if (!out.empty() && v <= out.back())
      throw InputError("rates: must increase, got " + item + " after " + std::to_string(out.back()));
    out.push_back(v);
  }
  if (out.empty()) throw InputError("rates: empty list");
  return out;
}

}  // namespace ftp::bench
