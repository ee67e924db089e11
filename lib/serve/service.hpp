// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/control.hpp"
#include "doc/gear_table.hpp"
#include "backend/cpu/virtual_device.hpp"
#include "control/clock.hpp"
#include "engine/domain.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "serve/domain_runner.hpp"
#include "serve/generate.hpp"
#include "serve/latency.hpp"

namespace ftp::serve {

/// A request the service refuses, with what an HTTP or RPC answer needs:
/// status 400 "invalid_request_error" for bad input, 503 when not serving;
/// `code` as OpenAI's ("context_length_exceeded" for a request longer than
/// the context allows; empty: none).
class RequestError : public InputError {
 public:
  RequestError(int status, std::string type, std::string param, std::string message, std::string code = "")
      : InputError(std::move(message)), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const noexcept { return status_; }
  const std::string& type() const noexcept { return type_; }
  const std::string& param() const noexcept { return param_; }
  const std::string& code() const noexcept { return code_; }

 private:
  int status_;
  std::string type_, param_, code_;
};

/// A refused control operation, with its ftp.* error name (ftp.NoSuchGear,
/// ftp.ShiftInProgress, ftp.LastDomain, ftp.NoSuchDomain, ...).
class ControlError : public Error {
 public:
  ControlError(std::string name, std::string message, Exit exit = Exit::failure)
      : Error(std::move(message), exit), name_(std::move(name)) {}
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
};

/// Checks a shift's ramp (new domains' traffic shares): each in (0, 1],
/// increasing, the last 1.0. Throws InputError starting with `what`.
void check_ramp(const std::vector<double>& shares, const std::string& what);

/// What the daemon serves and how.
struct ServiceConfig {
  std::string model_name;              ///< id in /v1/models
  doc::GearTable gears;                ///< the gear table (a one-gear table for --gear)
  std::string start_gear;              ///< default: gears[0]
  /// KV pages per domain; 0 (the default): the gear's kv_cache_cap of the
  /// free memory of each of its devices (CPU virtual devices; GPUs: what
  /// is free less the weights not resident yet, shared among all the gear's
  /// ranks on one GPU), at most what max_running requests of the full
  /// context need (Service::kv_blocks_for).
  int kv_blocks = 0;
  int block_tokens = 16;
  int max_batched_tokens = 256;
  int max_running = 64;
  int max_prompt_tokens = 0;           ///< 0: the model's context - 1
  int max_tokens_limit = 2048;         ///< largest max_tokens a request may ask
  std::vector<double> ramp = {0.1, 0.5, 1.0};
  int step_interval_ms = 1000;         ///< wait at each ramp step before its check
  double rollback_p99_factor = 1.5;    ///< a ramp check fails when P99 E2E > factor x baseline
  int drain_timeout_ms = 600000;
  int slow_start_steps = 20;           ///< a new domain's batch cap is 70 % for this many steps
  /// Router rules: a request with priority > 0, or a prompt of at least this
  /// many tokens (0: off), goes to the serving domain of the largest TP degree.
  int route_long_prompt_tokens = 0;
  /// The real engine's backend: "cpu" (virtual devices) or "cuda". With
  /// cuda, a gear's device "gpu<N>" is CUDA device N and any other device
  /// name (e.g. a virtual device vd<N>) is device 0: several ranks on one GPU.
  std::string backend = "cpu";
  /// The control plane's time (request stamps, shift phases, observations;
  /// ARCHITECTURE.md rule 4); null: control::SystemClock.
  std::shared_ptr<const control::Clock> clock;
  /// Builds each domain's engine instead of the real one (engine::Executor
  /// over weights loaded once by the service): e.g. the simulated engine
  /// (ftp-serve --engine sim). Gets the gear's replica the domain runs and
  /// the domain's config. Set: the service loads no weights and creates no
  /// CPU virtual devices, and the model needs only hparams and tokenizer.
  std::function<std::unique_ptr<engine::Engine>(const doc::Replica&, const engine::DomainConfig&)> engine_factory;
  /// Told of every step of every domain (DomainRunner::StepObserver); null: none.
  DomainRunner::StepObserver step_observer;
  /// Extra checks of a reloaded gear table (e.g. the daemon's virtual
  /// devices); throws InputError. Null: none beyond the model's shapes.
  std::function<void(const doc::GearTable&)> reload_check;
};

/// A completion to serve (already validated for shape by the API layer).
struct CompletionRequest {
  std::string id;                      ///< request_id, on every log line and event
  std::string prompt;                  ///< text; tokenised with BOS per the tokenizer
  std::vector<int> prompt_tokens;      ///< used instead of `prompt` when not empty
  int max_tokens = 16;
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  int priority = 0;                    ///< higher may go to the larger-TP domain
  /// Text deltas, then one finished event. Called on a domain's thread.
  std::function<void(const struct CompletionEvent&)> on_event;
};

struct CompletionEvent {
  std::string request_id;
  std::string domain_id;
  std::string text;                    ///< new text (may be empty)
  bool finished = false;
  std::string finish_reason;           ///< "stop" | "length" | "error"
  std::string error;
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

class DomainRunner;

/// The daemon's core: the resident weights, the domains of the current
/// gear, the router, the shifter and the live numbers. Thread-safe.
class Service {
 public:
  /// `model` must outlive the service.
  Service(const model::Model& model, ServiceConfig config);
  ~Service();

