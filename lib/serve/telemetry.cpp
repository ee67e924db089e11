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

/// A sample value of the Prometheus text format at full precision: a
/// histogram's _sum grows for as long as the daemon runs.
std::string prom(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

// vLLM's buckets (v1 engine, seconds), so that its dashboards' quantiles
// read the same.
const std::vector<double> kTtftS = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTpotS = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestS = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,    10.0,   15.0,  20.0,
                                       30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
/// A shift phase's duration, seconds.
const std::vector<double> kPhaseS = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

/// vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `most`.
std::vector<double> buckets_1_2_5(int most) {
  std::vector<double> b;
  for (double e = 1;; e *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * e > most) return b;
      b.push_back(m * e);
    }
}

/// vLLM's finished_reason label.
const char* finished_reason(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::length: return "length";
    case engine::FinishReason::cancelled: return "abort";
    case engine::FinishReason::error: return "error";
    default: return "stop";
  }
}

/// The Prometheus text format: families with HELP and TYPE, samples with labels.
class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  /// labels: `k="v"` pairs already joined, e.g. model_name="m",state="x" ("" for none).
  template <class V>
  void sample(std::string_view name, const std::string& labels, V v) {
    out_ << name;
    if (!labels.empty()) out_ << "{" << labels << "}";
    out_ << " " << value(v) << "\n";
  }
  template <class H>
  void histogram(std::string_view name, const std::string& labels, const H& h) {
    std::uint64_t acc = 0;
    const std::string sep = labels.empty() ? "" : labels + ",";
    for (std::size_t b = 0; b < h.bounds.size(); ++b) {
      acc += h.counts[b];
      out_ << name << "_bucket{" << sep << "le=\"" << number_text(h.bounds[b]) << "\"} " << acc << "\n";
    }
    acc += h.counts.back();
    out_ << name << "_bucket{" << sep << "le=\"+Inf\"} " << acc << "\n";
    sample(std::string(name) + "_sum", labels, h.sum);
    sample(std::string(name) + "_count", labels, h.count);
  }
  std::string str() const { return out_.str(); }

 private:
  static std::string value(double v) { return prom(v); }
  static std::string value(std::uint64_t v) { return std::to_string(v); }
  static std::string value(int v) { return std::to_string(v); }
  std::ostringstream out_;
};

/// `k="v"` with v escaped as the text format wants.
std::string label(std::string_view k, std::string_view v) {
  return std::string(k) + "=\"" + backslash_escape(v) + "\"";
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

Telemetry::Telemetry(std::string model_name, int max_model_len)
    : model_name_(std::move(model_name)), ttft_s_(kTtftS), tpot_s_(kTpotS), e2e_s_(kRequestS), queue_s_(kRequestS),
      prompt_tokens_h_(buckets_1_2_5(max_model_len > 0 ? max_model_len : 100000)),
      generation_tokens_h_(buckets_1_2_5(max_model_len > 0 ? max_model_len : 100000)) {}

void Telemetry::Histogram::observe(double v) {
  counts[static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin())]++;
  sum += v;
  ++count;
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
  ttft_s_.observe(ttft_ms / 1000.0);
}

void Telemetry::queued(double queue_ms) {
  std::lock_guard lk(mu_);
  queue_s_.observe(queue_ms / 1000.0);
}

void Telemetry::refused(RefusalReason reason) {
  std::lock_guard lk(mu_);
  ++refused_[reason];
}

void Telemetry::invalid_request() {
  std::lock_guard lk(mu_);
  ++invalid_;
}

void Telemetry::request_finished(std::int64_t t_ms, int prompt_tokens, int output_tokens, double e2e_ms,
                                 std::optional<double> tpot_ms, engine::FinishReason reason) {
  e2e_.add(e2e_ms, t_ms);
  if (tpot_ms) tpot_.add(*tpot_ms, t_ms);
  if (reason == engine::FinishReason::error) ++requests_failed_;
  std::lock_guard lk(mu_);
  finished_.emplace_back(t_ms, prompt_tokens, output_tokens);
  while (!finished_.empty() && std::get<0>(finished_.front()) < t_ms - 60000) finished_.pop_front();
  e2e_s_.observe(e2e_ms / 1000.0);
  if (tpot_ms) tpot_s_.observe(*tpot_ms / 1000.0);
  prompt_tokens_h_.observe(prompt_tokens);
  generation_tokens_h_.observe(output_tokens);
  ++finished_by_reason_[reason];
}

