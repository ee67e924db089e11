// SPDX-License-Identifier: Apache-2.0
#include "core/number.hpp"
#include "serve/telemetry.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "core/escape.hpp"

namespace ftp::serve {

namespace {

/// Histogram bucket bounds, ms (Prometheus "le").
const std::vector<double> kBoundsMs = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000};

/// A sample value of the Prometheus text format at full precision: a
/// histogram's _sum grows for as long as the daemon runs.
std::string prom(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

/// Jiffies of the whole machine (total, busy) and of this process, from /proc.
bool read_cpu_ticks(std::uint64_t& total, std::uint64_t& busy, std::uint64_t& self) {
  std::ifstream st("/proc/stat");
  std::string cpu;
  std::uint64_t v[10] = {};
  if (!(st >> cpu) || cpu != "cpu") return false;
  for (auto& x : v) st >> x;  // user nice system idle iowait irq softirq steal guest guest_nice
  total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  busy = total - v[3] - v[4];
  std::ifstream ps("/proc/self/stat");
  std::string line;
  std::getline(ps, line);
  auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  self = utime + stime;
  return true;
}

}  // namespace

Telemetry::Telemetry() {
  for (auto& h : hist_) h.counts.assign(kBoundsMs.size() + 1, 0);
}

void Telemetry::observe_ms(Histogram& h, double ms) {
  h.counts[static_cast<std::size_t>(std::lower_bound(kBoundsMs.begin(), kBoundsMs.end(), ms) - kBoundsMs.begin())]++;
  h.sum += ms;
  ++h.count;
}

void Telemetry::request_accepted(std::int64_t t_ms, int prompt_tokens) {
  {
    std::lock_guard lk(mu_);
    arrivals_.emplace_back(t_ms, prompt_tokens);
    while (!arrivals_.empty() && arrivals_.front().first < t_ms - 60000) arrivals_.pop_front();
  }
  ++requests_total_;
  tokens_in_ += static_cast<std::uint64_t>(prompt_tokens);
}

void Telemetry::token(std::int64_t t_ms) {
  ++tokens_out_;
  // Counted per second of the clock: one entry a second, not one a token.
  const std::int64_t second = t_ms / 1000;
  std::lock_guard lk(mu_);
  if (decoded_.empty() || decoded_.back().first < second) decoded_.emplace_back(second, 0);
  ++decoded_.back().second;
  while (decoded_.size() > 1 && decoded_.front().first < second - 11) decoded_.pop_front();
}

void Telemetry::first_token(std::int64_t t_ms, double ttft_ms) {
  ttft_.add(ttft_ms, t_ms);
  std::lock_guard lk(mu_);
  observe_ms(hist_[0], ttft_ms);
}

void Telemetry::request_finished(std::int64_t t_ms, int prompt_tokens, int output_tokens, double e2e_ms,
                                 std::optional<double> tpot_ms, bool failed) {
  e2e_.add(e2e_ms, t_ms);
  if (tpot_ms) tpot_.add(*tpot_ms, t_ms);
  if (failed) ++requests_failed_;
  std::lock_guard lk(mu_);
  finished_.emplace_back(t_ms, prompt_tokens, output_tokens);
  while (!finished_.empty() && std::get<0>(finished_.front()) < t_ms - 60000) finished_.pop_front();
  observe_ms(hist_[2], e2e_ms);
  if (tpot_ms) observe_ms(hist_[1], *tpot_ms);
}

void Telemetry::shift_done(doc::ShiftOutcome outcome) {
  std::lock_guard lk(mu_);
  ++shifts_by_outcome_[outcome];
}

doc::Percentiles Telemetry::e2e_since(std::int64_t since_ms) const {
  return {e2e_.percentile(50, since_ms), e2e_.percentile(99, since_ms)};
}

doc::Observation Telemetry::observe(std::int64_t t_ms, const std::string& gear, bool shifting,
                                    const std::vector<DomainSample>& domains) const {
  doc::Observation o;
  o.t_ms = t_ms;
  o.gear = gear;
  o.shifting = shifting;
  o.ttft_ms = {ttft_.percentile(50, t_ms - 30000), ttft_.percentile(99, t_ms - 30000)};
  o.tpot_ms = {tpot_.percentile(50, t_ms - 30000), tpot_.percentile(99, t_ms - 30000)};
  o.e2e_ms = {e2e_.percentile(50, t_ms - 30000), e2e_.percentile(99, t_ms - 30000)};
  for (const auto& d : domains) {
    o.queue_depth += d.view.waiting;
    o.kv_watermark = std::max(o.kv_watermark, d.kv_usage);
    o.bubble_ratio = std::max(o.bubble_ratio, d.bubble_ratio);
    o.domains.push_back(d.view);
  }
  std::lock_guard lk(mu_);
  std::size_t recent = 0;
  double prompt_tokens = 0;
  for (const auto& [t, p] : arrivals_)
    if (t >= t_ms - 10000) {
      ++recent;
      prompt_tokens += p;
    }
  o.request_rate = static_cast<double>(recent) / 10.0;
  o.prompt_token_rate = prompt_tokens / 10.0;
  // The generated tokens of the last ten whole seconds and this one's part.
  double decoded = 0;
  for (const auto& [s, n] : decoded_)
    if (s * 1000 >= t_ms - 10000) decoded += n;
  o.decode_token_rate = decoded / 10.0;
  depth_samples_.emplace_back(t_ms, o.queue_depth);
  while (!depth_samples_.empty() && depth_samples_.front().first < t_ms - 30000) depth_samples_.pop_front();
  double sum = 0;
  for (const auto& [t, dep] : depth_samples_) sum += dep;
  o.queue_depth_mean = sum / static_cast<double>(depth_samples_.size());
  double p_sum = 0, out_sum = 0, n = 0;
  for (const auto& [t, p, out] : finished_)
    if (t >= t_ms - 60000) {
      p_sum += p;
      out_sum += out;
      ++n;
    }
  if (n > 0) {
    o.mean_prompt_tokens = p_sum / n;
    o.mean_output_tokens = out_sum / n;
  }
  double mean_service_ms = e2e_.count(t_ms - 30000) ? e2e_.percentile(50, t_ms - 30000) : 0;
  o.est_queue_time_ms = mean_service_ms * o.queue_depth;
  // Contention: the share of CPU time taken by other processes (and steal)
  // over the last 5 min (ARCHITECTURE.md section 4), from /proc samples kept
  // at each observation, whoever asked for it.
  std::uint64_t total = 0, cbusy = 0, self = 0;
  if (read_cpu_ticks(total, cbusy, self)) {
    cpu_samples_.push_back(CpuSample{t_ms, total, cbusy, self});
    while (cpu_samples_.size() > 2 && cpu_samples_[1].t_ms <= t_ms - kContentionWindowMs) cpu_samples_.pop_front();
    const CpuSample& a = cpu_samples_.front();
    if (cpu_samples_.size() > 1 && total > a.total) {
      double others = static_cast<double>(cbusy - a.busy) - static_cast<double>(self - a.self);
      o.contention_index = std::clamp(others / static_cast<double>(total - a.total), 0.0, 1.0);
    }
  }
  // Utilization of each device: the share of time its domain was stepping.
  std::set<std::string> live;
  for (const auto& d : domains) {
    live.insert(d.view.id);
    auto [it, fresh] = busy_seen_.emplace(d.view.id, std::make_pair(t_ms, d.busy_s));
    double util = 0;
    if (!fresh && t_ms > it->second.first)
      util = std::clamp((d.busy_s - it->second.second) * 1000.0 / static_cast<double>(t_ms - it->second.first), 0.0, 1.0);
    it->second = {t_ms, d.busy_s};
    for (const auto& dev : d.view.devices) {
      auto x = std::find_if(o.devices.begin(), o.devices.end(), [&](const auto& l) { return l.id == dev; });
      if (x == o.devices.end())
        o.devices.push_back(doc::DeviceLoad{dev, util});
      else
        x->utilization = std::min(1.0, x->utilization + util);
    }
  }
  // Retired domains leave the busy map.
  for (auto it = busy_seen_.begin(); it != busy_seen_.end();) it = live.count(it->first) ? std::next(it) : busy_seen_.erase(it);
  return o;
}

std::string Telemetry::prometheus(const std::string& gear, const std::vector<DomainSample>& domains) const {
  std::ostringstream m;
  int running = 0, waiting = 0;
  double kv = 0;
  std::map<doc::DomainState, int> by_state;
  for (auto s : {doc::DomainState::warming, doc::DomainState::serving, doc::DomainState::draining,
                 doc::DomainState::retired})
    by_state[s] = 0;
  for (const auto& d : domains) {
    running += d.view.running;
    waiting += d.view.waiting;
    kv = std::max(kv, d.kv_usage);
    ++by_state[d.view.state];
  }
  m << "# HELP ftp_requests_running Requests in a running batch.\n# TYPE ftp_requests_running gauge\n"
    << "ftp_requests_running " << running << "\n";
  m << "# HELP ftp_requests_waiting Requests queued in a domain.\n# TYPE ftp_requests_waiting gauge\n"
    << "ftp_requests_waiting " << waiting << "\n";
  m << "# HELP ftp_requests_total Requests accepted.\n# TYPE ftp_requests_total counter\n"
    << "ftp_requests_total " << requests_total_.load() << "\n";
  m << "# HELP ftp_requests_failed_total Requests that finished with an error.\n# TYPE ftp_requests_failed_total counter\n"
    << "ftp_requests_failed_total " << requests_failed_.load() << "\n";
  m << "# HELP ftp_tokens_in_total Prompt tokens.\n# TYPE ftp_tokens_in_total counter\n"
    << "ftp_tokens_in_total " << tokens_in_.load() << "\n";
  m << "# HELP ftp_tokens_out_total Generated tokens.\n# TYPE ftp_tokens_out_total counter\n"
    << "ftp_tokens_out_total " << tokens_out_.load() << "\n";
  m << "# HELP ftp_kv_usage_ratio KV pages in use over the cap (largest domain).\n# TYPE ftp_kv_usage_ratio gauge\n"
    << "ftp_kv_usage_ratio " << kv << "\n";
  m << "# HELP ftp_gear_info The current gear.\n# TYPE ftp_gear_info gauge\n"
    << "ftp_gear_info{gear=\"" << backslash_escape(gear) << "\"} 1\n";
  m << "# HELP ftp_domains Domains by state.\n# TYPE ftp_domains gauge\n";
  // In the order of the names (draining, retired, serving, warming), as before the states were enums.
  std::vector<std::pair<std::string, int>> states;
  for (const auto& [s, n] : by_state) states.emplace_back(std::string(doc::to_string(s)), n);
  std::sort(states.begin(), states.end());
  for (const auto& [s, n] : states) m << "ftp_domains{state=\"" << s << "\"} " << n << "\n";
  std::lock_guard lk(mu_);
  m << "# HELP ftp_shifts_total Shifts by outcome.\n# TYPE ftp_shifts_total counter\n";
  for (auto o : {doc::ShiftOutcome::committed, doc::ShiftOutcome::rolled_back, doc::ShiftOutcome::failed}) {
    auto it = shifts_by_outcome_.find(o);
    m << "ftp_shifts_total{outcome=\"" << doc::to_string(o) << "\"} " << (it == shifts_by_outcome_.end() ? 0 : it->second)
      << "\n";
  }
  const char* names[3] = {"ftp_ttft_seconds", "ftp_tpot_seconds", "ftp_e2e_seconds"};
  const char* helps[3] = {"Time to first token.", "Time per output token after the first.", "End-to-end request latency."};
  for (int i = 0; i < 3; ++i) {
    const Histogram& h = hist_[i];
    m << "# HELP " << names[i] << " " << helps[i] << "\n# TYPE " << names[i] << " histogram\n";
    std::uint64_t acc = 0;
    for (std::size_t b = 0; b < kBoundsMs.size(); ++b) {
      acc += h.counts[b];
      m << names[i] << "_bucket{le=\"" << number_text(kBoundsMs[b] / 1000.0) << "\"} " << acc << "\n";
    }
    acc += h.counts.back();
    m << names[i] << "_bucket{le=\"+Inf\"} " << acc << "\n";
    m << names[i] << "_sum " << prom(h.sum / 1000.0) << "\n" << names[i] << "_count " << h.count << "\n";
  }
  return m.str();
}

}  // namespace ftp::serve
