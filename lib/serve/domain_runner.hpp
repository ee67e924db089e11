// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "doc/states.hpp"
#include "engine/domain.hpp"
#include "serve/latency.hpp"

namespace ftp::serve {

/// One running domain of the daemon: an engine::Domain stepped by its own
/// thread whenever it has work, with the state, devices and router weight
/// the control plane reads. States: warming -> serving -> draining -> retired.
class DomainRunner {
 public:
  /// Told of each step the domain's thread ran: the domain's id, when the
  /// step began and ended, and the tokens it computed (diagnostics:
  /// shift-bench's trace of its slowest samples). Runs on the domain's
  /// thread; keep it short.
  using StepObserver = std::function<void(const std::string& domain, std::chrono::steady_clock::time_point begin,
                                          std::chrono::steady_clock::time_point end, int tokens)>;

  /// Builds the domain with `make` (engine::Domain: the real engine, the
  /// simulated one, ...), then runs `warm` on it (engine::Domain::warm_up)
  /// before its thread starts, so that no step of the warm-up reaches the
  /// observer or the busy time; warmed() tells what it ran. A warm-up that
  /// fails throws its ftp::Error from here.
  DomainRunner(std::string id, std::string gear, std::vector<std::string> devices, const model::HParams& hp,
               engine::DomainConfig config, const engine::Domain::EngineFactory& make, StepObserver observe = {},
               const engine::WarmUpPlan& warm = {});
  ~DomainRunner();
  DomainRunner(const DomainRunner&) = delete;
  DomainRunner& operator=(const DomainRunner&) = delete;

  const std::string& id() const noexcept { return id_; }
  const std::string& gear() const noexcept { return gear_; }
  const std::vector<std::string>& devices() const noexcept { return devices_; }
  /// What the warm-up ran before the domain's thread started.
  const engine::WarmUpResult& warmed() const noexcept { return warmed_; }

  doc::DomainState state() const noexcept { return state_.load(); }
  void set_state(doc::DomainState s) noexcept { state_.store(s); }
  /// Serving and its engine has not failed: the router may use it.
  bool serving() const { return state() == doc::DomainState::serving && domain_->failure().empty(); }
  /// Tensor-parallel degree of its first stage (the router's largest-TP rule).
  int tp() const noexcept { return domain_->config().stages.front().tp; }
  /// Router weight (share of new requests), 0..1.
  double weight() const noexcept { return weight_.load(); }
  void set_weight(double w) noexcept { weight_.store(w); }

  /// Queues a request on the domain (engine::Domain::submit) and wakes its
  /// thread. Returns false, leaving `r` as it was, once stop() has begun or
  /// the engine has failed (engine::Engine::failure): a request routed to a
  /// domain that retires before it arrives goes to another one instead of
  /// waiting on a thread that has ended.
  bool submit(engine::GenerationRequest&& r);
  /// Cancels a request this domain may hold (engine::Domain::cancel) and wakes its thread.
  void cancel(const std::string& request_id);
  /// Ends every request the domain holds with an error (engine::Domain::abort_all) and wakes its thread.
  void abort_all(const std::string& why);
  /// Gives back the requests that have not started (engine::Domain::withdraw_unstarted)
  /// and wakes its thread: for a drain while other domains serve.
  void withdraw_unstarted();
  /// Requests running or waiting, including ones submitted but not yet stepped.
  int inflight() const;
  engine::Domain& domain() noexcept { return *domain_; }
  const engine::Domain& domain() const noexcept { return *domain_; }

  /// Batch cap for the first steps of a new domain (slow start): the running
  /// batch is limited to `cap` sequences for `steps` steps.
  void slow_start(int cap, int steps);
  /// Counts failed requests (FinishReason::error) seen on this domain.
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> served{0};
  /// E2E latency of requests finished on this domain (ramp checks).
  LatencyWindow e2e;

  /// Seconds this domain's thread has spent stepping, since it started.
  double busy_s() const noexcept { return busy_ns_.load() * 1e-9; }
  /// Spread of the pipeline stages' busy time in the last step against the
  /// slowest stage, (max - min) / max; 0 for one stage.
  double bubble_ratio() const;

  /// Waits until the domain has no request running or waiting, or until
  /// `deadline`; true when it is idle. Woken after every step, no polling.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);

  /// A domain that drains beside the one replacing it (a shift's old
  /// domain, a rolled-back shadow, ftp-drain's target) runs its remaining
  /// steps at a lower CPU priority -- its thread and its engine's ranks --
  /// so that the serving domain's first tokens are not held up by
  /// decodes that are only finishing. Not undone.
  void set_background();

  /// Stops the thread after the work in hand; the domain keeps its requests.
  void stop();

 private:
  void loop();
  std::string id_, gear_;
  std::vector<std::string> devices_;
  std::unique_ptr<engine::Domain> domain_;
  engine::WarmUpResult warmed_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  // after each step (wait_idle)
  std::atomic<doc::DomainState> state_{doc::DomainState::warming};
  std::atomic<double> weight_{0.0};
  std::atomic<int> submitted_{0};
  std::atomic<std::int64_t> busy_ns_{0};
  std::atomic<bool> background_{false};
  std::vector<double> last_stage_busy_;  // under mu_
  StepObserver observe_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ftp::serve
