// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

namespace ftp::control {

/// One request of a trace: its arrival and its size.
struct TraceRequest {
  std::int64_t t_ms = 0;       ///< arrival, relative to the trace's first request (or its start), ms
  int prompt_tokens = 0;
  int output_tokens = 0;
};

/// Requests in arrival order (t_ms never goes back).
struct Trace {
  std::string source;          ///< file name, or the synthetic spec
  std::string format;          ///< "azure-csv" | "mooncake-jsonl" | "synthetic"
  std::vector<TraceRequest> requests;
  /// Last arrival, s (0 for an empty trace).
  double span_s() const noexcept { return requests.empty() ? 0 : requests.back().t_ms / 1000.0; }
};

/// Azure LLM inference trace 2023 (Splitwise): a CSV with the header
/// `TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP as
/// `YYYY-MM-DD HH:MM:SS[.fffffff]` (no time zone), rows sorted. Times become
/// ms after the first row. Errors throw ftp::InputError naming source and
/// line: "code.csv:7: ContextTokens: expected a non-negative integer, got \"x\"".
Trace read_azure_csv(std::istream& in, std::string_view source);

/// Mooncake FAST'25 trace: JSON Lines of {"timestamp": ms, "input_length":
/// tokens, "output_length": tokens, ...}; other fields are ignored. Times
/// become ms after the first line. Errors as read_azure_csv, with the JSON
/// path: "trace.jsonl:3: input_length: missing required field".
Trace read_mooncake_jsonl(std::istream& in, std::string_view source);

/// Reads a trace file, choosing the format by its first non-empty line: a
/// JSON object is Mooncake JSON Lines, anything else the Azure CSV.
Trace read_trace(const std::string& path);

/// The distribution of a synthetic trace's prompt or output lengths, tokens:
///
///   N or const:N          N every time
///   uniform:MIN,MAX       integers uniform in [MIN, MAX]
///   lognormal:MEAN,CV     a log-normal of that mean and coefficient of
///                         variation (sigma^2 = ln(1 + CV^2), mu = ln(MEAN) -
///                         sigma^2 / 2), rounded, at least 1
///
/// Every draw lies in [1, kMaxLength].
struct LengthDist {
  enum class Kind { constant, uniform, lognormal };
  Kind kind = Kind::constant;
  double a = 512;              ///< const: N; uniform: MIN; lognormal: MEAN
  double b = 0;                ///< uniform: MAX; lognormal: CV
  static constexpr int kMaxLength = 1 << 20;
  /// The mean of the draws before rounding and clamping, tokens.
  double mean() const noexcept;
};
/// Parses a length distribution; throws ftp::InputError ("`option`: ...").
LengthDist parse_length_dist(std::string_view spec, std::string_view option);

/// Synthetic arrivals. The rate pattern (requests/s over time) is one of
///
///   const:R               R all the time
///   steps:R1,R2,...@S     R1 for S seconds, then R2, ... (then the last level)
///   day:MIN,MAX@P         a day curve: MIN + (MAX - MIN) (1 - cos(2 pi t / P)) / 2,
///                         trough at t = 0, peak at P / 2
///
/// Gaps between arrivals are Gamma(k, 1/k) in units of 1/rate(t), k =
/// 1 / burstiness^2: burstiness (the gaps' coefficient of variation) 1 is a
/// Poisson process, > 1 burstier. Each request's prompt and output lengths
/// are drawn from their distributions by a second generator, seeded from the
/// seed, so the arrivals do not change with the lengths. Deterministic for a
/// seed (std::mt19937_64).
struct SyntheticConfig {
  std::string pattern;         ///< as above
  double duration_s = 0;       ///< 0: the pattern's own length (steps: n x S; day: P); const needs one
  double burstiness = 1;       ///< CV of the gaps; 1 = Poisson
  std::uint64_t seed = 1;
  LengthDist prompt{LengthDist::Kind::constant, 512, 0};
  LengthDist output{LengthDist::Kind::constant, 128, 0};
};

/// The rate of a pattern at time t_s, requests/s; throws ftp::InputError
/// ("--rate-pattern: ...") for a pattern it cannot read.
double pattern_rate(std::string_view pattern, double t_s);
/// The pattern's own length, s (0 for const).
double pattern_length_s(std::string_view pattern);
/// Generates arrivals in [0, duration).
Trace synthesize(const SyntheticConfig& config);

}  // namespace ftp::control
