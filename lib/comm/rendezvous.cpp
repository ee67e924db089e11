// SPDX-License-Identifier: Apache-2.0
#include "comm/rendezvous.hpp"

#include "core/error.hpp"

namespace ftp::comm {

void LocalStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard lk(mu_);
    kv_[key] = value;
  }
  cv_.notify_all();
}

std::vector<char> LocalStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return kv_.count(key) > 0; }))
    throw Error("rendezvous: key \"" + key + "\" not set within " + std::to_string(timeout.count()) + " ms");
  return kv_.at(key);
}

bool LocalStore::try_get(const std::string& key, std::vector<char>& value) const {
  std::lock_guard lk(mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  value = it->second;
  return true;
}

void LocalStore::erase_prefix(const std::string& prefix) {
  std::lock_guard lk(mu_);
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.compare(0, prefix.size(), prefix) == 0;)
    it = kv_.erase(it);
}

}  // namespace ftp::comm
