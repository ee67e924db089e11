// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ftp::comm {

/// The key-value store that Gloo groups meet through (each member writes
/// its address under its rank and reads its peers'). In a service the
/// leader serves it over the member channel (member/store.hpp); LocalStore
/// is the in-process one (ranks that are threads of one process, tests).
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  /// The value of `key`, waiting for it up to `timeout`; throws
  /// ftp::Error naming the key when it does not come.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

/// A RendezvousStore in this process's memory. Thread-safe.
class LocalStore final : public RendezvousStore {
 public:
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  /// Without waiting: false where `key` is not set.
  bool try_get(const std::string& key, std::vector<char>& value) const;
  /// Forgets the keys that start with `prefix` (a retired group's).
  void erase_prefix(const std::string& prefix);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> kv_;
};

}  // namespace ftp::comm
