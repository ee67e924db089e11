// SPDX-License-Identifier: Apache-2.0
#include "sim/engine_replay.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <queue>

#include "control/router.hpp"
#include "core/error.hpp"
#include "doc/kinds.hpp"
#include "engine/domain.hpp"
#include "plan/planner.hpp"
#include "sim/simulated_engine.hpp"

namespace ftp::sim {

int kv_pages_for(const plan::ModelShape& m, const doc::Topology& topo, const doc::Gear& gear, const doc::Replica& rep,
                 int block_tokens, int max_running) {
  plan::Workload w;
  w.max_batched_tokens = gear.max_batched_tokens;
  const double ctx = m.context_length;
  double pages = std::ceil(static_cast<double>(max_running) * ctx / block_tokens);
  for (std::size_t i = 0; i < rep.stages.size(); ++i) {
    const auto& st = rep.stages[i];
    const plan::StageSpan span{st.n_layers, st.first_layer == 0, st.first_layer + st.n_layers == m.n_layers};
    const plan::GroupPerf g = plan::group_perf(topo, st.devices);
    const plan::StageMemory mem = plan::stage_memory(m, span, g, w, 0, 0);
    const double room = gear.kv_cache_cap * std::max(0.0, double(g.memory_bytes) - mem.weights - mem.activations);
    const double per_page = double(block_tokens) * st.n_layers * m.kv_bytes_per_token_layer(g.tp);
    pages = std::min(pages, per_page > 0 ? std::floor(room / per_page) : pages);
    if (pages < 1)
      throw InputError("gear " + gear.name + ": stages[" + std::to_string(i) + "] on " + st.devices.front() +
                       " has no room for one KV page once its weights and activations are there");
  }
  return static_cast<int>(std::min(pages, 1e9));
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSampleS = 1;         // queue-depth samples, s
constexpr double kRateWindowS = 10;    // request_rate over this, s (as the daemon)
constexpr double kLatencyWindowS = 30; // TTFT/TPOT/E2E percentiles over this, s
constexpr double kQueueWindowS = 30;   // queue_depth_mean over this, s
constexpr double kMixWindowS = 60;     // mean prompt and output tokens over this, s

/// The scheduler's request group (engine::GenerationRequest::group) of
/// every request of the replay, the warm-ups' too. A trace names no
/// clients; with one group the fairness rules have nothing to share out
/// and the schedule is the one of a group per request (each holds one
/// sequence, never over its cap: admission in arrival order, the newest
/// preempted first), but the scheduler's per-step maps of groups hold one
/// entry instead of one per running sequence (a third of the replay's
/// time on the 512-GPU case of simulate-bench).
constexpr const char* kGroup = "replay";

double round3(double x) { return std::round(x * 1000) / 1000; }

/// Nearest-rank quantile; 0 for no samples. Reorders v.
double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  k = std::clamp<std::size_t>(k, 1, v.size()) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

/// P50 and P99 (nearest rank; 0 for no samples) in one pass and one over
/// the upper part: the values quantile() gives for each. Reorders v.
doc::Percentiles p50_p99(std::vector<double>& v) {
  if (v.empty()) return {0, 0};
  const auto n = static_cast<double>(v.size());
  auto rank = [&](double q) { return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(q * n)), 1, v.size()) - 1; };
  const std::size_t k50 = rank(0.5), k99 = rank(0.99);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k50), v.end());
  // Everything past k50 is at least v[k50]: the k99-th smallest is among them.
  if (k99 > k50)
    std::nth_element(v.begin() + static_cast<std::ptrdiff_t>(k50) + 1, v.begin() + static_cast<std::ptrdiff_t>(k99), v.end());
  return {v[k50], v[k99]};
}

json::Json pct(std::vector<double>& ms) {
  const doc::Percentiles p = p50_p99(ms);
  return {{"p50", round3(p.p50)}, {"p99", round3(p.p99)}};
}

double gear_max_rps(const doc::Gear& g) {
  const auto& cap = g.measured ? g.measured : g.estimated;
  return cap ? cap->max_rps : 0;
}

/// A sliding window of (time, value) samples.
struct Window {
  std::deque<std::pair<double, double>> s;
  void add(double t, double v) { s.emplace_back(t, v); }
  void trim(double from) {
    while (!s.empty() && s.front().first < from) s.pop_front();
  }
  std::vector<double> values() const {
    std::vector<double> v;
    v.reserve(s.size());
    for (const auto& [t, x] : s) v.push_back(x);
    return v;
  }
};

using State = doc::DomainState;

struct Req {
  double arrival = 0, first = -1, done = -1;
  int prompt = 0, output = 0, generated = 0;
  int dom = -1;  // the domain whose token backlog counts it until its first token
  bool failed = false;
};

struct SimDomain {
  std::string id;
  int gear = 0;
  State state = State::warming;
  std::unique_ptr<engine::Domain> dom;
  SimulatedEngine* eng = nullptr;          // owned by dom
  std::vector<int> devs;                    // device indices
  double weight = 0;                        // router share
  double capacity_rps = 0;                  // plan::estimate_replica at the trace's mix
  /// Requests routed here that the Domain does not hold yet: it is given
  /// only what a step could admit (running + waiting up to max_running),
  /// the rest waits here in arrival order, so a backlog of millions costs
  /// no prompts in memory and the scheduler's per-step work stays linear in
  /// the batch. The Domain admits from the front of its queue, at most
  /// max_running - running, preempted sequences first; each request is a
  /// group of its own, so its fairness rule never preempts. So its
  /// schedule is the same as with everything submitted at once.
  std::deque<int> backlog;
  double backlog_prompt = 0;                // prompt tokens routed here and not yet at their first token
  bool scheduled = false;                   // has an entry in the step heap
  double free_at = 0;                       // end of its last step, s
  double busy_s = 0;                        // stepping, total
  double busy_seen_s = 0;                   // busy_s at the last observation
  double bubble = 0;                        // of its last step
  engine::DomainStats seen;                 // counters at its last step
  std::uint64_t errors = 0;
  bool warmed = false;
  std::vector<std::pair<double, double>> e2e;  // (finish s, E2E ms) while a ramp watches it
  std::vector<int> waiters;                 // domains waiting behind this one's device claim
};

