// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>

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
};

/// Monotonic time of this process (std::chrono::steady_clock).
class SystemClock final : public Clock {
 public:
  std::int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

/// Time that moves only when told to: hours of traffic replay in
/// milliseconds, deterministically.
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(std::int64_t start_ms = 0) : now_(start_ms) {}
  std::int64_t now_ms() const override { return now_; }
  /// Moves time forward by `ms` (>= 0).
  void advance(std::int64_t ms) {
    if (ms < 0) throw Error("VirtualClock::advance: time cannot go back (" + std::to_string(ms) + " ms)");
    now_ += ms;
  }
  /// Sets the time; it may not go back.
  void set(std::int64_t t_ms) {
    if (t_ms < now_)
      throw Error("VirtualClock::set: time cannot go back, " + std::to_string(t_ms) + " ms < " + std::to_string(now_) + " ms");
    now_ = t_ms;
  }

 private:
  std::int64_t now_;
};

}  // namespace ftp::control
