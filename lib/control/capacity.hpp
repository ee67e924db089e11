// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "doc/control.hpp"
#include "doc/gear_table.hpp"

namespace ftp::control {

/// Parameters of the capacity tracker (policy config section "capacity").
struct CapacityConfig {
  double safe_fraction = 0.8;      ///< safe = safe_fraction x max
  double refresh_every_s = 600;    ///< how often capacities are recomputed from live data, s
  double window_s = 300;           ///< span of live data a refresh looks at, s
  double saturation_queue = 4;     ///< queue_depth_mean (requests) at which a gear counts as saturated
};

/// The request rate at the gear's own reference mix that takes as much of
/// the gear as `rps` requests/s of `prompt_tokens` prompt and
/// `output_tokens` output tokens each: rps x (prompt / prefill_tokens_s +
/// output / decode_tokens_s) x max_rps. Load in work, comparable with
/// safe_rps whatever the mix. `rps` itself when the capacity has no token
/// rates or the mix is unknown (both lengths 0).
double work_rps(const doc::Capacity& c, double rps, double prompt_tokens, double output_tokens);

/// The capacity of every gear of a table, as the controller plans with it.
///
/// It starts from the table: a gear's `measured` capacity (ftp-gear-bench)
/// when there is one, else its `estimated` one (the cost model), with
/// safe = safe_fraction x max where the table gives no safe value. Every
/// `refresh_every_s` it looks at the observations of the last `window_s`,
/// per gear, leaving out those taken while shifting:
///
/// * at least half of them saturated (queue_depth_mean >= saturation_queue):
///   the gear ran at its max, so max = mean served rate of the saturated
///   samples, served = arrivals - d(queue_depth)/dt;
/// * otherwise max can only go up: when the gear served a higher rate
///   without a queue than its max says, max = that rate.
///
/// A refresh scales the token rates (max_tokens_s, prefill_tokens_s,
/// decode_tokens_s) with max_rps. A refreshed capacity has source "live", t_ms the refresh time and
/// window_s the span of data it used. Time is the observations' t_ms.
class CapacityTracker {
 public:
  /// Throws ftp::InputError ("gears[1]: no measured or estimated capacity")
  /// when a gear has no capacity to start from.
  CapacityTracker(const doc::GearTable& table, CapacityConfig config = {});

  /// The gear's current capacity; throws ftp::InputError for an unknown gear.
  const doc::Capacity& capacity(const std::string& gear) const;
  const std::map<std::string, doc::Capacity>& all() const noexcept { return caps_; }

  /// Records one observation (its gear, rate, queue, time).
  void observe(const doc::Observation& o);
  /// Recomputes capacities when refresh_every_s has passed since the last
  /// refresh (or since the first observation). True when it ran.
  bool refresh(std::int64_t now_ms);

  const CapacityConfig& config() const noexcept { return config_; }

 private:
  struct Sample {
    std::int64_t t_ms;
    std::string gear;
    double rate, queue_mean, queue;
    bool shifting;
  };
  CapacityConfig config_;
  std::map<std::string, doc::Capacity> caps_;
  std::deque<Sample> samples_;
  std::int64_t last_refresh_ms_ = 0;
  bool started_ = false;
};

}  // namespace ftp::control
