// SPDX-License-Identifier: Apache-2.0
#include "comm/pool.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "comm/inproc.hpp"
#include "core/error.hpp"

namespace ftp::comm {

struct InprocPool::State {
  mutable std::mutex mu;
  std::map<Key, std::vector<std::unique_ptr<InprocCommunicator>>> idle;
  std::map<Key, int> made;  // per key, leased or idle
  std::uint64_t created = 0;
  double create_ms = 0;
  bool spanned = false;              // span() was called
  std::vector<std::string> devices;  // span()'s, sorted

  /// Whether the pool keeps communicators of `key` (mu held).
  bool keeps(const Key& key) const {
    if (!spanned) return true;
    return std::all_of(key.begin(), key.end(),
                       [this](const std::string& d) { return std::binary_search(devices.begin(), devices.end(), d); });
  }

  /// One more communicator of `key` (mu held).
  std::unique_ptr<InprocCommunicator> make(const Key& key) {
    const auto t0 = std::chrono::steady_clock::now();
    auto c = std::make_unique<InprocCommunicator>(static_cast<int>(key.size()));
    create_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++created;
    ++made[key];
    return c;
  }
};

InprocPool::InprocPool() : s_(std::make_shared<State>()) {}
InprocPool::~InprocPool() = default;

void InprocPool::span(const std::vector<std::string>& devices) {
  std::vector<std::string> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::lock_guard lk(s_->mu);
  s_->spanned = true;
  s_->devices = std::move(sorted);
  for (auto it = s_->idle.begin(); it != s_->idle.end();) {
    if (s_->keeps(it->first)) {
      ++it;
      continue;
    }
    s_->made[it->first] -= static_cast<int>(it->second.size());
    it = s_->idle.erase(it);
  }
}

std::vector<std::string> InprocPool::devices() const {
  std::lock_guard lk(s_->mu);
  return s_->devices;
}

void InprocPool::prepare(const Key& key, int count) {
  if (key.empty()) throw InputError("communicator pool: a device set of no device");
  std::lock_guard lk(s_->mu);
  while (s_->made[key] < count) s_->idle[key].push_back(s_->make(key));
}

std::shared_ptr<Collective> InprocPool::acquire(const Key& key) {
  if (key.empty()) throw InputError("communicator pool: a device set of no device");
  std::unique_ptr<InprocCommunicator> c;
  {
    std::lock_guard lk(s_->mu);
    auto& free = s_->idle[key];
    if (!free.empty()) {
      c = std::move(free.back());
      free.pop_back();
    } else {
      c = s_->make(key);
    }
  }
  std::weak_ptr<State> pool = s_;
  return std::shared_ptr<Collective>(c.release(), [pool, key](Collective* raw) {
    std::unique_ptr<InprocCommunicator> back(static_cast<InprocCommunicator*>(raw));
    auto s = pool.lock();
    if (!s) return;
    // An aborted one (a failed step) is reset, or dropped where it cannot be.
    const bool usable = !back->aborted() || back->reset();
    std::lock_guard lk(s->mu);
    if (usable && s->keeps(key))
      s->idle[key].push_back(std::move(back));
    else
      --s->made[key];
  });
}

std::uint64_t InprocPool::created() const {
  std::lock_guard lk(s_->mu);
  return s_->created;
}

double InprocPool::create_ms() const {
  std::lock_guard lk(s_->mu);
  return s_->create_ms;
}

std::size_t InprocPool::idle(const Key& key) const {
  std::lock_guard lk(s_->mu);
  auto it = s_->idle.find(key);
  return it == s_->idle.end() ? 0 : it->second.size();
}

}  // namespace ftp::comm