  /// Builds and starts the domains of the start gear.
  void start();
  /// Stops routing new requests (submit answers 503), lets every in-flight
  /// request finish, stops the domains. Requests still running after
  /// drain_timeout_ms end with an error event. Idempotent.
  void drain_and_stop();
  /// Started, not stopping, and at least one domain serving (a forced drain
  /// of the last one leaves the service alive but not ready).
  bool ready() const { return ready_.load() && serving_domains() > 0; }
  /// Domains in state "serving" whose engine has not failed.
  int serving_domains() const;
  /// The same, not counting the domains named in `ids`.
  int serving_domains_except(const std::vector<std::string>& ids) const;
  bool accepting() const noexcept { return accepting_.load(); }

  const model::Tokenizer& tokenizer() const noexcept { return *tok_; }
  const ServiceConfig& config() const noexcept { return cfg_; }
  int context_length() const noexcept;

  /// Tokenises, validates and routes a request to one serving domain, where
  /// it stays until it finishes. Throws RequestError on bad input or when
  /// the service is not accepting.
  void submit(CompletionRequest request);
  /// Refuses, before any encoding, a prompt text of `bytes` bytes that must
  /// take more tokens than the prompt limit whatever its text
  /// (Tokenizer::max_token_bytes): a 12 MB prompt costs no tokenizer time.
  /// Throws RequestError (400, param "prompt", code context_length_exceeded).
  void check_prompt_bytes(std::size_t bytes) const;
  /// The longest prompt a request may have, in tokens (--max-prompt-tokens,
  /// at most the context - 1).
  int max_prompt_tokens() const noexcept;
  /// Cancels an accepted request whose client has gone: it finishes with
  /// reason "cancelled" at its domain's next step, and its KV pages return.
  /// An unknown or finished id is ignored.
  void cancel(const std::string& request_id);

  /// Progress of a shift, one event per phase step.
  using ShiftProgress = std::function<void(const doc::ShiftEvent&)>;
  struct ShiftOptions {
    std::string to;
    std::string trigger = "manual";
    std::vector<double> ramp;          ///< empty: the config's
    int step_interval_ms = -1;         ///< < 0: the config's
    /// Fault injection for tests: "check" fails the first ramp check.
    std::string inject_fault;
  };
  /// Runs a whole shift on the calling thread (reserve, warm, ramp with
  /// checks, drain, retire; rollback on a failed check or error) and
  /// returns its closing record. Throws ControlError when refused before it
  /// starts: ftp.NoSuchGear, ftp.SameGear, ftp.ShiftInProgress, ftp.NotServing.
  doc::ShiftEvent shift(const ShiftOptions& options, const ShiftProgress& progress);

  /// Drains one domain (no new requests; in-flight ones finish) and retires
  /// it. Refuses the last serving domain unless `force`. Returns the number
  /// of requests it waited for.
  int drain_domain(const std::string& domain_id, bool force, int timeout_ms,
                   const std::function<void(const json::Json&)>& progress);
  /// Domain ids that hold any of the given devices.
  std::vector<std::string> domains_on_devices(const std::vector<std::string>& devices) const;

  /// Reloads the gear table; the current gear must still be in it.
  void reload(doc::GearTable table);

  json::Json status() const;
  json::Json gears_json() const;
  /// The gear table in force (a copy: reload may replace it) and how many
  /// times it was replaced.
  doc::GearTable gear_table() const;
  std::uint64_t gear_table_generation() const noexcept { return table_generation_.load(); }
  json::Json records() const;
  /// The observation of ARCHITECTURE.md from live data: queue depth (now and
  /// its 30 s mean), estimated queue time (mean E2E x queue length), request
  /// rate (last 10 s), mean prompt and output tokens (last 60 s), bubble
  /// ratio of pipelined domains, contention index (share of CPU time taken by
  /// other processes and steal over the last 5 min, from /proc), KV
  /// watermark, TTFT/TPOT/E2E P50/P99 (last 30 s), per-device utilization
  /// (share of time its domain was stepping), the gear and domains.
  doc::Observation observe() const;
  /// Prometheus text exposition of the live numbers.
  std::string prometheus() const;

  std::string current_gear() const;

