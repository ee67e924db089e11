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
#include "engine/domain.hpp"
#include "serve/latency.hpp"
#include "serve/request.hpp"

namespace ftp::serve {

/// What telemetry reads of one domain when it observes: its view in the
/// observation and the numbers behind KV, bubbles and utilization.
struct DomainSample {
  doc::DomainView view;
  double kv_usage = 0;      ///< KV pages in use / cap
  double bubble_ratio = 0;  ///< DomainRunner::bubble_ratio
  double busy_s = 0;        ///< seconds its thread has stepped, since it started
  std::uint64_t preemptions = 0;  ///< engine::DomainStats::preemptions so far
  double queued_prompt_tokens = 0;  ///< engine::Domain::queued_prompt_tokens, tokens
};

/// What the exposition reads of the service besides the domains.
struct ServiceSample {
  std::string gear;       ///< the current gear
  int devices_leased = 0; ///< devices some domain holds (DevicePool)
  std::vector<doc::GpuLoad> gpus;       ///< NVML's GPU signals (flextp:gpu_*)
  std::string gpu_signals_unavailable;  ///< why there are none
};

/// The service's live numbers (ARCHITECTURE.md rule 3): latency windows
/// and histograms, request and token counters, shift outcomes, and the
/// observer's state (queue-depth mean, contention, per-device busy time).
/// It turns them into observations (ftp.observation/v1) and the Prometheus
/// exposition. Times are the service's clock, given by the caller.
/// Thread-safe.
class Telemetry {
 public:
  /// `model_name`: the model_name label of the vllm: metrics; `max_model_len`:
  /// the top of the token histograms' 1-2-5 buckets (0: 100,000).
  explicit Telemetry(std::string model_name = "", int max_model_len = 0);

  /// A request was accepted at `t_ms` with `prompt_tokens` tokens.
  void request_accepted(std::int64_t t_ms, int prompt_tokens);
  /// Its first token came `ttft_ms` after its arrival.
  void first_token(std::int64_t t_ms, double ttft_ms);
  /// One generated token at `t_ms`.
  void token(std::int64_t t_ms);
  /// It finished at `t_ms`: `e2e_ms` after its arrival, `tpot_ms` per token
  /// after the first (none with fewer than two tokens).
  void request_finished(std::int64_t t_ms, int prompt_tokens, int output_tokens, double e2e_ms,
                        std::optional<double> tpot_ms, engine::FinishReason reason);
  /// The same with only failed (error) or not (stop).
  void request_finished(std::int64_t t_ms, int prompt_tokens, int output_tokens, double e2e_ms,
                        std::optional<double> tpot_ms, bool failed) {
    request_finished(t_ms, prompt_tokens, output_tokens, e2e_ms, tpot_ms,
                     failed ? engine::FinishReason::error : engine::FinishReason::stop);
  }
  /// A request waited `queue_ms` between its arrival and its first step.
  void queued(double queue_ms);
  /// A request whose domain failed before it streamed anything runs again
  /// elsewhere (Service's reruns).
  void request_rerun() noexcept { ++requests_rerun_; }
  /// A request that had not started was moved off a draining domain to a
  /// serving one (Domain::withdraw_unstarted).
  void request_moved() noexcept { ++requests_moved_; }
  /// A request was refused by admission control, or as invalid (400).
  void refused(RefusalReason reason);
  void invalid_request();
  /// A step of a shift (Shifter's events): its phase's duration, and at
  /// `done` the outcome by trigger (a rollback counts in rollbacks too).
  void shift_event(const doc::ShiftEvent& e);

  /// P50/P99 E2E of the requests finished at or after `since_ms`.
  doc::Percentiles e2e_since(std::int64_t since_ms) const;
  std::uint64_t requests_total() const noexcept { return requests_total_.load(); }
  std::uint64_t requests_failed() const noexcept { return requests_failed_.load(); }
  std::uint64_t requests_rerun() const noexcept { return requests_rerun_.load(); }
  std::uint64_t requests_moved() const noexcept { return requests_moved_.load(); }

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
  /// Prometheus text exposition of the live numbers and these domains:
  /// vLLM's production metrics (vllm:*, label model_name) where they mean
  /// the same thing, flextp's own under flextp:*.
  std::string prometheus(const ServiceSample& service, const std::vector<DomainSample>& domains) const;

 private:
  /// A Prometheus histogram over fixed bounds.
  struct Histogram {
    explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
    void observe(double v);
    std::vector<double> bounds;
    std::vector<std::uint64_t> counts;  // one per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  /// /proc jiffies (all CPUs, busy, this process) at an observation.
  struct CpuSample {
    std::int64_t t_ms;
    std::uint64_t total, busy, self;
  };
  static constexpr std::int64_t kContentionWindowMs = 300000;  ///< the contention index's window, 5 min

  LatencyWindow ttft_, tpot_, e2e_;
  std::atomic<std::uint64_t> requests_total_{0}, requests_failed_{0}, requests_rerun_{0}, requests_moved_{0}, tokens_in_{0}, tokens_out_{0};
  std::string model_name_;
  mutable std::mutex mu_;  // everything below
  Histogram ttft_s_, tpot_s_, e2e_s_, queue_s_;  // seconds
  Histogram prompt_tokens_h_, generation_tokens_h_;
  std::map<engine::FinishReason, std::uint64_t> finished_by_reason_;
  std::map<RefusalReason, std::uint64_t> refused_;
  std::uint64_t invalid_ = 0, rollbacks_ = 0;
  std::map<std::pair<doc::ShiftOutcome, std::string>, std::uint64_t> shifts_;  // (outcome, trigger)
  std::map<doc::ShiftPhase, Histogram> phase_s_;
  mutable std::map<std::string, std::uint64_t> preemptions_seen_;  // domain -> its count (retired ones stay)
  std::deque<std::pair<std::int64_t, int>> arrivals_;                        // (arrival ms, prompt tokens), last 60 s
  std::deque<std::pair<std::int64_t, std::uint32_t>> decoded_;              // (second, tokens generated in it), last 10 s
  std::deque<std::tuple<std::int64_t, int, int>> finished_;                  // (t, prompt, output tokens), last 60 s
  mutable std::deque<std::pair<std::int64_t, double>> depth_samples_;        // (t, queue depth), last 30 s
  mutable std::map<std::string, std::pair<std::int64_t, double>> busy_seen_;  // domain -> (t, busy s)
  mutable std::deque<CpuSample> cpu_samples_;                                // the contention window, oldest first
};

}  // namespace ftp::serve
