// SPDX-License-Identifier: Apache-2.0
#include "serve/latency.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ftp::serve {

void LatencyWindow::add(double ms, std::int64_t t_ms) {
  std::lock_guard lk(mu_);
  s_.emplace_back(t_ms, ms);
  while (s_.size() > cap_) s_.pop_front();
}

double LatencyWindow::percentile(double p, std::int64_t since_ms) const {
  std::vector<double> v;
  {
    std::lock_guard lk(mu_);
    for (const auto& [t, ms] : s_)
      if (t >= since_ms) v.push_back(ms);
  }
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::size_t LatencyWindow::count(std::int64_t since_ms) const {
  std::lock_guard lk(mu_);
  return static_cast<std::size_t>(
      std::count_if(s_.begin(), s_.end(), [&](const auto& x) { return x.first >= since_ms; }));
}

}  // namespace ftp::serve
