// SPDX-License-Identifier: Apache-2.0
#include "serve/domain_runner.hpp"

#include "hardware/cpu/virtual_device.hpp"

#include <algorithm>
#include <chrono>

namespace ftp::serve {

DomainRunner::DomainRunner(std::string id, std::string gear, std::vector<std::string> devices,
                           const model::HParams& hp, engine::DomainConfig config,
                           const engine::Domain::EngineFactory& make, StepObserver observe,
                           const engine::WarmUpPlan& warm)
    : id_(std::move(id)), gear_(std::move(gear)), devices_(std::move(devices)), observe_(std::move(observe)) {
  config.id = id_;
  domain_ = std::make_unique<engine::Domain>(hp, std::move(config), make);
  // On this thread, before the domain's: nothing else steps it yet.
  if (!warm.batch_sizes.empty() || warm.prefill_tokens > 0) warmed_ = domain_->warm_up(warm);
  thread_ = std::thread([this] { loop(); });
}

DomainRunner::~DomainRunner() { stop(); }

bool DomainRunner::submit(engine::GenerationRequest&& r) {
  {
    // Under mu_: loop() decides to end under it too, so a request queued
    // here is one the thread sees before it can end.
    std::lock_guard lk(mu_);
    if (stop_ || !domain_->failure().empty()) return false;
    domain_->submit(std::move(r));
    ++submitted_;
  }
  cv_.notify_all();
  return true;
}

void DomainRunner::cancel(const std::string& request_id) {
  domain_->cancel(request_id);
  cv_.notify_all();
}

void DomainRunner::abort_all(const std::string& why) {
  domain_->abort_all(why);
  cv_.notify_all();
}

void DomainRunner::withdraw_unstarted() {
  domain_->withdraw_unstarted();
  cv_.notify_all();
}

int DomainRunner::inflight() const { return domain_->running() + domain_->waiting(); }

void DomainRunner::slow_start(int cap, int steps) { domain_->limit_running(cap, steps); }

void DomainRunner::set_background() {
  domain_->set_background();
  background_ = true;
  cv_.notify_all();
}

void DomainRunner::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DomainRunner::loop() {
  bool lowered = false;
  for (;;) {
    if (background_ && !lowered) {
      hardware::lower_current_thread_priority(10);  // best effort, as the engine's ranks
      lowered = true;
    }
    {
      std::unique_lock lk(mu_);
      // Sleep only while there is nothing to do: the data plane never paces itself.
      cv_.wait(lk, [this] { return stop_ || !domain_->idle(); });
      if (stop_ && domain_->idle()) return;
    }
    auto t0 = std::chrono::steady_clock::now();
    int done = domain_->step();
    const auto t1 = std::chrono::steady_clock::now();
    busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    if (observe_) observe_(id_, t0, t1, done);
    auto stages = done > 0 ? domain_->stage_busy_s() : std::vector<double>{};
    {
      // Under mu_, so that a wait_idle that just found work left is already
      // waiting when it is told.
      std::lock_guard lk(mu_);
      if (done > 0) last_stage_busy_ = std::move(stages);
    }
    idle_cv_.notify_all();
  }
}

bool DomainRunner::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  return idle_cv_.wait_until(lk, deadline, [this] { return domain_->idle(); });
}

double DomainRunner::bubble_ratio() const {
  std::lock_guard lk(mu_);
  if (last_stage_busy_.size() < 2) return 0;
  auto [mn, mx] = std::minmax_element(last_stage_busy_.begin(), last_stage_busy_.end());
  return *mx > 0 ? (*mx - *mn) / *mx : 0;
}

}  // namespace ftp::serve
