// SPDX-License-Identifier: Apache-2.0
#include "control/predictor.hpp"

#include <algorithm>
#include <cmath>

namespace ftp::control {

Predictor::Predictor(PredictorConfig config) : config_(config) {}

void Predictor::observe(std::int64_t t_ms, double rate) {
  double a = config_.alpha;
  if (n_ == 0) {
    level_ = rate;
    trend_ = 0;
  } else if (t_ms <= last_t_ms_) {
    level_ = a * rate + (1 - a) * level_;
    t_ms = last_t_ms_;
  } else if (static_cast<double>(t_ms - last_t_ms_) > std::max(config_.horizon_s, 60.0) * 1000.0) {
    // A gap longer than the horizon and a minute (the observer stopped, the
    // trace has a hole): the old trend says nothing about now, so start over.
    level_ = rate;
    trend_ = 0;
  } else {
    double dt = static_cast<double>(t_ms - last_t_ms_) / 1000.0;
    if (config_.alpha_period_s > 0) a = 1 - std::pow(1 - config_.alpha, dt / config_.alpha_period_s);
    double prev = level_;
    level_ = std::max(0.0, a * rate + (1 - a) * (level_ + trend_ * dt));  // a rate is never negative
    trend_ = a * (level_ - prev) / dt + (1 - a) * trend_;
  }
  if (!std::isfinite(level_) || !std::isfinite(trend_)) {
    // An extreme rate over a short step overflowed the trend (inf - inf is
    // NaN, and max(0, NaN) is 0): start over from this observation rather
    // than forecast NaN for ever.
    level_ = std::isfinite(rate) ? std::max(0.0, rate) : 0.0;
    trend_ = 0;
    peaks_.clear();
  }
  ++n_;
  last_t_ms_ = t_ms;
  // A monotonic deque of levels: the front is the peak of the window.
  while (!peaks_.empty() && peaks_.back().second <= level_) peaks_.pop_back();
  peaks_.emplace_back(t_ms, level_);
  auto window_ms = static_cast<std::int64_t>(config_.peak_window_s * 1000);
  while (!peaks_.empty() && peaks_.front().first < t_ms - window_ms) peaks_.pop_front();
}

double Predictor::recent_peak() const noexcept {
  if (config_.peak_window_s <= 0 || peaks_.empty()) return level_;
  return std::max(level_, peaks_.front().second);
}

double Predictor::forecast(double horizon_s) const noexcept {
  double ahead = level_ + std::max(trend_, 0.0) * horizon_s;
  return std::max({ahead, recent_peak(), 0.0});
}

}  // namespace ftp::control
