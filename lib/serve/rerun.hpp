// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace ftp::serve {

/// The requests of a failed domain that had streamed nothing yet, waiting
/// to run again on another domain (issue 16: a member lost under them).
/// Each is placed as soon as some domain takes it (`place` returns true),
/// or given up after its wait (`give_up` with why), so none waits longer
/// than the service's rerun wait (ServiceConfig::rerun_wait_ms). One
/// thread tries them: at once when one is added, then every 50 ms (a
/// domain may start serving: a shift, ftp-serve --auto). Thread-safe.
class Reruns {
 public:
  using Place = std::function<bool()>;
  using GiveUp = std::function<void(const std::string& why)>;

  Reruns();
  /// Gives up every request still waiting ("the service is stopping").
  ~Reruns();
  Reruns(const Reruns&) = delete;
  Reruns& operator=(const Reruns&) = delete;

  /// Waits up to `wait_ms` for a domain that takes the request.
  void add(Place place, GiveUp give_up, int wait_ms);
  /// Requests waiting now.
  int waiting() const;

 private:
  struct Item {
    Place place;
    GiveUp give_up;
    std::chrono::steady_clock::time_point deadline;
  };
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Item> items_;
  bool stop_ = false, woken_ = false;
  std::thread thread_;
};

}  // namespace ftp::serve