class EngineReplay {
 public:
  EngineReplay(const control::Trace& trace, control::Policy& policy, const std::string& spec, const doc::GearTable& table,
               const control::ReplayConfig& rc, const EngineReplayConfig& ec,
               const std::function<void(const json::Json&)>& emit)
      : trace_(trace), policy_(policy), spec_(spec), table_(table), rc_(rc), ec_(ec), emit_(emit) {}

  json::Json run(const std::string& start_gear);

 private:
  struct Shift {
    enum class Phase { reserve, warm, ramp, drain } phase = Phase::reserve;
    int from = 0, to = 0;
    double next = kInf;              // time of its next phase step, s
    double warm_until = 0;
    std::size_t ramp_i = 0;
    double step_start = 0;
    double baseline_p99 = 0;         // E2E P99 of the last 60 s before it, ms
    std::vector<int> fresh, old;
    std::vector<int> reserved;       // device indices held by the reservation
    bool rolled_back = false;
    std::vector<double> ramp;        // its traffic shares on the new domains
    double ramp_step_s = 0;          // its wait at each step before the check, s
  };

  // --- set-up
  void load_slice();
  int build_domain(int gear, const doc::Replica& rep, double t, bool slow_start);
  // --- time
  void hold_devices(const std::vector<int>& devs, int delta, double t);
  void account_devices(double t);
  // --- data plane
  void arrive(int i, double t);
  /// Routes request i to a serving domain's backlog (false: none serves).
  bool place(int i, double t);
  /// As the daemon's drain (issue 20): a draining domain gives back what
  /// has not started, to the serving domains.
  void withdraw_unstarted(int di, double t);
  int route(const Req& r);
  // Every change of a domain's weight or state goes through these: they
  // mark the router's candidates stale.
  void set_weight(int di, double w);
  void set_state(int di, State s);
  void set_shares(const std::vector<int>& doms, double share);
  void schedule(int di, double t);
  void feed(SimDomain& d, double t);
  void step(int di, double t);
  void release_claims(int di);
  void wake_waiters(int di, double t);
  void on_event(int req, const engine::GenerationEvent& e);
  void finish_request(Req& r, double t);
  bool has_work(const SimDomain& d) const { return !d.backlog.empty() || !d.dom->idle(); }
  void maybe_retire(int di, double t);
  // --- control plane
  /// Starts a shift to gear `to` with the ramp and step wait of its decision.
  void start_shift(int to, double t, std::vector<double> ramp, double ramp_step_s);
  void advance_shift(double t);
  void apply_share(double share);
  void end_shift();
  void sample(double t);
  void observe(double t);
  void interval(double t);

  const control::Trace& trace_;
  control::Policy& policy_;
  const std::string& spec_;
  const doc::GearTable& table_;
  const control::ReplayConfig& rc_;
  const EngineReplayConfig& ec_;
  const std::function<void(const json::Json&)>& emit_;

  // The slice in virtual time.
  std::vector<Req> reqs_;
  double span_s_ = 0, mean_prompt_ = 0, mean_output_ = 0;

  // Devices.
  std::map<std::string, int> dev_index_;
  std::vector<std::string> dev_names_;
  std::vector<double> dev_free_, dev_busy_, dev_busy_seen_;
  std::vector<int> dev_refs_;
  std::vector<int> claim_;   // the domain waiting for each device, or -1
  int held_ = 0;
  double held_since_ = 0, gpu_s_ = 0, held_iv_s_ = 0, busy_iv_s_ = 0, busy_carry_s_ = 0, busy_total_s_ = 0,
         held_total_s_ = 0;
  double next_int_ = 0;  // end of the current interval, s

  // Domains.
  std::vector<SimDomain> doms_;
  int next_domain_ = 0;
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  SimDomain* cur_ = nullptr;  // the domain stepping (its events' time is its engine's)
  int gear_ = 0;
  int token_ = 0;             // the one token id of prompts and outputs
  control::Router router_;
  std::vector<int> cand_doms_;  // the domain of each of the router's candidates
  bool cands_stale_ = true;

  // Shifts.
  std::optional<Shift> shift_;
  /// A decided shift not yet started: its gear, not-before time (s), and
  /// the decision's own ramp and step wait (empty, < 0: the config's).
  struct PendingShift {
    int to;
    double not_before;
    std::vector<double> ramp;
    double ramp_step_s;
  };
  std::optional<PendingShift> pending_;
  int shifts_ = 0, rollbacks_ = 0, decisions_ = 0, iv_shifts_ = 0;
  std::map<int, double> gear_time_;
  double gear_since_ = 0;

  // Live windows for observations.
  Window arrivals_w_, finished_w_prompt_, finished_w_output_, ttft_w_, tpot_w_, e2e_w_, queue_w_, e2e_60_w_;
  Window decode_w_;           // (step end, tokens generated)
  double obs_last_ = 0;

  // Interval and run accumulators.
  struct Acc {
    double arrivals = 0, finished = 0, attained = 0, prompt_tokens = 0, decode_tokens = 0, preemptions = 0;
    std::vector<double> ttft, tpot, e2e;
  } iv_;
  double iv_start_ = 0;
  double total_prompt_ = 0, total_decode_ = 0, total_preempt_ = 0, attained_ = 0, finished_ = 0, rejected_ = 0;
  double kv_sum_ = 0, kv_max_ = 0, kv_samples_ = 0;
  std::vector<double> all_tpot_;
};

void EngineReplay::load_slice() {
  const auto from_ms = static_cast<std::int64_t>(rc_.start_s * 1000);
  const double span = rc_.duration_s > 0 ? rc_.duration_s : std::max(0.0, trace_.span_s() - rc_.start_s + 0.001);
  const std::int64_t to_ms = from_ms + static_cast<std::int64_t>(std::ceil(span * 1000));
  double p = 0, o = 0;
  for (const auto& r : trace_.requests) {
    if (r.t_ms < from_ms || r.t_ms >= to_ms) continue;
    Req q;
    q.arrival = static_cast<double>(r.t_ms - from_ms) / 1000.0 / rc_.rate_scale;
    // The scheduler needs a prompt token and an output token at least.
    q.prompt = std::max(1, r.prompt_tokens);
    q.output = std::max(1, r.output_tokens);
    p += r.prompt_tokens;
    o += r.output_tokens;
    reqs_.push_back(q);
  }
  if (reqs_.empty())
    throw InputError(trace_.source + ": no requests in the slice [" + std::to_string(rc_.start_s) + " s, +" +
                     std::to_string(span) + " s)");
  span_s_ = span / rc_.rate_scale;
  mean_prompt_ = p / static_cast<double>(reqs_.size());
  mean_output_ = o / static_cast<double>(reqs_.size());
}

