// SPDX-License-Identifier: Apache-2.0
#pragma once

// ftp-gear-bench's library: open-loop arrivals, per-request samples, the
// metrics of vLLM's bench-serve (TTFT, TPOT, ITL, E2E, throughput, goodput),
// the sweep's sustainability rule and the capacity it writes into a gear
// table. The HTTP load generator is in load.cpp; everything else here is
// pure and unit-tested (tests/unit/test_bench.cpp).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.hpp"
#include "doc/gear_table.hpp"

namespace ftp::bench {

/// The arrival process of an open loop: inter-arrival gaps are drawn from a
/// gamma distribution of shape `burstiness` and mean 1/rate (vLLM's
/// definition; shape 1 is Poisson), or are all exactly 1/rate (constant).
struct Arrivals {
  std::string process = "poisson";  ///< "poisson" | "gamma" | "constant"
  double burstiness = 1.0;          ///< gamma shape; < 1 burstier, > 1 smoother
  std::uint64_t seed = 0;
};

/// Arrival times (s from the start of a run, increasing, the first > 0):
/// `requests` of them when > 0, else all those before `duration_s`.
std::vector<double> arrival_times(double rate, const Arrivals& a, int requests, double duration_s);

/// One request as the client saw it. Times in ms, relative to the request's send.
struct Sample {
  int run = 0;                 ///< index of the run (rate) in the report
  int id = 0;                  ///< index of the request in its run
  double scheduled_s = 0;      ///< planned send time from the run's start, s
  double sent_s = 0;           ///< actual send time from the run's start, s
  bool ok = false;
  std::string error;           ///< why it failed, when !ok
  double ttft_ms = 0;          ///< send -> first chunk that carries text
  double e2e_ms = 0;           ///< send -> end of the stream
  std::vector<double> itl_ms;  ///< gaps between successive text chunks
  int prompt_tokens = 0;       ///< from usage; 0 when the server gave none
  int output_tokens = 0;       ///< from usage, else the number of text chunks

