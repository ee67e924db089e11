// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "doc/control.hpp"
#include "doc/states.hpp"
#include "serve/latency.hpp"

namespace ftp::serve {

/// What telemetry reads of one domain when it observes: its view in the
/// observation and the numbers behind KV, bubbles and utilization.
struct DomainSample {
  doc::DomainView view;
  double kv_usage = 0;      ///< KV pages in use / cap
  double bubble_ratio = 0;  ///< DomainRunner::bubble_ratio
  double busy_s = 0;        ///< seconds its thread has stepped, since it started
};

/// The service's live numbers (ARCHITECTURE.md rule 3): latency windows
/// and histograms, request and token counters, shift outcomes, and the
/// observer's state (queue-depth mean, contention, per-device busy time).
/// It turns them into observations (ftp.observation/v1) and the Prometheus
/// exposition. Times are the service's clock, given by the caller.
/// Thread-safe.
class Telemetry {
 public:
  Telemetry();

  /// A request was accepted at `t_ms` with `prompt_tokens` tokens.
  void request_accepted(std::int64_t t_ms, int prompt_tokens);
  /// Its first token came `ttft_ms` after its arrival.
  void first_token(std::int64_t t_ms, double ttft_ms);
  /// One generated token at `t_ms`.
  void token(std::int64_t t_ms);
  /// It finished at `t_ms`: `e2e_ms` after its arrival, `tpot_ms` per token
  /// after the first (none with fewer than two tokens).
  void request_finished(std::int64_t t_ms, int prompt_tokens, int output_tokens, double e2e_ms,
                        std::optional<double> tpot_ms, bool failed);
  /// A shift closed with `outcome`.
  void shift_done(doc::ShiftOutcome outcome);

  /// P50/P99 E2E of the requests finished at or after `since_ms`.
  doc::Percentiles e2e_since(std::int64_t since_ms) const;
  std::uint64_t requests_total() const noexcept { return requests_total_.load(); }
  std::uint64_t requests_failed() const noexcept { return requests_failed_.load(); }

  /// The observation at `t_ms` (ARCHITECTURE.md section 4's signals): queue
  /// depth (now and its 30 s mean), estimated queue time (median E2E x
  /// queue length), request rate, the arrivals' prompt tokens per second and
  /// the generated tokens per second (last 10 s), mean prompt and output tokens
  /// (last 60 s), bubble ratio of pipelined domains, contention index
  /// (share of CPU time taken by other processes and steal over the last
  /// 5 min, from /proc), KV watermark, TTFT/TPOT/E2E P50/P99 (last 30 s),
  /// per-device utilization (share of time its domain was stepping).
  doc::Observation observe(std::int64_t t_ms, const std::string& gear, bool shifting,
                           const std::vector<DomainSample>& domains) const;
  /// Prometheus text exposition of the live numbers and these domains.
  std::string prometheus(const std::string& gear, const std::vector<DomainSample>& domains) const;

 private:
  struct Histogram {
    std::vector<std::uint64_t> counts;  // one per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  /// /proc jiffies (all CPUs, busy, this process) at an observation.
  struct CpuSample {
    std::int64_t t_ms;
    std::uint64_t total, busy, self;
  };
  static void observe_ms(Histogram& h, double ms);
  static constexpr std::int64_t kContentionWindowMs = 300000;  ///< the contention index's window, 5 min

  LatencyWindow ttft_, tpot_, e2e_;
  std::atomic<std::uint64_t> requests_total_{0}, requests_failed_{0}, tokens_in_{0}, tokens_out_{0};
  mutable std::mutex mu_;  // everything below
  Histogram hist_[3];      // ttft, tpot, e2e (ms)
  std::map<doc::ShiftOutcome, std::uint64_t> shifts_by_outcome_;
  std::deque<std::pair<std::int64_t, int>> arrivals_;                        // (arrival ms, prompt tokens), last 60 s
  std::deque<std::pair<std::int64_t, std::uint32_t>> decoded_;              // (second, tokens generated in it), last 10 s
  std::deque<std::tuple<std::int64_t, int, int>> finished_;                  // (t, prompt, output tokens), last 60 s
  mutable std::deque<std::pair<std::int64_t, double>> depth_samples_;        // (t, queue depth), last 30 s
  mutable std::map<std::string, std::pair<std::int64_t, double>> busy_seen_;  // domain -> (t, busy s)
  mutable std::deque<CpuSample> cpu_samples_;                                // the contention window, oldest first
};

}  // namespace ftp::serve