void EngineReplay::account_devices(double t) {
  const double dt = std::max(0.0, t - held_since_);
  gpu_s_ += held_ * dt;
  held_iv_s_ += held_ * dt;
  held_total_s_ += held_ * dt;
  held_since_ = std::max(held_since_, t);
}

void EngineReplay::hold_devices(const std::vector<int>& devs, int delta, double t) {
  account_devices(t);
  for (int d : devs) {
    const int before = dev_refs_[static_cast<std::size_t>(d)];
    dev_refs_[static_cast<std::size_t>(d)] += delta;
    const int after = dev_refs_[static_cast<std::size_t>(d)];
    held_ += (after > 0) - (before > 0);
  }
}

int EngineReplay::build_domain(int gear, const doc::Replica& rep, double t, bool slow_start) {
  const doc::Gear& g = table_.gears[static_cast<std::size_t>(gear)];
  engine::DomainConfig dc;
  dc.id = "d" + std::to_string(next_domain_++);
  dc.stages.clear();
  for (const auto& st : rep.stages)
    dc.stages.emplace_back(st.first_layer, st.n_layers, static_cast<int>(st.devices.size()));
  dc.block_tokens = ec_.block_tokens;
  dc.kv_blocks = kv_pages_for(ec_.shape, ec_.topology, g, rep, ec_.block_tokens, ec_.max_running);
  dc.max_batched_tokens = g.max_batched_tokens;
  dc.max_running = ec_.max_running;
  dc.micro_batches = std::max(1, g.micro_batches);
  dc.max_context = ec_.shape.context_length;
  dc.count_backlog = false;  // backlog_prompt counts it from the requests
  SimDomain d;
  d.id = dc.id;
  d.gear = gear;
  SimulatedEngine* eng = nullptr;
  const model::HParams hp = hparams_of(ec_.shape);
  d.dom = std::make_unique<engine::Domain>(hp, dc, [&](const engine::DomainConfig& c) {
    SimulatedEngineOptions o;
    o.shape = ec_.shape;
    o.stages = replica_stages(ec_.shape, ec_.topology, rep, c);
    plan::Workload w;
    w.prompt_tokens = std::clamp(static_cast<int>(std::lround(mean_prompt_)), 1, std::max(1, c.max_context - 2));
    w.output_tokens = std::clamp(static_cast<int>(std::lround(mean_output_)), 1,
                                 std::max(1, c.max_context - 1 - w.prompt_tokens));
    w.max_batched_tokens = c.max_batched_tokens;
    d.capacity_rps =
        plan::estimate_replica(ec_.shape, o.stages, w, static_cast<double>(c.kv_blocks) * c.block_tokens).rps;
    o.calibration = ec_.calibration;
    o.kv_blocks = c.kv_blocks;
    o.block_tokens = c.block_tokens;
    o.token_ids = {token_};  // one id: the stream's content does not matter here
    auto e = std::make_unique<SimulatedEngine>(std::move(o));
    eng = e.get();
    return std::unique_ptr<engine::Engine>(std::move(e));
  });
  d.eng = eng;
  d.eng->advance_idle_to(t);
  d.free_at = t;
  for (const auto& st : rep.stages)
    for (const auto& name : st.devices) d.devs.push_back(dev_index_.at(name));
  if (slow_start) d.dom->limit_running(std::max(1, ec_.max_running * 7 / 10), ec_.slow_start_steps);
  doms_.push_back(std::move(d));
  hold_devices(doms_.back().devs, +1, t);
  return static_cast<int>(doms_.size()) - 1;
}

int EngineReplay::route(const Req& r) {
  if (cands_stale_) {
    // Only a weight or a state changes the candidates: they are set anew
    // then, and each arrival picks on indices (no string per request).
    cands_stale_ = false;
    std::vector<control::RouteCandidate> cands;
    cand_doms_.clear();
    for (std::size_t i = 0; i < doms_.size(); ++i) {
      const SimDomain& d = doms_[i];
      if (d.state == State::retired || d.state == State::draining || !(d.weight > 0)) continue;
      cands.push_back(control::RouteCandidate{d.id, d.weight, table_.gears[static_cast<std::size_t>(d.gear)].tp});
      cand_doms_.push_back(static_cast<int>(i));
    }
    router_.set_candidates(cands);
  }
  const int k = router_.pick(control::RouteRequest{0, r.prompt});
  return k < 0 ? -1 : cand_doms_[static_cast<std::size_t>(k)];
}

void EngineReplay::set_weight(int di, double w) {
  doms_[static_cast<std::size_t>(di)].weight = w;
  cands_stale_ = true;
}

void EngineReplay::set_state(int di, State s) {
  doms_[static_cast<std::size_t>(di)].state = s;
  cands_stale_ = true;
}

void EngineReplay::set_shares(const std::vector<int>& ds, double share) {
  std::vector<double> cap;
  for (int i : ds) cap.push_back(doms_[static_cast<std::size_t>(i)].capacity_rps);
  const std::vector<double> w = control::capacity_shares(cap, share);
  for (std::size_t k = 0; k < ds.size(); ++k) set_weight(ds[k], w[k]);
}

void EngineReplay::schedule(int di, double t) {
  SimDomain& d = doms_[static_cast<std::size_t>(di)];
  if (d.scheduled || d.state == State::retired) return;
  d.scheduled = true;
  heap_.emplace(std::max(t, d.free_at), di);
}

void EngineReplay::arrive(int i, double t) {
  Req& r = reqs_[static_cast<std::size_t>(i)];
  arrivals_w_.add(t, r.prompt);
  iv_.arrivals += 1;
  const int di = route(r);
  if (di < 0) {  // no serving domain: cannot happen while a gear serves, but never a hang
    r.failed = true;
    finish_request(r, t);
    return;
  }
  // Longer than the context or the whole KV cache of this gear: refused at
  // once, as the daemon refuses it (400), whatever the queue.
  const engine::DomainConfig& c = doms_[static_cast<std::size_t>(di)].dom->config();
  if (r.prompt >= c.max_context ||
      engine::kv_pages(engine::peak_kv_tokens(r.prompt, r.output, c.max_context), c.block_tokens) > c.kv_blocks) {
    r.failed = true;
    rejected_ += 1;
    finish_request(r, t);
    return;
  }
  doms_[static_cast<std::size_t>(di)].backlog.push_back(i);
  doms_[static_cast<std::size_t>(di)].backlog_prompt += r.prompt;
  r.dom = di;
  schedule(di, t);
}