  /// vLLM: (E2E - TTFT) / (output tokens - 1); nullopt for fewer than 2 tokens.
  std::optional<double> tpot_ms() const;
};

json::Json to_json(const Sample& s);

/// Mean and percentiles of one metric (numpy's default linear interpolation).
struct Stats {
  int n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

/// Linear-interpolated percentile (0..100) of unsorted values; 0 when empty.
double percentile(std::vector<double> values, double p);
Stats stats(const std::vector<double>& values);
json::Json to_json(const Stats& s);

/// Service-level objectives; 0 means no bound on that metric.
struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2e_ms = 0;
};

/// A request is good when it succeeded and meets every bound of `slo`
/// (a request of one output token has TPOT 0, as in vLLM).
bool meets(const Sample& s, const Slo& slo);

/// When a rate counts as sustained by the server.
struct Sustain {
  double min_attainment = 0.9;  ///< share of requests meeting the SLOs
  double min_keep_up = 0.9;     ///< achieved / offered request rate
};

/// The metrics of one run at one offered rate.
struct RunSummary {
  double offered_rps = 0;       ///< the rate asked for
  int requests = 0, completed = 0, failed = 0;
  double duration_s = 0;        ///< run start -> last request finished
  double request_throughput = 0;   ///< completed / duration_s, req/s
  double output_throughput = 0;    ///< output tokens / duration_s, tokens/s
  double total_token_throughput = 0;  ///< (prompt + output tokens) / duration_s
  double goodput = 0;           ///< good requests / duration_s, req/s
  double slo_attainment = 0;    ///< good / requests
  double keep_up = 0;           ///< completed / requests x min(1, (last arrival + median E2E) / duration)
  bool sustainable = false;
  Stats ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

/// Summarises one run's samples. `last_arrival_s` is the last scheduled send.
RunSummary summarize(const std::vector<Sample>& samples, double offered_rps, double duration_s,
                     double last_arrival_s, const Slo& slo, const Sustain& sustain);
json::Json to_json(const RunSummary& r);

/// The capacity of a gear from a sweep: the sustainable run of highest
/// request throughput gives max; safe = `safe_share` x max (0.8 by
/// ARCHITECTURE.md). nullopt when no run was sustainable.
std::optional<doc::Capacity> capacity_from_runs(const std::vector<RunSummary>& runs, const std::string& gear,
                                                std::int64_t t_ms, double safe_share = 0.8);

/// Refuses (InputError naming the file) a gear table whose model.name is
/// not the model the daemon serves (`served_model`, from /v1/models).
void check_table_model(const std::string& path, const std::string& served_model);

/// Sets gears[i].measured of gear `gear` in the ftp.gear-table/v1 file
/// `path`, keeping every other field, validates the result and replaces
/// the file atomically. Throws InputError when the table is invalid or has no such gear.
void write_capacity(const std::string& path, const std::string& gear, const doc::Capacity& c);

/// Throws InputError unless the table at `path` is valid and has gear `gear`.
void check_gear(const std::string& path, const std::string& gear);

/// A synthetic prompt of about `tokens` tokens: one short word repeated.
std::string synthetic_prompt(int tokens);

/// Parses a duration: "30", "30s", "500ms", "2m". Throws InputError.
double parse_duration_s(const std::string& text);
/// Parses "1,2,4.5" into increasing positive rates. Throws InputError.
std::vector<double> parse_rates(const std::string& text);

// ---- the HTTP load generator (load.cpp) ----

/// Where and what to ask: an OpenAI-compatible /v1/completions.
struct Target {
  std::string url = "http://127.0.0.1:8080";  ///< scheme://host:port[/prefix]
  std::string model;                           ///< empty: the "model" field is left out
  std::string api_key;                         ///< empty: no Authorization header
  double timeout_s = 300;                      ///< per request
};

/// One request of a run: when to send it and its size.
struct Planned {
  double at_s = 0;         ///< send time from the run's start, s
  int prompt_tokens = 64;  ///< about; a synthetic prompt of this many words
  int output_tokens = 64;  ///< max_tokens
};

/// Checks that the server answers GET /health; throws Error(Exit::unreachable)
/// naming the URL otherwise. Returns the served model name from /v1/models
/// when it can ("" otherwise).
std::string probe(const Target& t);

/// Runs one open-loop run: request i is sent at plan[i].at_s after the start,
/// each on a thread of its own, whatever the state of earlier ones; every
/// request is streamed so TTFT and ITL are timed per chunk. `progress` is
/// called about once a second with (finished, total). Returns the samples
/// in request order and the run's duration (start -> last finish), s.
std::vector<Sample> run_load(const Target& t, const std::vector<Planned>& plan, int run_index,
                             double& duration_s, const std::function<void(int, int)>& progress = {});

// ---- a whole bench: one rate or a sweep (run.cpp) ----

struct BenchSpec {
  Target target;
  std::string gear;            ///< the gear measured, for the report and the capacity
  std::vector<double> rates;   ///< one rate, or increasing rates of a sweep; req/s
  Arrivals arrivals;
  int requests = 0;            ///< per run; 0: use duration_s
  double duration_s = 10;      ///< per run, s of arrivals
  int prompt_tokens = 64;      ///< about; the synthetic prompt repeats a word
  int output_tokens = 64;      ///< max_tokens of every request
  Slo slo;
  Sustain sustain;
  /// A trace (Azure CSV or Mooncake JSONL, control/trace.hpp) replayed as one
  /// run instead of synthetic rates: its arrival times and request sizes;
  /// limited by requests / duration_s when set.
  std::string trace_path;
  int max_prompt_tokens = 0;   ///< trace mode: cap on a request's prompt; 0 none
  int max_output_tokens = 0;   ///< trace mode: cap on a request's max_tokens; 0 none
};

struct Report {
  std::vector<RunSummary> runs;          ///< in rate order; a sweep stops after the first unsustained rate
  std::optional<doc::Capacity> capacity;  ///< from the sustained runs; nullopt when none
  std::string served_model;               ///< from /v1/models
  int refused = 0;                        ///< requests the server answered 400 or 413 (the bench asked amiss)
  std::string first_refusal;              ///< the first of those answers
  std::string first_error;                ///< the first failure of any kind
};

/// Throws when the bench's numbers would mean nothing: InputError (exit 2)
/// when the server refused requests as invalid (a --prompt-tokens or
/// --output-tokens over its limits, say), Error (exit 1) when every request
/// failed. Called after the report is written, which keeps the samples.
void check_report(const Report& report);

/// Probes the server (Error with Exit::unreachable when it does not answer),
/// then runs every rate in order, stopping after the first one the server
/// did not sustain. `on_sample` gets every sample as its run ends.
Report run_bench(const BenchSpec& spec, std::int64_t t_ms, const std::function<void(std::string_view)>& progress,
                 const std::function<void(const Sample&)>& on_sample);

/// The ftp.gear-bench/v1 document.
json::Json to_json(const BenchSpec& spec, const Report& report);

}  // namespace ftp::bench