void Telemetry::shift_event(const doc::ShiftEvent& e) {
  std::lock_guard lk(mu_);
  auto [it, fresh] = phase_s_.try_emplace(e.phase, kPhaseS);
  if (e.phase != doc::ShiftPhase::done) it->second.observe(e.phase_ms / 1000.0);
  if (e.phase == doc::ShiftPhase::rollback) ++rollbacks_;
  if (e.phase == doc::ShiftPhase::done && e.outcome) ++shifts_[{*e.outcome, e.trigger}];
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
    o.queued_prompt_tokens += d.queued_prompt_tokens;
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

std::string Telemetry::prometheus(const ServiceSample& svc, const std::vector<DomainSample>& domains) const {
  Exposition m;
  const std::string model = label("model_name", model_name_);
  int running = 0, waiting = 0;
  double kv = 0;
  std::map<doc::DomainState, int> by_state;
  for (auto s : {doc::DomainState::warming, doc::DomainState::serving, doc::DomainState::draining,
                 doc::DomainState::retired})
    by_state[s] = 0;
  std::lock_guard lk(mu_);
  for (const auto& d : domains) {
    running += d.view.running;
    waiting += d.view.waiting;
    kv = std::max(kv, d.kv_usage);
    ++by_state[d.view.state];
    std::uint64_t& seen = preemptions_seen_[d.view.id];
    seen = std::max(seen, d.preemptions);
  }
  std::uint64_t preemptions = 0;
  for (const auto& [id, n] : preemptions_seen_) preemptions += n;

  // vLLM's production metrics.
  m.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  m.sample("vllm:num_requests_running", model, running);
  m.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  m.sample("vllm:num_requests_waiting", model, waiting);
  m.family("vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (the fullest domain). 1 means 100 percent usage.");
  m.sample("vllm:gpu_cache_usage_perc", model, kv);
  m.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage (the fullest domain). 1 means 100 percent usage.");
  m.sample("vllm:kv_cache_usage_perc", model, kv);
  m.family("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.");
  m.sample("vllm:num_preemptions_total", model, preemptions);
  m.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  m.sample("vllm:prompt_tokens_total", model, tokens_in_.load());
  m.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  m.sample("vllm:generation_tokens_total", model, tokens_out_.load());
  m.family("vllm:request_success_total", "counter", "Count of processed requests by finish reason.");
  for (const char* r : {"stop", "length", "abort", "error"}) {
    std::uint64_t n = 0;
    for (const auto& [reason, c] : finished_by_reason_)
      if (std::string_view(finished_reason(reason)) == r) n += c;
    m.sample("vllm:request_success_total", model + "," + label("finished_reason", r), n);
  }
  struct Hist {
    const char* name;
    const char* help;
    const Histogram& h;
  };
  for (const Hist& x : {Hist{"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_s_},
                        Hist{"vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", tpot_s_},
                        Hist{"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_s_},
                        Hist{"vllm:request_queue_time_seconds",
                             "Histogram of time spent waiting in the queue (arrival to first step) in seconds.", queue_s_},
                        Hist{"vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_h_},
                        Hist{"vllm:request_generation_tokens", "Number of generation tokens processed.",
                             generation_tokens_h_}}) {
    m.family(x.name, "histogram", x.help);
    m.histogram(x.name, model, x.h);
  }

  // flextp's own: gears, domains, shifts, admission.
  m.family("flextp:gear_info", "gauge", "The current gear (value 1).");
  m.sample("flextp:gear_info", model + "," + label("gear", svc.gear), 1);
  m.family("flextp:domains", "gauge", "Domains by state.");
  for (const auto& [st, n] : by_state) m.sample("flextp:domains", model + "," + label("state", doc::to_string(st)), n);
  m.family("flextp:devices_leased", "gauge", "Devices held by a domain.");
  m.sample("flextp:devices_leased", model, svc.devices_leased);
  // NVML's GPU signals (a CUDA service): whole-GPU numbers, every process.
  m.family("flextp:gpu_signals_available", "gauge",
           "1 when NVML's GPU signals are read; 0 with the reason (no GPU in the pool, no driver).");
  m.sample("flextp:gpu_signals_available",
           model + (svc.gpu_signals_unavailable.empty() ? "" : "," + label("reason", svc.gpu_signals_unavailable)),
           svc.gpu_signals_unavailable.empty() ? 1 : 0);
  struct GpuGauge {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const doc::GpuLoad&);
  };
  for (const GpuGauge& x : {
           GpuGauge{"flextp:gpu_utilization", "gauge", "Share of time a kernel ran on the GPU (any process), 0..1.",
                    [](const doc::GpuLoad& g) { return g.utilization; }},
           GpuGauge{"flextp:gpu_memory_used_bytes", "gauge", "GPU memory in use (every process and the driver), bytes.",
                    [](const doc::GpuLoad& g) { return static_cast<double>(g.memory_used); }},
           GpuGauge{"flextp:gpu_memory_total_bytes", "gauge", "GPU memory, bytes.",
                    [](const doc::GpuLoad& g) { return static_cast<double>(g.memory_total); }},
           GpuGauge{"flextp:gpu_other_memory_bytes", "gauge", "GPU memory held by other processes, bytes.",
                    [](const doc::GpuLoad& g) { return static_cast<double>(g.other_memory); }},
           GpuGauge{"flextp:gpu_other_compute", "gauge", "SM share of other processes on the GPU, 0..1.",
                    [](const doc::GpuLoad& g) { return g.other_compute; }},
           GpuGauge{"flextp:gpu_other_processes", "gauge", "Other processes with a compute context on the GPU.",
                    [](const doc::GpuLoad& g) { return static_cast<double>(g.other_processes); }},
           GpuGauge{"flextp:gpu_ecc_uncorrected_errors", "gauge", "Volatile uncorrected ECC errors of the GPU.",
                    [](const doc::GpuLoad& g) { return static_cast<double>(g.ecc_uncorrected); }},
           GpuGauge{"flextp:gpu_available", "gauge", "0 when NVML says the GPU is lost or has ECC errors.",
                    [](const doc::GpuLoad& g) { return g.available ? 1.0 : 0.0; }}}) {
    if (svc.gpus.empty()) break;
    m.family(x.name, x.type, x.help);
    for (const auto& g : svc.gpus) m.sample(x.name, model + "," + label("gpu", g.id) + "," + label("uuid", g.uuid), x.value(g));
  }
  m.family("flextp:shifts_total", "counter", "Shifts by outcome and trigger.");
  std::map<doc::ShiftOutcome, bool> any;
  for (const auto& [k, n] : shifts_) {
    m.sample("flextp:shifts_total", model + "," + label("outcome", doc::to_string(k.first)) + "," + label("trigger", k.second), n);
    any[k.first] = true;
  }
  for (auto o : {doc::ShiftOutcome::committed, doc::ShiftOutcome::rolled_back, doc::ShiftOutcome::failed})
    if (!any.count(o))  // every outcome is listed, zero until it happens
      m.sample("flextp:shifts_total", model + "," + label("outcome", doc::to_string(o)) + "," + label("trigger", "manual"), 0);
  m.family("flextp:shift_rollbacks_total", "counter", "Shifts rolled back (a failed ramp check).");
  m.sample("flextp:shift_rollbacks_total", model, rollbacks_);
  m.family("flextp:shift_phase_duration_seconds", "histogram", "Duration of each shift phase in seconds.");
  for (auto p : {doc::ShiftPhase::reserve, doc::ShiftPhase::warm, doc::ShiftPhase::ramp, doc::ShiftPhase::drain,
                 doc::ShiftPhase::retire, doc::ShiftPhase::rollback}) {
    auto it = phase_s_.find(p);
    m.histogram("flextp:shift_phase_duration_seconds", model + "," + label("phase", doc::to_string(p)),
                it == phase_s_.end() ? Histogram(kPhaseS) : it->second);
  }
  m.family("flextp:requests_refused_total", "counter", "Requests refused, by reason (admission control, invalid input).");
  for (RefusalReason r : kRefusalReasons) {
    auto it = refused_.find(r);
    m.sample("flextp:requests_refused_total", model + "," + label("reason", to_string(r)),
             it == refused_.end() ? std::uint64_t{0} : it->second);
  }
  m.sample("flextp:requests_refused_total", model + "," + label("reason", "invalid_request"), invalid_);
  m.family("flextp:requests_total", "counter", "Requests accepted.");
  m.sample("flextp:requests_total", model, requests_total_.load());
  m.family("flextp:requests_failed_total", "counter", "Requests that finished with an error.");
  m.sample("flextp:requests_failed_total", model, requests_failed_.load());
  m.family("flextp:requests_rerun_total", "counter",
           "Requests run again on another domain after theirs failed before they streamed anything.");
  m.sample("flextp:requests_rerun_total", model, requests_rerun_.load());
  m.family("flextp:requests_moved_total", "counter",
           "Requests moved, before they started, off a draining domain to a serving one.");
  m.sample("flextp:requests_moved_total", model, requests_moved_.load());
  return m.str();
}

}  // namespace ftp::serve
