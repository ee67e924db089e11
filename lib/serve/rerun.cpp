// SPDX-License-Identifier: Apache-2.0
#include "serve/rerun.hpp"

namespace ftp::serve {

Reruns::Reruns() : thread_([this] { loop(); }) {}

Reruns::~Reruns() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Reruns::add(Place place, GiveUp give_up, int wait_ms) {
  {
    std::lock_guard lk(mu_);
    items_.push_back(Item{std::move(place), std::move(give_up),
                          std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms)});
    woken_ = true;
  }
  cv_.notify_all();
}

int Reruns::waiting() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(items_.size());
}

void Reruns::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    // Idle with nothing waiting; while requests wait, retry every 50 ms.
    if (items_.empty())
      cv_.wait(lk, [this] { return stop_ || woken_; });
    else
      cv_.wait_for(lk, std::chrono::milliseconds(50), [this] { return stop_ || woken_; });
    woken_ = false;
    // The items out of the lock while they are tried: placing one submits
    // it to a domain, which may deliver events (and add more) at once.
    std::list<Item> batch;
    batch.splice(batch.end(), items_);
    const bool stopping = stop_;
    lk.unlock();
    const auto now = std::chrono::steady_clock::now();
    for (auto it = batch.begin(); it != batch.end();) {
      bool done = false;
      if (stopping) {
        it->give_up("the service is stopping");
        done = true;
      } else if (it->place()) {
        done = true;
      } else if (now >= it->deadline) {
        it->give_up("no other domain took it within the rerun wait");
        done = true;
      }
      it = done ? batch.erase(it) : std::next(it);
    }
    lk.lock();
    items_.splice(items_.begin(), batch);
    if (stopping && items_.empty()) return;
  }
}

}  // namespace ftp::serve