bool EngineReplay::place(int i, double t) {
  Req& r = reqs_[static_cast<std::size_t>(i)];
  const int di = route(r);
  if (di < 0) return false;
  doms_[static_cast<std::size_t>(di)].backlog.push_back(i);
  doms_[static_cast<std::size_t>(di)].backlog_prompt += r.prompt;
  r.dom = di;
  schedule(di, t);
  return true;
}

void EngineReplay::withdraw_unstarted(int di, double t) {
  SimDomain& d = doms_[static_cast<std::size_t>(di)];
  // What the Domain was not given yet moves at once; what it holds comes
  // back as "withdrawn" events at its next step (on_event places them).
  std::deque<int> moved;
  moved.swap(d.backlog);
  for (int i : moved) {
    d.backlog_prompt -= reqs_[static_cast<std::size_t>(i)].prompt;
    reqs_[static_cast<std::size_t>(i)].dom = -1;
    if (!place(i, t)) {  // no serving domain: it stays where it was
      d.backlog.push_back(i);
      d.backlog_prompt += reqs_[static_cast<std::size_t>(i)].prompt;
      reqs_[static_cast<std::size_t>(i)].dom = di;
    }
  }
  d.dom->withdraw_unstarted();
  schedule(di, t);
}

void EngineReplay::feed(SimDomain& d, double t) {
  // A step admits at most max_running - running of the waiting: more in
  // the Domain would change nothing but cost its scheduler a pass over
  // each of them against the whole batch.
  while (!d.backlog.empty() && d.dom->waiting() + d.dom->running() < ec_.max_running) {
    const int i = d.backlog.front();
    d.backlog.pop_front();
    Req& r = reqs_[static_cast<std::size_t>(i)];
    engine::GenerationRequest g;
    g.id = std::to_string(i);
    g.group = kGroup;
    g.prompt.assign(static_cast<std::size_t>(r.prompt), token_);
    g.max_tokens = r.output;
    g.sampling.temperature = 0;
    g.on_event = [this, i](const engine::GenerationEvent& e) { on_event(i, e); };
    try {
      d.dom->submit(std::move(g));
    } catch (const InputError&) {
      // What arrive() did not refuse (it checks the same limits): counted
      // as refused all the same.
      r.failed = true;
      rejected_ += 1;
      finish_request(r, t);
    }
  }
}

void EngineReplay::finish_request(Req& r, double t) {
  if (r.dom >= 0) {
    doms_[static_cast<std::size_t>(r.dom)].backlog_prompt -= r.prompt;
    r.dom = -1;
  }
  r.done = t;
  finished_ += 1;
  iv_.finished += 1;
  const double ttft = r.first >= 0 ? (r.first - r.arrival) * 1000 : (t - r.arrival) * 1000;
  const double e2e = (t - r.arrival) * 1000;
  const double tpot = r.generated > 1 ? (t - r.first) * 1000 / (r.generated - 1) : 0;
  const bool ok = !r.failed && ttft <= rc_.slo_ttft_ms && tpot <= rc_.slo_tpot_ms;
  if (ok) {
    attained_ += 1;
    iv_.attained += 1;
  }
  if (r.failed) return;
  iv_.e2e.push_back(e2e);
  e2e_w_.add(t, e2e);
  e2e_60_w_.add(t, e2e);
  finished_w_prompt_.add(t, r.prompt);
  finished_w_output_.add(t, r.generated);
  if (r.generated > 1) {
    iv_.tpot.push_back(tpot);
    tpot_w_.add(t, tpot);
    all_tpot_.push_back(tpot);
  }
}

void EngineReplay::on_event(int i, const engine::GenerationEvent& e) {
  // Most events are a decode's token past the first: nothing to record,
  // and the request is not read (its line is a cache and TLB miss in a
  // table of a million). Its token count comes with its finish (index).
  if (e.token >= 0 && e.index > 0 && !e.finished) return;
  Req& r = reqs_[static_cast<std::size_t>(i)];
  const double t = cur_->eng->now_s();
  if (e.finished) r.generated = e.index;  // the tokens it was given, one event each
  if (e.token >= 0) {
    if (e.index == 0 && r.first < 0) {
      r.first = t;
      if (r.dom >= 0) {
        doms_[static_cast<std::size_t>(r.dom)].backlog_prompt -= r.prompt;
        r.dom = -1;
      }
      const double ttft = (t - r.arrival) * 1000;
      iv_.ttft.push_back(ttft);
      ttft_w_.add(t, ttft);
    }
  }
  if (!e.finished) return;
  if (e.finish_reason == engine::FinishReason::withdrawn) {
    // Given back unstarted by a draining domain: to a serving one (as the
    // daemon's Service::place_withdrawn); neither finished nor failed.
    if (r.dom >= 0) {
      doms_[static_cast<std::size_t>(r.dom)].backlog_prompt -= r.prompt;
      r.dom = -1;
    }
    if (!place(i, t)) {
      r.failed = true;
      finish_request(r, t);
    }
    return;
  }
  if (e.finish_reason == engine::FinishReason::error) {
    r.failed = true;
    ++cur_->errors;
  }
  // A ramp watches the new domains' E2E (a marker entry turns it on).
  if (!r.failed && !cur_->e2e.empty()) cur_->e2e.emplace_back(t, (t - r.arrival) * 1000);
  finish_request(r, t);
}

void EngineReplay::release_claims(int di) {
  for (int dev : doms_[static_cast<std::size_t>(di)].devs)
    if (claim_[static_cast<std::size_t>(dev)] == di) claim_[static_cast<std::size_t>(dev)] = -1;
}

void EngineReplay::wake_waiters(int di, double t) {
  std::vector<int> w;
  w.swap(doms_[static_cast<std::size_t>(di)].waiters);
  for (int x : w) schedule(x, t);
}

