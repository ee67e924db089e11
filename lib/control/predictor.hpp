// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <utility>

namespace ftp::control {

/// Parameters of the load predictor (policy config section "predictor").
struct PredictorConfig {
  double alpha = 0.25;         ///< EWMA weight of the newest sample, (0, 1]
  double horizon_s = 45;       ///< how far ahead the forecast looks, s (design: 30-60 s)
  double peak_window_s = 60;   ///< how long a recent peak of the level is remembered, s; 0: no peak memory
  /// ours: the spacing of samples `alpha` is the weight for, s: a sample dt
  /// after the last weighs 1 - (1 - alpha)^(dt / alpha_period_s), so that
  /// observations 1 s or 10 s apart give the same dynamics in time (the
  /// EWMA's time constant is -alpha_period_s / ln(1 - alpha): 35 s for
  /// 0.25 and 10 s); 0 (the default here; the gear shifter's policy config
  /// sets 10): alpha per sample, whatever their spacing
  double alpha_period_s = 0;
};

/// Request-rate forecast: an EWMA level with a trend (Holt's linear method,
/// both smoothed with a weight a) and a recent-peak memory:
///
///   a = 1 - (1 - alpha)^(dt / alpha_period_s)    (alpha_period_s 0: a = alpha)
///   level_k = a x rate_k + (1 - a) x (level_{k-1} + trend_{k-1} x dt)
///   trend_k = a x (level_k - level_{k-1}) / dt + (1 - a) x trend_{k-1}      (per second)
///   forecast = max(level + max(trend, 0) x horizon_s, max of level over the last peak_window_s)
///
/// The level is clamped at 0; after a gap longer than horizon_s (and than
/// 60 s) the level restarts at the new rate with no trend.
///
/// Only a rising trend is projected (a falling one is left to the level), and
/// the peak memory keeps the forecast up for a while after a burst, so that a
/// lull between bursts does not look like the end of the load. Times come from
/// the caller (observation stamps), never from a clock read here.
class Predictor {
 public:
  explicit Predictor(PredictorConfig config = {});

  /// Feeds one sample: arrivals in requests/s at time t_ms. Samples at the
  /// same or an earlier time than the last one update the level only.
  void observe(std::int64_t t_ms, double rate);

  bool empty() const noexcept { return n_ == 0; }
  /// Smoothed current rate, requests/s.
  double level() const noexcept { return level_; }
  /// Smoothed slope, requests/s per s.
  double trend() const noexcept { return trend_; }
  /// Highest level within the peak window, requests/s.
  double recent_peak() const noexcept;
  /// Forecast `horizon_s` ahead, requests/s.
  double forecast() const noexcept { return forecast(config_.horizon_s); }
  /// Forecast `horizon_s` ahead, with the peak memory.
  double forecast(double horizon_s) const noexcept;

  const PredictorConfig& config() const noexcept { return config_; }

 private:
  PredictorConfig config_;
  long n_ = 0;
  std::int64_t last_t_ms_ = 0;
  double level_ = 0, trend_ = 0;
  std::deque<std::pair<std::int64_t, double>> peaks_;  ///< (t_ms, level), levels decreasing
};

}  // namespace ftp::control
