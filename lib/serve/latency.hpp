// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

namespace ftp::serve {

/// A sliding window of latency samples (ms) with percentiles. Thread-safe.
class LatencyWindow {
 public:
  explicit LatencyWindow(std::size_t capacity = 4096) : cap_(capacity) {}
  void add(double ms, std::int64_t t_ms);
  /// Percentile p (0..100, nearest rank) of the samples taken at or after
  /// since_ms; 0 when there are none.
  double percentile(double p, std::int64_t since_ms = 0) const;
  std::size_t count(std::int64_t since_ms = 0) const;

 private:
  std::size_t cap_;
  mutable std::mutex mu_;
  std::deque<std::pair<std::int64_t, double>> s_;
};

}  // namespace ftp::serve