void EngineReplay::step(int di, double t) {
  SimDomain& d = doms_[static_cast<std::size_t>(di)];
  d.scheduled = false;
  release_claims(di);
  if (d.state == State::retired) {
    wake_waiters(di, t);
    return;
  }
  // Domains that share a device take turns: one that had to wait for a
  // device claims it, and another that comes for it meanwhile waits behind
  // the claimant (a tie at the same instant would otherwise always go to
  // the same domain and starve the other, e.g. a shadow's warm-up).
  for (int dev : d.devs) {
    const int c = claim_[static_cast<std::size_t>(dev)];
    if (c >= 0) {
      doms_[static_cast<std::size_t>(c)].waiters.push_back(di);
      wake_waiters(di, t);
      return;
    }
  }
  double ready = std::max(t, d.free_at);
  for (int dev : d.devs) ready = std::max(ready, dev_free_[static_cast<std::size_t>(dev)]);
  if (ready > t) {
    for (int dev : d.devs) claim_[static_cast<std::size_t>(dev)] = di;
    d.scheduled = true;
    heap_.emplace(ready, di);
    return;
  }
  feed(d, t);
  if (d.dom->idle()) {
    wake_waiters(di, t);
    maybe_retire(di, t);
    return;
  }
  d.eng->advance_idle_to(t);
  cur_ = &d;
  const int tokens = d.dom->step();
  cur_ = nullptr;
  SimDomain& dd = doms_[static_cast<std::size_t>(di)];  // no domain is added during a step: same object
  const double end = dd.eng->now_s();
  if (tokens == 0 && !dd.dom->idle())
    throw Error("simulated domain " + dd.id + " made no progress at t = " + std::to_string(t) + " s");
  const double dt = end - t;
  dd.busy_s += dt;
  // The part past the interval's end counts in the next one.
  const double within = std::clamp(next_int_ - t, 0.0, dt);
  busy_iv_s_ += within * static_cast<double>(dd.devs.size());
  busy_carry_s_ += (dt - within) * static_cast<double>(dd.devs.size());
  busy_total_s_ += dt * static_cast<double>(dd.devs.size());
  for (int dev : dd.devs) {
    dev_free_[static_cast<std::size_t>(dev)] = end;
    dev_busy_[static_cast<std::size_t>(dev)] += dt;
  }
  dd.free_at = end;
  const std::vector<double>& busy = dd.eng->stage_busy_s();
  if (busy.size() >= 2) {
    auto [mn, mx] = std::minmax_element(busy.begin(), busy.end());
    dd.bubble = *mx > 0 ? (*mx - *mn) / *mx : 0;
  }
  const engine::DomainStats s = dd.dom->stats();
  const double dp = double(s.prompt_tokens - dd.seen.prompt_tokens), dg = double(s.generated_tokens - dd.seen.generated_tokens),
               dpre = double(s.preemptions - dd.seen.preemptions);
  dd.seen = s;
  iv_.prompt_tokens += dp;
  iv_.decode_tokens += dg;
  iv_.preemptions += dpre;
  total_prompt_ += dp;
  total_decode_ += dg;
  total_preempt_ += dpre;
  if (dg > 0) decode_w_.add(end, dg);
  wake_waiters(di, end);
  if (has_work(dd)) schedule(di, end);
  else maybe_retire(di, end);
}

void EngineReplay::maybe_retire(int di, double t) {
  SimDomain& d = doms_[static_cast<std::size_t>(di)];
  if (d.state != State::draining || has_work(d)) return;
  set_state(di, State::retired);
  set_weight(di, 0);
  router_.forget(d.id);
  hold_devices(d.devs, -1, std::max(t, d.free_at));
  if (!shift_ || shift_->phase != Shift::Phase::drain) return;
  const auto& leaving = shift_->rolled_back ? shift_->fresh : shift_->old;
  if (std::all_of(leaving.begin(), leaving.end(),
                  [&](int i) { return doms_[static_cast<std::size_t>(i)].state == State::retired; }))
    end_shift();
}

void EngineReplay::start_shift(int to, double t, std::vector<double> ramp, double ramp_step_s) {
  if (shift_ || to == gear_) return;
  Shift s;
  s.ramp = std::move(ramp);
  s.ramp_step_s = ramp_step_s;
  s.from = gear_;
  s.to = to;
  for (std::size_t i = 0; i < doms_.size(); ++i)
    if (doms_[i].state == State::serving) s.old.push_back(static_cast<int>(i));
  for (const auto& name : table_.gears[static_cast<std::size_t>(to)].devices()) s.reserved.push_back(dev_index_.at(name));
  std::vector<double> e2e = e2e_60_w_.values();
  s.baseline_p99 = quantile(e2e, 0.99);
  hold_devices(s.reserved, +1, t);
  s.next = t + plan::reserve_phase_s(ec_.shape, table_.gears[static_cast<std::size_t>(s.from)],
                                     table_.gears[static_cast<std::size_t>(to)], ec_.shift);
  shift_ = std::move(s);
  ++shifts_;
  ++iv_shifts_;
}

void EngineReplay::apply_share(double share) {
  Shift& s = *shift_;
  set_shares(s.fresh, share);
  set_shares(s.old, 1 - share);
}

