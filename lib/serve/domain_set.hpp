// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "doc/states.hpp"
#include "serve/domain_runner.hpp"

namespace ftp::serve {

using DomainList = std::vector<std::shared_ptr<DomainRunner>>;

/// The service's live domains (warming, serving, draining) and its current
/// gear: what the router, the shifter and the telemetry share. Retiring a
/// domain stops it (once its requests are done), marks it retired and
/// removes it. Thread-safe.
class DomainSet {
 public:
  /// A fresh domain id: d0, d1, ...
  std::string next_id();
  void add(const DomainList& doms);
  /// Stops each domain (it returns once its requests are done), marks it
  /// retired and removes it from the set.
  void retire(const DomainList& doms);

  DomainList all() const;
  DomainList in_state(doc::DomainState s) const;
  /// Domains serving whose engine has not failed, not counting `except`.
  int serving(const std::vector<std::string>& except = {}) const;
  /// Ids of domains that hold any of `devices`.
  std::vector<std::string> on_devices(const std::vector<std::string>& devices) const;
  std::shared_ptr<DomainRunner> find(const std::string& id) const;
  /// Devices of every domain in the set.
  std::vector<std::string> devices_in_use() const;

  std::string gear() const;
  void set_gear(std::string gear);

 private:
  mutable std::mutex mu_;
  DomainList domains_;
  std::string gear_;
  std::uint64_t next_ = 0;
};

}  // namespace ftp::serve