 private:
  /// The gear table's model shapes against the loaded model; InputError.
  void check_model(const doc::GearTable& table) const;
  /// Retires draining domains left idle by a drain that timed out: called
  /// by shift and drain (under shift_mu_), so that their devices return.
  void reap_drained();
  /// Stops the domains (each once its requests are done), marks them
  /// retired and removes them from domains_.
  void retire(const std::vector<std::shared_ptr<DomainRunner>>& doms);
  /// Release weight mode: the weights of `gear`'s ranks on devices that no
  /// domain uses any more go back to the system (WeightStore::release_rank);
  /// returns the bytes. 0 for a resident gear.
  std::uint64_t release_weights_leaving(const std::string& gear);

  struct Shared;
  std::shared_ptr<DomainRunner> route(const CompletionRequest& r, int prompt_len);
  std::vector<std::shared_ptr<DomainRunner>> build_domains(const doc::Gear& gear, bool slow_start);
  /// KV pages of a domain of `gear` on these stages (ServiceConfig::kv_blocks);
  /// `gpu_room` from gpu_kv_room, or empty: the CPU virtual devices count.
  int kv_blocks_for(const doc::Gear& gear, const doc::Replica& rep, const std::vector<engine::StageLayout>& stages,
                    const std::vector<std::uint64_t>& gpu_room) const;
  /// A device backend's KV room (engine::Backend::kv_room_bytes) for every
  /// rank of the gear's domains at once, so that replicas on one GPU share
  /// it evenly; per domain, per rank (stage by stage). Empty rows where the
  /// backend keeps no device memory (CPU) or --kv-blocks is given.
  std::vector<std::vector<std::uint64_t>> gpu_kv_room(const std::vector<engine::DomainConfig>& domains) const;
  void set_weights(const std::vector<std::shared_ptr<DomainRunner>>& doms, double share);
  bool wait_drained(const std::vector<std::shared_ptr<DomainRunner>>& doms, int timeout_ms);
  std::int64_t now_us() const;  ///< the service's clock since it was made, us
  std::int64_t now_ms() const;

  const model::Model& model_;
  ServiceConfig cfg_;
  std::shared_ptr<const model::Tokenizer> tok_;           // the model's (model::tokenizer_of)
  EndOfGeneration eog_;                                    // computed once: it scans the vocabulary
  std::unique_ptr<engine::WeightStore> store_;            // null with an engine_factory
  engine::Backend* backend_ = nullptr;                    // the real engine's (cfg_.backend)
  /// CPU virtual devices named vd0.. in the gear table: rank threads are
  /// pinned to them and KV pages accounted against their memory budget.
  std::map<std::string, std::unique_ptr<backend::VirtualDevice>> vdevs_;
  std::atomic<bool> ready_{false}, accepting_{false}, stopped_{false};
  std::atomic<std::uint64_t> table_generation_{0};
  std::int64_t t0_us_ = 0;  // cfg_.clock at construction

  mutable std::mutex mu_;                                  // domains_, gear_, counters below
  std::vector<std::shared_ptr<DomainRunner>> domains_;     // warming, serving, draining
  std::string gear_;
  std::mutex shift_mu_;                                    // one shift at a time
  std::atomic<bool> shifting_{false};
  std::vector<doc::ShiftEvent> records_;
  std::uint64_t next_domain_ = 0, next_shift_ = 0;
  std::uint64_t rr_ = 0;

  // Live numbers.
  LatencyWindow ttft_, tpot_, e2e_;
  std::atomic<std::uint64_t> requests_total_{0}, requests_failed_{0}, tokens_in_{0}, tokens_out_{0};
  std::map<std::string, std::uint64_t> shifts_by_outcome_;
  std::deque<std::int64_t> arrivals_;                      // arrival times (ms), last 60 s
  struct Histogram {
    std::vector<std::uint64_t> counts;  // one per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  /// Counts one sample (ms) in a histogram; metrics_mu_ held.
  static void observe_ms(Histogram& h, double ms);
  mutable std::mutex metrics_mu_;                          // hist_, arrivals_, shifts_by_outcome_
  Histogram hist_[3];                                      // ttft, tpot, e2e (ms)
  std::map<std::string, double> credit_;                   // smooth weighted round robin, under mu_
  // Observer state, under metrics_mu_.
  mutable std::deque<std::pair<std::int64_t, double>> depth_samples_;     // (t, queue depth)
  std::deque<std::tuple<std::int64_t, int, int>> finished_;              // (t, prompt, output tokens)
  mutable std::map<std::string, std::pair<std::int64_t, double>> busy_seen_;  // domain -> (t, busy s)
  /// /proc jiffies (all CPUs, busy, this process) at an observation.
  struct CpuSample {
    std::int64_t t_ms;
    std::uint64_t total, busy, self;
  };
  static constexpr std::int64_t kContentionWindowMs = 300000;  ///< the contention index's window, 5 min
  mutable std::deque<CpuSample> cpu_samples_;                   ///< the window's samples, oldest first (metrics_mu_)
};

}  // namespace ftp::serve