void EngineReplay::advance_shift(double t) {
  Shift& s = *shift_;
  switch (s.phase) {
    case Shift::Phase::reserve: {
      // The devices are leased; the new domains are built and each serves
      // one dummy request (the daemon's warm-up) on the engine model.
      const doc::Gear& g = table_.gears[static_cast<std::size_t>(s.to)];
      for (const auto& rep : g.replicas) s.fresh.push_back(build_domain(s.to, rep, t, true));
      hold_devices(s.reserved, -1, t);
      for (int di : s.fresh) {
        SimDomain& d = doms_[static_cast<std::size_t>(di)];
        engine::GenerationRequest w;
        w.id = "warmup-" + d.id;
        w.group = kGroup;
        w.prompt = {token_};
        w.max_tokens = 1;
        w.on_event = [this, di](const engine::GenerationEvent& e) {
          if (!e.finished) return;
          SimDomain& x = doms_[static_cast<std::size_t>(di)];
          x.warmed = true;
          if (e.finish_reason == engine::FinishReason::error) ++x.errors;
          if (shift_ && shift_->phase == Shift::Phase::warm &&
              std::all_of(shift_->fresh.begin(), shift_->fresh.end(),
                          [&](int j) { return doms_[static_cast<std::size_t>(j)].warmed; }))
            shift_->next = std::max(shift_->warm_until, x.eng->now_s());
        };
        d.dom->submit(std::move(w));
        schedule(di, t);
      }
      s.phase = Shift::Phase::warm;
      s.warm_until = t + ec_.shift.warm_s;
      s.next = kInf;  // set by the last warm-up's finish
      return;
    }
    case Shift::Phase::warm:
      s.phase = Shift::Phase::ramp;
      s.ramp_i = 0;
      break;
    case Shift::Phase::ramp: {
      // The check after the wait: no error on the new domains, P99 E2E within the factor.
      std::uint64_t errors = 0;
      std::vector<double> e2e;
      for (int i : s.fresh) {
        SimDomain& d = doms_[static_cast<std::size_t>(i)];
        errors += d.errors;
        for (std::size_t k = 1; k < d.e2e.size(); ++k) e2e.push_back(d.e2e[k].second);
        d.e2e.clear();
      }
      const double p99 = quantile(e2e, 0.99);
      if (errors > 0 || (e2e.size() >= 20 && s.baseline_p99 > 0 && p99 > ec_.rollback_p99_factor * s.baseline_p99)) {
        // Roll back: traffic returns to the old domains, the new ones drain and retire.
        s.rolled_back = true;
        ++rollbacks_;
        set_shares(s.old, 1.0);
        for (int i : s.fresh) set_weight(i, 0);
        for (int i : s.fresh) set_state(i, State::draining);
        for (int i : s.fresh) withdraw_unstarted(i, t);  // the old domains take what has not started
        s.phase = Shift::Phase::drain;
        s.next = kInf;
        const std::vector<int> fresh = s.fresh;  // the last retirement ends the shift (and s)
        for (int i : fresh) maybe_retire(i, t);
        return;
      }
      ++s.ramp_i;
      break;
    }
    case Shift::Phase::drain:
      return;
  }
  // The next ramp step.
  const double share = s.ramp[s.ramp_i];
  apply_share(share);
  for (int i : s.fresh) {
    SimDomain& d = doms_[static_cast<std::size_t>(i)];
    if (d.state == State::warming) set_state(i, State::serving);
    d.e2e.assign(1, {t, 0.0});  // marker: the ramp watches this domain from now
  }
  if (share < 1.0) {
    s.step_start = t;
    s.next = t + s.ramp_step_s;
    return;
  }
  // 100 %: the old domains drain while the new ones serve; the gear is the new one.
  for (int i : s.fresh) doms_[static_cast<std::size_t>(i)].e2e.clear();
  for (int i : s.old) {
    set_state(i, State::draining);
    set_weight(i, 0);
  }
  // What waits on the old domains goes to the new ones (the daemon's drain, issue 20).
  for (int i : s.old) withdraw_unstarted(i, t);
  gear_time_[gear_] += t - gear_since_;
  gear_since_ = t;
  gear_ = s.to;
  s.phase = Shift::Phase::drain;
  s.next = kInf;
  const std::vector<int> old = s.old;
  for (int i : old) maybe_retire(i, t);
}

void EngineReplay::end_shift() {
  for (int i : shift_->fresh) doms_[static_cast<std::size_t>(i)].e2e.clear();
  shift_.reset();
}

void EngineReplay::sample(double t) {
  double q = 0, kv = 0;
  for (const auto& d : doms_) {
    if (d.state == State::retired) continue;
    q += d.dom->waiting() + static_cast<double>(d.backlog.size());
    kv = std::max(kv, d.dom->kv_usage());
  }
  queue_w_.add(t, q);
  kv_sum_ += kv;
  kv_max_ = std::max(kv_max_, kv);
  kv_samples_ += 1;
}

void EngineReplay::observe(double t) {
  doc::Observation o;
  o.t_ms = std::llround(t * 1000);
  o.gear = table_.gears[static_cast<std::size_t>(gear_)].name;
  o.shifting = shift_.has_value();
  arrivals_w_.trim(t - kRateWindowS);
  o.request_rate = static_cast<double>(arrivals_w_.s.size()) / kRateWindowS;
  double tokens = 0;
  for (const auto& [x, v] : arrivals_w_.s) tokens += v;
  o.prompt_token_rate = tokens / kRateWindowS;
  decode_w_.trim(t - kRateWindowS);
  tokens = 0;
  for (const auto& [x, v] : decode_w_.s) tokens += v;
  o.decode_token_rate = tokens / kRateWindowS;
  queue_w_.trim(t - kQueueWindowS);
  double qsum = 0;
  for (const auto& [x, v] : queue_w_.s) qsum += v;
  o.queue_depth_mean = queue_w_.s.empty() ? 0 : qsum / static_cast<double>(queue_w_.s.size());
  for (auto* w : {&ttft_w_, &tpot_w_, &e2e_w_}) w->trim(t - kLatencyWindowS);
  auto pair = [](const Window& w) {
    std::vector<double> v = w.values();
    return p50_p99(v);
  };
  o.ttft_ms = pair(ttft_w_);
  o.tpot_ms = pair(tpot_w_);
  o.e2e_ms = pair(e2e_w_);
  finished_w_prompt_.trim(t - kMixWindowS);
  finished_w_output_.trim(t - kMixWindowS);
  e2e_60_w_.trim(t - kMixWindowS);
  if (!finished_w_prompt_.s.empty()) {
    double p = 0, out = 0;
    for (const auto& [x, v] : finished_w_prompt_.s) p += v;
    for (const auto& [x, v] : finished_w_output_.s) out += v;
    o.mean_prompt_tokens = p / static_cast<double>(finished_w_prompt_.s.size());
    o.mean_output_tokens = out / static_cast<double>(finished_w_output_.s.size());
  }
  const double span = t - obs_last_;
  std::vector<double> util(dev_names_.size(), -1);
  for (const auto& d : doms_) {
    if (d.state == State::retired) continue;
    doc::DomainView v;
    v.id = d.id;
    v.gear = table_.gears[static_cast<std::size_t>(d.gear)].name;
    v.state = d.state;
    for (int dev : d.devs) v.devices.push_back(dev_names_[static_cast<std::size_t>(dev)]);
    v.traffic_share = d.weight;
    v.running = d.dom->running();
    v.waiting = d.dom->waiting() + static_cast<int>(d.backlog.size());
    o.queue_depth += v.waiting;
    o.queued_prompt_tokens += std::max(0.0, d.backlog_prompt);
    o.kv_watermark = std::max(o.kv_watermark, d.dom->kv_usage());
    o.bubble_ratio = std::max(o.bubble_ratio, d.bubble);
    o.domains.push_back(std::move(v));
    for (int dev : d.devs) util[static_cast<std::size_t>(dev)] = 0;
  }
  // Utilization of each held device: the share of time it was stepping since the last observation.
  for (std::size_t i = 0; i < util.size(); ++i) {
    const double busy = dev_busy_[i] - dev_busy_seen_[i];
    dev_busy_seen_[i] = dev_busy_[i];
    if (util[i] < 0) continue;
    o.devices.push_back(doc::DeviceLoad{dev_names_[i], span > 0 ? std::clamp(busy / span, 0.0, 1.0) : 0});
  }
  obs_last_ = t;
  // As the daemon: median E2E x queue length.
  o.est_queue_time_ms = (e2e_w_.s.empty() ? 0 : o.e2e_ms.p50) * o.queue_depth;
  const doc::Decision dec = policy_.observe(o);
  if (dec.action == "shift" && !pending_ && !shift_) {
    const int to = table_.index_of(dec.to);
    if (to < 0) throw Error(std::string(policy_.name()) + ": decided a shift to an unknown gear \"" + dec.to + "\"");
    ++decisions_;
    pending_ = PendingShift{to, std::max(static_cast<double>(dec.not_before_ms) / 1000.0, t),
                            dec.ramp.empty() ? ec_.shift.ramp : dec.ramp,
                            dec.ramp_step_ms >= 0 ? static_cast<double>(dec.ramp_step_ms) / 1000.0 : ec_.shift.ramp_step_s};
  }
}

