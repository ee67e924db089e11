// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.hpp"

namespace ftp::control {

/// The time source of the control plane. Nothing in lib/control reads the
/// wall clock itself (ARCHITECTURE.md §5, rule 4): the observer stamps each
/// observation with a Clock, and the policies take their time from those
/// stamps, so the same code runs live (SystemClock) and in virtual time
/// (VirtualClock: tests, ftp-plan decide, the simulation).
class Clock {
 public:
  virtual ~Clock() = default;
  /// Milliseconds since an arbitrary, fixed origin; never goes back.
  virtual std::int64_t now_ms() const = 0;
  /// Microseconds since the same origin (phase durations of a shift).
  virtual std::int64_t now_us() const { return now_ms() * 1000; }
  /// Waits until this clock has moved `ms` forward (a shift's ramp steps):
  /// real time on the system clock; on a virtual clock, until another
  /// thread advances it that far.
  virtual void sleep_for_ms(std::int64_t ms) const = 0;
};

/// Monotonic time of this process (std::chrono::steady_clock).
class SystemClock final : public Clock {
 public:
  std::int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::int64_t now_us() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void sleep_for_ms(std::int64_t ms) const override {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
};

/// Time that moves only when told to: hours of traffic replay in
/// milliseconds, deterministically. Reads may come from other threads than
/// the one that moves it (a service under test).
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(std::int64_t start_ms = 0) : now_(start_ms) {}
  std::int64_t now_ms() const override { return now_.load(std::memory_order_acquire); }
  /// Moves time forward by `ms` (>= 0).
  void advance(std::int64_t ms) {
    if (ms < 0) throw Error("VirtualClock::advance: time cannot go back (" + std::to_string(ms) + " ms)");
    {
      std::lock_guard lk(mu_);
      now_.fetch_add(ms, std::memory_order_acq_rel);
    }
    moved_.notify_all();
  }
  /// Sets the time; it may not go back.
  void set(std::int64_t t_ms) {
    const std::int64_t now = now_ms();
    if (t_ms < now)
      throw Error("VirtualClock::set: time cannot go back, " + std::to_string(t_ms) + " ms < " + std::to_string(now) + " ms");
    {
      std::lock_guard lk(mu_);
      now_.store(t_ms, std::memory_order_release);
    }
    moved_.notify_all();
  }
  /// Blocks until advance() or set() has moved the time `ms` past now.
  void sleep_for_ms(std::int64_t ms) const override {
    std::unique_lock lk(mu_);
    const std::int64_t until = now_ms() + std::max<std::int64_t>(ms, 0);
    auto it = wakes_.insert(until);
    moved_.wait(lk, [&] { return now_ms() >= until; });
    wakes_.erase(it);
  }
  /// The earliest time a sleeper waits for, or -1 when none sleeps: a
  /// driver of virtual time (a test, a discrete-event loop) sets the clock
  /// there to wake it.
  std::int64_t next_wake_ms() const {
    std::lock_guard lk(mu_);
    return wakes_.empty() ? -1 : *wakes_.begin();
  }

 private:
  std::atomic<std::int64_t> now_;
  mutable std::mutex mu_;
  mutable std::condition_variable moved_;
  mutable std::multiset<std::int64_t> wakes_;  // sleepers' deadlines
};

}  // namespace ftp::control
