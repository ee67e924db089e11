// SPDX-License-Identifier: Apache-2.0
#include "serve/domain_runner.hpp"

namespace ftp::serve {

DomainRunner::DomainRunner(std::string id, std::string gear, std::vector<std::string> devices,
                           const engine::WeightStore& weights, engine::DomainConfig config)
    : id_(std::move(id)), gear_(std::move(gear)), devices_(std::move(devices)) {
  config.id = id_;
  domain_ = std::make_unique<engine::Domain>(weights, std::move(config));
  thread_ = std::thread([this] { loop(); });
}

DomainRunner::~DomainRunner() { stop(); }

std::string DomainRunner::state() const {
  std::lock_guard lk(mu_);
  return state_;
}

void DomainRunner::set_state(std::string s) {
  std::lock_guard lk(mu_);
  state_ = std::move(s);
}

void DomainRunner::submit(engine::GenerationRequest r) {
  domain_->submit(std::move(r));
  {
    std::lock_guard lk(mu_);
    ++submitted_;
  }
  cv_.notify_all();
}

int DomainRunner::inflight() const { return domain_->running() + domain_->waiting(); }

void DomainRunner::slow_start(int cap, int steps) { domain_->limit_running(cap, steps); }

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
  for (;;) {
    {
      std::unique_lock lk(mu_);
      // Sleep only while there is nothing to do: the data plane never paces itself.
      cv_.wait(lk, [this] { return stop_ || !domain_->idle(); });
      if (stop_ && domain_->idle()) return;
    }
    domain_->step();
  }
}

}  // namespace ftp::serve