void EngineReplay::interval(double t) {
  account_devices(t);
  const double span = t - iv_start_;
  double q = 0, kv = 0;
  int running = 0;
  for (const auto& d : doms_) {
    if (d.state == State::retired) continue;
    q += d.dom->waiting() + static_cast<double>(d.backlog.size());
    kv = std::max(kv, d.dom->kv_usage());
    running += d.dom->running();
  }
  const doc::Gear& g = table_.gears[static_cast<std::size_t>(gear_)];
  json::Json rec = {
      {"kind", doc::kind::sim_interval},
      {"t_s", round3(t)},
      {"load_rps", round3(span > 0 ? iv_.arrivals / span : 0)},
      {"requests", std::llround(iv_.arrivals)},
      {"gear", g.name},
      {"shifting", shift_.has_value()},
      {"capacity_rps", round3(gear_max_rps(g))},
      {"devices", held_},
      {"ttft_ms", pct(iv_.ttft)},
      {"tpot_ms", pct(iv_.tpot)},
      {"e2e_ms", pct(iv_.e2e)},
      {"utilization", round3(held_iv_s_ > 0 ? std::min(1.0, busy_iv_s_ / held_iv_s_) : 0)},
      {"queue_depth", q},
      {"sla_attainment", round3(iv_.finished > 0 ? iv_.attained / iv_.finished : 1)},
      {"shifts", iv_shifts_},
      {"finished", std::llround(iv_.finished)},
      {"running", running},
      {"prompt_tokens_s", round3(span > 0 ? iv_.prompt_tokens / span : 0)},
      {"decode_tokens_s", round3(span > 0 ? iv_.decode_tokens / span : 0)},
      {"kv_usage", round3(kv)},
      {"preemptions", std::llround(iv_.preemptions)},
  };
  if (shift_) rec["shift_to"] = table_.gears[static_cast<std::size_t>(shift_->to)].name;
  emit_(rec);
  iv_ = Acc{};
  iv_shifts_ = 0;
  held_iv_s_ = 0;
  busy_iv_s_ = busy_carry_s_;
  busy_carry_s_ = 0;
  iv_start_ = t;
}

