// SPDX-License-Identifier: Apache-2.0
#include "control/capacity.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ftp::control {

double work_rps(const doc::Capacity& c, double rps, double prompt_tokens, double output_tokens) {
  if (!(c.prefill_tokens_s > 0 && c.decode_tokens_s > 0 && c.max_rps > 0)) return rps;
  if (!(prompt_tokens > 0 || output_tokens > 0)) return rps;
  return rps * (prompt_tokens / c.prefill_tokens_s + output_tokens / c.decode_tokens_s) * c.max_rps;
}

CapacityTracker::CapacityTracker(const doc::GearTable& table, CapacityConfig config) : config_(config) {
  for (std::size_t i = 0; i < table.gears.size(); ++i) {
    const doc::Gear& g = table.gears[i];
    const auto& from = g.measured ? g.measured : g.estimated;
    if (!from || from->max_rps <= 0)
      throw InputError("gears[" + std::to_string(i) + "]: gear \"" + g.name +
                       "\" has no measured or estimated capacity (max_rps > 0)");
    doc::Capacity c = *from;
    c.gear = g.name;
    if (c.safe_rps <= 0) c.safe_rps = config_.safe_fraction * c.max_rps;
    // A measured capacity without token rates takes the cost model's, scaled to its max_rps.
    if (!(c.prefill_tokens_s > 0 && c.decode_tokens_s > 0) && g.measured && g.estimated &&
        g.estimated->max_rps > 0) {
      const double scale = c.max_rps / g.estimated->max_rps;
      c.prefill_tokens_s = g.estimated->prefill_tokens_s * scale;
      c.decode_tokens_s = g.estimated->decode_tokens_s * scale;
    }
    caps_[g.name] = c;
  }
}

const doc::Capacity& CapacityTracker::capacity(const std::string& gear) const {
  auto it = caps_.find(gear);
  if (it == caps_.end()) throw InputError("gear: \"" + gear + "\" is not in the gear table");
  return it->second;
}

void CapacityTracker::observe(const doc::Observation& o) {
  if (!started_) {
    started_ = true;
    last_refresh_ms_ = o.t_ms;
  }
  samples_.push_back(Sample{o.t_ms, o.gear, o.request_rate, o.queue_depth_mean, o.queue_depth, o.shifting});
  auto keep_ms = static_cast<std::int64_t>(config_.window_s * 1000);
  while (!samples_.empty() && samples_.front().t_ms < o.t_ms - keep_ms) samples_.pop_front();
}

bool CapacityTracker::refresh(std::int64_t now_ms) {
  if (!started_ || now_ms - last_refresh_ms_ < static_cast<std::int64_t>(config_.refresh_every_s * 1000)) return false;
  last_refresh_ms_ = now_ms;
  auto from_ms = now_ms - static_cast<std::int64_t>(config_.window_s * 1000);
  for (auto& [name, cap] : caps_) {
    std::vector<const Sample*> s;
    for (const auto& x : samples_)
      if (x.gear == name && !x.shifting && x.t_ms >= from_ms) s.push_back(&x);
    if (s.size() < 3) continue;
    double span_s = static_cast<double>(s.back()->t_ms - s.front()->t_ms) / 1000.0;
    // Too little of the window on this gear says nothing about it.
    if (span_s < config_.window_s / 2) continue;
    std::size_t saturated = 0;
    double served_sum = 0, unqueued_peak = 0;
    std::size_t served_n = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i]->queue_mean >= config_.saturation_queue) {
        ++saturated;
        if (i > 0) {
          double dt = static_cast<double>(s[i]->t_ms - s[i - 1]->t_ms) / 1000.0;
          if (dt > 0) {
            served_sum += std::max(0.0, s[i]->rate - (s[i]->queue - s[i - 1]->queue) / dt);
            ++served_n;
          }
        }
      } else {
        unqueued_peak = std::max(unqueued_peak, s[i]->rate);
      }
    }
    double max_rps = cap.max_rps;
    if (2 * saturated >= s.size() && served_n > 0)
      max_rps = served_sum / static_cast<double>(served_n);
    else if (unqueued_peak > cap.max_rps)
      max_rps = unqueued_peak;
    else
      continue;
    if (max_rps <= 0) continue;
    const double tokens_per_req = cap.max_rps > 0 ? cap.max_tokens_s / cap.max_rps : 0;
    const double scale = cap.max_rps > 0 ? max_rps / cap.max_rps : 1;  // before max_rps is replaced
    cap.max_rps = max_rps;
    cap.safe_rps = config_.safe_fraction * max_rps;
    cap.prefill_tokens_s *= scale;
    cap.decode_tokens_s *= scale;
    cap.max_tokens_s = tokens_per_req * max_rps;
    cap.safe_tokens_s = config_.safe_fraction * cap.max_tokens_s;
    cap.source = "live";
    cap.t_ms = now_ms;
    cap.window_s = span_s;
  }
  return true;
}

}  // namespace ftp::control
