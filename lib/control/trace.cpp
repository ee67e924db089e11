// SPDX-License-Identifier: Apache-2.0
#include "control/trace.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <numbers>
#include <random>

#include "core/error.hpp"
#include "core/json.hpp"

namespace ftp::control {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}

bool blank(std::string_view s) { return trim(s).empty(); }

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

template <class T>
bool parse_num(std::string_view s, T& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.f...]" -> ms since the epoch (time zone ignored: only differences count).
bool parse_timestamp(std::string_view s, std::int64_t& ms) {
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') || s[13] != ':' || s[16] != ':')
    return false;
  int y, mo, d, h, mi, se;
  if (!parse_num(s.substr(0, 4), y) || !parse_num(s.substr(5, 2), mo) || !parse_num(s.substr(8, 2), d) ||
      !parse_num(s.substr(11, 2), h) || !parse_num(s.substr(14, 2), mi) || !parse_num(s.substr(17, 2), se))
    return false;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return false;
  double frac = 0;
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() == 20) return false;
    double scale = 0.1;
    for (char c : s.substr(20)) {
      if (c < '0' || c > '9') return false;
      frac += (c - '0') * scale;
      scale /= 10;
    }
  }
  const std::int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
  ms = secs * 1000 + static_cast<std::int64_t>(std::llround(frac * 1000));
  return true;
}

void check_order(std::vector<TraceRequest>& reqs, std::int64_t t, std::int64_t prev, const std::string& where,
                 std::string_view field) {
  if (!reqs.empty() && t < prev)
    throw InputError(where + std::string(field) + ": must not go back in time, got " + std::to_string(t) + " after " +
                     std::to_string(prev));
}

void rebase(Trace& t) {
  if (t.requests.empty()) throw InputError(t.source + ": no requests");
  const std::int64_t t0 = t.requests.front().t_ms;
  for (auto& r : t.requests) r.t_ms -= t0;
}

struct Pattern {
  enum Kind { constant, steps, day } kind = constant;
  std::vector<double> levels;  // const: {R}; steps: R1..Rn; day: {MIN, MAX}
  double period_s = 0;

  double rate(double t_s) const {
    switch (kind) {
      case constant: return levels[0];
      case steps: {
        auto i = static_cast<std::size_t>(std::max(0.0, t_s / period_s));
        return levels[std::min(i, levels.size() - 1)];
      }
      case day:
        return levels[0] + (levels[1] - levels[0]) * (1 - std::cos(2 * std::numbers::pi * t_s / period_s)) / 2;
    }
    return 0;
  }
  double length_s() const {
    return kind == steps ? period_s * static_cast<double>(levels.size()) : kind == day ? period_s : 0;
  }
};

Pattern parse_pattern(std::string_view spec) {
  auto fail = [&](const std::string& why) -> Pattern {
    throw InputError("--rate-pattern: " + why + " in " + quoted(spec) +
                     " (expected const:R, steps:R1,R2,...@SECONDS or day:MIN,MAX@PERIOD_S)");
  };
  Pattern p;
  auto colon = spec.find(':');
  if (colon == std::string_view::npos) return fail("no ':'");
  std::string_view name = spec.substr(0, colon), rest = spec.substr(colon + 1);
  if (name == "const") p.kind = Pattern::constant;
  else if (name == "steps") p.kind = Pattern::steps;
  else if (name == "day") p.kind = Pattern::day;
  else return fail("unknown pattern " + quoted(name));
  if (p.kind != Pattern::constant) {
    auto at = rest.find('@');
    if (at == std::string_view::npos) return fail("no '@SECONDS'");
    if (!parse_num(rest.substr(at + 1), p.period_s) || !(p.period_s > 0) || !std::isfinite(p.period_s))
      return fail("period must be a finite number > 0");
    rest = rest.substr(0, at);
  }
  while (true) {
    auto comma = rest.find(',');
    double v;
    if (!parse_num(rest.substr(0, comma), v) || !(v >= 0) || !std::isfinite(v))
      return fail("rate " + quoted(rest.substr(0, comma)) + " is not a number >= 0");
    p.levels.push_back(v);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (p.kind == Pattern::constant && p.levels.size() != 1) return fail("const takes one rate");
  if (p.kind == Pattern::day && (p.levels.size() != 2 || p.levels[1] < p.levels[0])) return fail("day takes MIN,MAX with MIN <= MAX");
  return p;
}

}  // namespace