json::Json EngineReplay::run(const std::string& start_gear) {
  if (!(rc_.rate_scale > 0)) throw InputError("--rate-scale: must be > 0");
  if (!(rc_.interval_s > 0)) throw InputError("--interval: must be > 0");
  if (!(rc_.observation_period_s > 0)) throw InputError("observation period: must be > 0");
  if (rc_.start_s < 0 || rc_.duration_s < 0) throw InputError("--start, --duration: must be >= 0");
  if (ec_.block_tokens < 1) throw InputError("--block-tokens: must be positive");
  if (ec_.max_running < 1) throw InputError("--max-running: must be positive");
  plan::validate(ec_.shift);
  gear_ = table_.index_of(start_gear);
  if (gear_ < 0) throw InputError("--start-gear: gear \"" + start_gear + "\" is not in the gear table");
  load_slice();
  router_ = control::Router(ec_.long_prompt_tokens);
  token_ = ec_.shape.vocab_size > 3 ? 3 : 0;
  for (std::size_t i = 0; i < ec_.topology.devices.size(); ++i) {
    dev_index_[ec_.topology.devices[i].id] = static_cast<int>(i);
    dev_names_.push_back(ec_.topology.devices[i].id);
  }
  for (const auto& g : table_.gears)
    for (const auto& name : g.devices())
      if (!dev_index_.count(name))
        throw InputError("gear " + g.name + ": device \"" + name + "\" is not in topology " + ec_.topology.name);
  const std::size_t nd = dev_names_.size();
  dev_free_.assign(nd, 0);
  dev_busy_.assign(nd, 0);
  dev_busy_seen_.assign(nd, 0);
  dev_refs_.assign(nd, 0);
  claim_.assign(nd, -1);

  const doc::Gear& g0 = table_.gears[static_cast<std::size_t>(gear_)];
  std::vector<int> first;
  for (const auto& rep : g0.replicas) {
    const int di = build_domain(gear_, rep, 0, false);
    set_state(di, State::serving);
    first.push_back(di);
  }
  set_shares(first, 1.0);

  const double hard_end = span_s_ + ec_.tail_s;
  std::size_t ai = 0;
  double next_sample = kSampleS, next_obs = rc_.observation_period_s;
  double& next_int = next_int_;
  next_int = std::min(rc_.interval_s, span_s_);
  double t = 0;
  auto busy = [&] {
    if (ai < reqs_.size() || shift_) return true;
    for (const auto& d : doms_)
      if (d.state != State::retired && has_work(d)) return true;
    return false;
  };
  while (true) {
    const double ta = ai < reqs_.size() ? reqs_[ai].arrival : kInf;
    const double td = heap_.empty() ? kInf : heap_.top().first;
    const double ts = shift_ ? shift_->next : kInf;
    const double tp = pending_ && !shift_ ? pending_->not_before : kInf;
    const double tc = std::min({next_sample, next_obs, next_int});
    t = std::min({ta, td, ts, tp, tc});
    if (t > hard_end) t = hard_end;
    // Events at one time, in a fixed order: shift phases, a decided shift's
    // start, arrivals, the control ticks, then the domains' steps.
    if (ts <= t) {
      advance_shift(t);
    } else if (tp <= t) {
      PendingShift p = std::move(*pending_);
      pending_.reset();
      start_shift(p.to, t, std::move(p.ramp), p.ramp_step_s);
    } else if (ta <= t) {
      arrive(static_cast<int>(ai++), t);
    } else if (tc <= t) {
      if (next_sample <= t) {
        sample(t);
        next_sample += kSampleS;
      }
      if (next_obs <= t) {
        observe(t);
        next_obs += rc_.observation_period_s;
      }
      if (next_int <= t) {
        interval(t);
        // The slice ends on a record; after it, the run ends at the first
        // record with nothing left to serve (or at the tail's end).
        if (t >= span_s_ && (!busy() || t >= hard_end)) break;
        next_int = next_int < span_s_ && next_int + rc_.interval_s > span_s_ ? span_s_ : next_int + rc_.interval_s;
        if (next_int > hard_end) next_int = hard_end;
      }
    } else if (td <= t) {
      const int di = heap_.top().second;
      heap_.pop();
      step(di, t);
    } else {
      // Only the tail's end is left.
      next_int = t;
    }
  }
  account_devices(t);
  gear_time_[gear_] += t - gear_since_;

  // Requests still in flight at the end: unfinished, their latencies censored at the end.
  std::vector<double> ttft, e2e;
  double unfinished = 0;
  for (auto& r : reqs_) {
    if (r.done < 0 && r.arrival <= t) unfinished += 1;
    if (r.failed && r.first < 0) continue;  // refused: no latency
    const double end = r.done >= 0 ? r.done : t;
    ttft.push_back(((r.first >= 0 ? r.first : end) - r.arrival) * 1000);
    e2e.push_back((end - r.arrival) * 1000);
  }
  const double n = static_cast<double>(reqs_.size());
  json::Json gt = json::Json::object();
  for (std::size_t i = 0; i < table_.gears.size(); ++i)
    if (gear_time_.count(static_cast<int>(i))) gt[table_.gears[i].name] = round3(gear_time_[static_cast<int>(i)]);
  const doc::Percentiles ttft_p = p50_p99(ttft), tpot_p = p50_p99(all_tpot_), e2e_p = p50_p99(e2e);
  const double ttft50 = ttft_p.p50, ttft99 = ttft_p.p99, tpot50 = tpot_p.p50, tpot99 = tpot_p.p99, e2e50 = e2e_p.p50,
               e2e99 = e2e_p.p99;
  json::Json shift_cfg = {{"reserve_s", ec_.shift.reserve_s},
                          {"warm_s", ec_.shift.warm_s},
                          {"weight_load_gb_s", ec_.shift.weight_load_gb_s},
                          {"ramp", ec_.shift.ramp},
                          {"ramp_step_s", ec_.shift.ramp_step_s}};
  return {
      {"kind", doc::kind::sim_summary},
      {"service", "simulated-engine"},
      {"policy", spec_},
      {"policy_name", std::string(policy_.name())},
      {"trace",
       {{"source", trace_.source},
        {"format", trace_.format},
        {"start_s", rc_.start_s},
        {"span_s", round3(span_s_ * rc_.rate_scale)},
        {"rate_scale", rc_.rate_scale},
        {"mean_prompt_tokens", round3(mean_prompt_)},
        {"mean_output_tokens", round3(mean_output_)}}},
      {"engine",
       {{"model", ec_.shape.name},
        {"topology", ec_.topology.name},
        {"block_tokens", ec_.block_tokens},
        {"max_running", ec_.max_running},
        {"slow_start_steps", ec_.slow_start_steps},
        {"tail_s", ec_.tail_s},
        {"shift", shift_cfg}}},
      {"slo", {{"ttft_ms", rc_.slo_ttft_ms}, {"tpot_ms", rc_.slo_tpot_ms}}},
      {"start_gear", start_gear},
      {"final_gear", table_.gears[static_cast<std::size_t>(gear_)].name},
      {"duration_s", round3(span_s_)},
      {"end_s", round3(t)},
      {"interval_s", rc_.interval_s},
      {"requests", std::llround(n)},
      {"finished", std::llround(finished_ - rejected_)},
      {"rejected", std::llround(rejected_)},
      {"unfinished", std::llround(unfinished)},
      {"sla_attainment", round3(n > 0 ? attained_ / n : 1)},
      {"goodput_rps", round3(attained_ / span_s_)},
      {"p50", {{"ttft_ms", round3(ttft50)}, {"tpot_ms", round3(tpot50)}, {"e2e_ms", round3(e2e50)}}},
      {"p99", {{"ttft_ms", round3(ttft99)}, {"tpot_ms", round3(tpot99)}, {"e2e_ms", round3(e2e99)}}},
      {"gpu_hours", std::round(gpu_s_ / 3600 * 1e4) / 1e4},
      {"mean_utilization", round3(held_total_s_ > 0 ? busy_total_s_ / held_total_s_ : 0)},
      {"prompt_tokens", std::llround(total_prompt_)},
      {"decode_tokens", std::llround(total_decode_)},
      {"prompt_tokens_s", round3(total_prompt_ / t)},
      {"decode_tokens_s", round3(total_decode_ / t)},
      {"kv_usage", {{"mean", round3(kv_samples_ > 0 ? kv_sum_ / kv_samples_ : 0)}, {"max", round3(kv_max_)}}},
      {"preemptions", std::llround(total_preempt_)},
      {"shifts", shifts_},
      {"rollbacks", rollbacks_},
      {"shift_decisions", decisions_},
      {"gear_time_s", gt},
  };
}

}  // namespace

json::Json replay_engine(const control::Trace& trace, control::Policy& policy, const std::string& policy_spec,
                         const doc::GearTable& table, const std::string& start_gear,
                         const control::ReplayConfig& config, const EngineReplayConfig& engine,
                         const std::function<void(const json::Json&)>& emit) {
  EngineReplay r(trace, policy, policy_spec, table, config, engine, emit);
  return r.run(start_gear);
}

}  // namespace ftp::sim