Trace read_azure_csv(std::istream& in, std::string_view source) {
  Trace t{std::string(source), "azure-csv", {}};
  std::string line;
  long n = 0;
  bool header = false;
  std::int64_t prev = 0;
  while (std::getline(in, line)) {
    ++n;
    if (blank(line)) continue;
    const std::string where = t.source + ":" + std::to_string(n) + ": ";
    std::string_view l = trim(line);
    if (!header) {
      if (l != "TIMESTAMP,ContextTokens,GeneratedTokens")
        throw InputError(where + "expected the header TIMESTAMP,ContextTokens,GeneratedTokens, got " + quoted(l));
      header = true;
      continue;
    }
    std::vector<std::string_view> f;
    for (std::size_t pos = 0;;) {
      auto c = l.find(',', pos);
      f.push_back(trim(l.substr(pos, c == std::string_view::npos ? c : c - pos)));
      if (c == std::string_view::npos) break;
      pos = c + 1;
    }
    if (f.size() != 3)
      throw InputError(where + "expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), got " +
                       std::to_string(f.size()));
    TraceRequest r;
    if (!parse_timestamp(f[0], r.t_ms))
      throw InputError(where + "TIMESTAMP: expected YYYY-MM-DD HH:MM:SS[.fffffff], got " + quoted(f[0]));
    if (!parse_num(f[1], r.prompt_tokens) || r.prompt_tokens < 0)
      throw InputError(where + "ContextTokens: expected a non-negative integer, got " + quoted(f[1]));
    if (!parse_num(f[2], r.output_tokens) || r.output_tokens < 0)
      throw InputError(where + "GeneratedTokens: expected a non-negative integer, got " + quoted(f[2]));
    check_order(t.requests, r.t_ms, prev, where, "TIMESTAMP");
    prev = r.t_ms;
    t.requests.push_back(r);
  }
  if (!header) throw InputError(t.source + ": empty, expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
  rebase(t);
  return t;
}

Trace read_mooncake_jsonl(std::istream& in, std::string_view source) {
  Trace t{std::string(source), "mooncake-jsonl", {}};
  std::string line;
  long n = 0;
  std::int64_t prev = 0;
  while (std::getline(in, line)) {
    ++n;
    if (blank(line)) continue;
    const std::string where = t.source + ":" + std::to_string(n) + ": ";
    TraceRequest r;
    try {
      const json::Json j = json::parse_line(line);
      json::Node node(j, "");
      node.expect_object();
      r.t_ms = node.positive_integer("timestamp", true);
      r.prompt_tokens = node.positive_int("input_length", true);
      r.output_tokens = node.positive_int("output_length", true);
    } catch (const InputError& e) {
      throw InputError(where + e.what());
    }
    check_order(t.requests, r.t_ms, prev, where, "timestamp");
    prev = r.t_ms;
    t.requests.push_back(r);
  }
  rebase(t);
  return t;
}

Trace read_trace(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InputError(path + ": cannot open the trace file");
  std::string line;
  while (std::getline(f, line) && blank(line)) {
  }
  const bool jsonl = trim(line).starts_with("{");
  f.clear();
  f.seekg(0);
  return jsonl ? read_mooncake_jsonl(f, path) : read_azure_csv(f, path);
}

double pattern_rate(std::string_view pattern, double t_s) { return parse_pattern(pattern).rate(t_s); }
double pattern_length_s(std::string_view pattern) { return parse_pattern(pattern).length_s(); }

namespace {

/// The most requests a synthetic trace may hold (16 bytes each: 320 MB) and
/// the largest coefficient of variation of its gaps: past them a typo
/// (const:1e9, --burstiness 1e9) would fill the memory instead of failing.
constexpr std::size_t kMaxSyntheticRequests = 20000000;
constexpr double kMaxBurstiness = 100;

std::string short_number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace

double LengthDist::mean() const noexcept {
  switch (kind) {
    case Kind::uniform: return (a + b) / 2;
    case Kind::constant:
    case Kind::lognormal: break;
  }
  return a;
}

LengthDist parse_length_dist(std::string_view spec, std::string_view option) {
  auto fail = [&](const std::string& why) -> LengthDist {
    throw InputError(std::string(option) + ": " + why + " in " + quoted(spec) +
                     " (expected N, const:N, uniform:MIN,MAX or lognormal:MEAN,CV, tokens)");
  };
  LengthDist d;
  auto colon = spec.find(':');
  std::string_view name = colon == std::string_view::npos ? "const" : spec.substr(0, colon);
  std::string_view rest = colon == std::string_view::npos ? spec : spec.substr(colon + 1);
  std::vector<double> v;
  while (true) {
    auto comma = rest.find(',');
    double x;
    if (!parse_num(rest.substr(0, comma), x) || !std::isfinite(x)) return fail(quoted(rest.substr(0, comma)) + " is not a number");
    v.push_back(x);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  const double max = LengthDist::kMaxLength;
  auto length = [&](double x, const char* what) {
    if (!(x >= 1 && x <= max)) fail(std::string(what) + " must be in [1, " + std::to_string(LengthDist::kMaxLength) + "]");
  };
  if (name == "const") {
    if (v.size() != 1) return fail("const takes one length");
    length(v[0], "the length");
    d = {LengthDist::Kind::constant, std::round(v[0]), 0};
  } else if (name == "uniform") {
    if (v.size() != 2) return fail("uniform takes MIN,MAX");
    length(v[0], "MIN");
    length(v[1], "MAX");
    if (v[1] < v[0]) return fail("MAX must be >= MIN");
    d = {LengthDist::Kind::uniform, std::round(v[0]), std::round(v[1])};
  } else if (name == "lognormal") {
    if (v.size() != 2) return fail("lognormal takes MEAN,CV");
    length(v[0], "MEAN");
    if (!(v[1] >= 0 && v[1] <= 100)) return fail("CV must be in [0, 100]");
    d = {LengthDist::Kind::lognormal, v[0], v[1]};
  } else {
    return fail("unknown distribution " + quoted(name));
  }
  return d;
}

namespace {

int draw_length(const LengthDist& d, std::mt19937_64& rng) {
  double x = d.a;
  switch (d.kind) {
    case LengthDist::Kind::constant: break;
    case LengthDist::Kind::uniform:
      x = std::uniform_int_distribution<int>(static_cast<int>(d.a), static_cast<int>(d.b))(rng);
      break;
    case LengthDist::Kind::lognormal: {
      if (d.b == 0) {
        x = std::round(d.a);
        break;
      }
      const double s2 = std::log1p(d.b * d.b);
      x = std::round(std::lognormal_distribution<double>(std::log(d.a) - s2 / 2, std::sqrt(s2))(rng));
      break;
    }
  }
  return static_cast<int>(std::clamp(x, 1.0, static_cast<double>(LengthDist::kMaxLength)));
}

}  // namespace

Trace synthesize(const SyntheticConfig& c) {
  const Pattern p = parse_pattern(c.pattern);
  const double duration = c.duration_s > 0 ? c.duration_s : p.length_s();
  if (!(duration > 0)) throw InputError("--duration: a const rate pattern needs a duration");
  if (!(c.burstiness > 0 && c.burstiness <= kMaxBurstiness))
    throw InputError("--burstiness: must be in (0, " + std::to_string(static_cast<int>(kMaxBurstiness)) + "], got " +
                     short_number(c.burstiness));
  const double k = 1 / (c.burstiness * c.burstiness);
  std::mt19937_64 rng(c.seed), lengths(c.seed ^ 0x6c656e67746873ull);  // "lengths"
  std::gamma_distribution<double> gap(k, 1 / k);  // mean 1, CV = burstiness
  Trace t{"synthetic " + c.pattern, "synthetic", {}};
  // Gaps are drawn in "operational time" and stretched by the rate where they
  // start; a zero rate is skipped over in 1 s steps.
  double now = 0;
  while (now < duration) {
    const double rate = p.rate(now);
    if (rate <= 0) {
      now = std::floor(now) + 1;
      continue;
    }
    now += gap(rng) / rate;
    if (now >= duration) break;
    if (t.requests.size() >= kMaxSyntheticRequests)
      throw InputError("--rate-pattern " + c.pattern + " over " + short_number(duration) + " s: more than " +
                       std::to_string(kMaxSyntheticRequests) + " requests; use a lower rate or a shorter --duration");
    const int prompt = draw_length(c.prompt, lengths);
    t.requests.push_back({static_cast<std::int64_t>(now * 1000), prompt, draw_length(c.output, lengths)});
  }
  return t;
}

}  // namespace ftp::control
