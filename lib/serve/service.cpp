// SPDX-License-Identifier: Apache-2.0
#include "serve/service.hpp"

#include <algorithm>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "backend/cpu/cpu_info.hpp"
#include "core/escape.hpp"
#include "engine/rank_backend.hpp"
#include "serve/domain_runner.hpp"
#include "serve/generate.hpp"

namespace ftp::serve {

namespace {

using json::Json;

/// Histogram bucket bounds, ms (Prometheus "le").
const std::vector<double> kBoundsMs = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000};

}  // namespace

void Service::observe_ms(Histogram& h, double ms) {
  h.counts[static_cast<std::size_t>(std::lower_bound(kBoundsMs.begin(), kBoundsMs.end(), ms) - kBoundsMs.begin())]++;
  h.sum += ms;
  ++h.count;
}

namespace {

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

/// A sample value of the Prometheus text format at full precision: a
/// histogram's _sum grows for as long as the daemon runs.
std::string prom(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

}  // namespace

Service::Service(const model::Model& model, ServiceConfig config)
    : model_(model), cfg_(std::move(config)), tok_(model::tokenizer_of(model)),
      eog_(end_of_generation(model, *tok_)) {
  if (!cfg_.clock) cfg_.clock = std::make_shared<control::SystemClock>();
  t0_us_ = cfg_.clock->now_us();
  check_model(cfg_.gears);
  doc::validate(cfg_.gears);
  if (cfg_.start_gear.empty()) cfg_.start_gear = cfg_.gears.gears.at(0).name;
  if (!cfg_.gears.find(cfg_.start_gear))
    throw ControlError("ftp.NoSuchGear", "--start-gear: no gear \"" + cfg_.start_gear + "\" in the gear table",
                       Exit::usage);
  check_ramp(cfg_.ramp, "ramp");
  for (auto& h : hist_) h.counts.assign(kBoundsMs.size() + 1, 0);
  if (cfg_.engine_factory) return;  // no weights, no CPU virtual devices: the engine is someone else's
  // Fails here, before anything is served, where the backend cannot run
  // (a build without CUDA, no GPU): a BackendError naming why.
  backend_ = &engine::backend_named(cfg_.backend);
  store_ = std::make_unique<engine::WeightStore>(model);
  // Release weight mode frees the mapped pages the domains read: with any
  // gear in that mode, the CPU backend reads the mapped tensors, not a
  // packed copy (WeightStore::use_release_mode).
  for (const auto& g : cfg_.gears.gears)
    if (g.weight_mode == "release") store_->use_release_mode();
  // The CPU virtual devices the table names (vd0, vd1, ...): the CPU and its
  // memory split evenly among as many as the highest index needs.
  int n_vd = 0;
  for (const auto& g : cfg_.gears.gears)
    for (const auto& d : g.devices())
      if (d.size() > 2 && d.compare(0, 2, "vd") == 0 && d.find_first_not_of("0123456789", 2) == std::string::npos)
        n_vd = std::max(n_vd, std::stoi(d.substr(2)) + 1);
  if (n_vd > 0) {
    auto cpu = backend::discover_cpu();
    auto devs = backend::split_cpu(n_vd, cpu.memory_bytes);
    for (auto& d : devs) vdevs_["vd" + std::to_string(d->id())] = std::move(d);
  }
}

Service::~Service() { drain_and_stop(); }

int Service::context_length() const noexcept { return model_.hparams.n_ctx_train; }

std::int64_t Service::now_us() const { return cfg_.clock->now_us() - t0_us_; }

std::int64_t Service::now_ms() const { return now_us() / 1000; }

std::string Service::current_gear() const {
  std::lock_guard lk(mu_);
  return gear_;
}

void check_ramp(const std::vector<double>& shares, const std::string& what) {
  auto list = [&] {
    std::string t;
    for (double v : shares) t += (t.empty() ? "" : ",") + fmt(v);
    return t;
  };
  if (shares.empty()) throw InputError(what + ": no shares; a ramp ends at 1.0 (100 %)");
  for (std::size_t i = 0; i < shares.size(); ++i) {
    if (!(shares[i] > 0 && shares[i] <= 1))
      throw InputError(what + ": share " + fmt(shares[i]) + " is not in (0, 1]");
    if (i > 0 && shares[i] <= shares[i - 1]) throw InputError(what + ": shares must increase, got " + list());
  }
  if (shares.back() != 1.0) throw InputError(what + ": the last share must be 1.0 (100 %), got " + list());
}

namespace {

/// Calls fn(first layer, layers, tp, rank) for each rank of the gear on a
/// device that `want` accepts; returns the sum of what it returned (bytes).
std::uint64_t for_each_rank(const doc::Gear& g, const std::function<bool(const std::string&)>& want,
                            const std::function<std::uint64_t(int, int, int, int)>& fn) {
  std::uint64_t bytes = 0;
  for (const auto& rep : g.replicas)
    for (const auto& st : rep.stages)
      for (std::size_t r = 0; r < st.devices.size(); ++r)
        if (want(st.devices[r]))
          bytes += fn(st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), static_cast<int>(r));
  return bytes;
}

/// CUDA device of a gear's device name: "gpu<N>" (ftp-probe's ids) is N;
/// anything else is device 0.
int gpu_ordinal(const std::string& name) {
  if (name.size() > 3 && name.compare(0, 3, "gpu") == 0 && name.find_first_not_of("0123456789", 3) == std::string::npos)
    return std::stoi(name.substr(3));
  return 0;
}

}  // namespace

std::vector<std::vector<std::uint64_t>> Service::gpu_kv_room(const std::vector<engine::DomainConfig>& domains) const {
  std::vector<std::vector<std::uint64_t>> out(domains.size());
  if (cfg_.kv_blocks > 0 || !store_ || !backend_) return out;
  std::vector<engine::RankSpec> specs;
  std::vector<std::size_t> owner;  // replica of each spec
  for (std::size_t d = 0; d < domains.size(); ++d) {
    const auto& stages = domains[d].stages;
    for (std::size_t s = 0; s < stages.size(); ++s)
      for (const engine::RankSpec& rs : engine::stage_rank_specs(stages[s], static_cast<int>(s),
                                                                 static_cast<int>(stages.size()), 0, cfg_.block_tokens, 0)) {
        specs.push_back(rs);
        owner.push_back(d);
      }
  }
  const std::vector<std::uint64_t> room = backend_->kv_room_bytes(*store_, specs);
  for (std::size_t i = 0; i < room.size() && i < specs.size(); ++i) out[owner[i]].push_back(room[i]);
  return out;
}

int Service::kv_blocks_for(const doc::Gear& gear, const doc::Replica& rep, const std::vector<engine::StageLayout>& stages,
                           const std::vector<std::uint64_t>& gpu_room) const {
  if (cfg_.kv_blocks > 0) return cfg_.kv_blocks;
  const int bt = cfg_.block_tokens, ctx = context_length();
  // No more than the running batch can use: max_running requests of the full context.
  int blocks = engine::kv_pages(static_cast<std::int64_t>(cfg_.max_running) * ctx, bt);
  // The gear's cap: a fraction of each device's free memory, so that a
  // shadow domain built beside this one still finds room for its own.
  // What one request of the full context holds at its peak.
  const int one_request = engine::kv_pages(engine::peak_kv_tokens(1, ctx, ctx), bt);
  auto cap = [&](const std::string& device, std::uint64_t room, const char* what, std::uint64_t per) {
    const int fit = static_cast<int>(
        std::min(gear.kv_cache_cap * static_cast<double>(room) / static_cast<double>(per), static_cast<double>(blocks)));
    if (fit < one_request)
      throw InputError("gear " + gear.name + ": device " + device + " has " + std::to_string(room) + " " + what +
                       "; its KV pool at kv_cache_cap " + fmt(gear.kv_cache_cap) + " holds " + std::to_string(fit) +
                       " pages of " + std::to_string(bt) + " tokens, fewer than one request of the full context needs (" +
                       std::to_string(one_request) + ")");
    blocks = std::min(blocks, fit);
  };
  if (!gpu_room.empty()) {
    // A device backend (CUDA): its GPUs' share for each rank (gpu_kv_room);
    // the host's virtual devices do not hold these pages.
    std::size_t i = 0;
    for (std::size_t s = 0; s < stages.size(); ++s)
      for (int r = 0; r < stages[s].tp && i < gpu_room.size(); ++r, ++i) {
        const int gpu = stages[s].gpus.empty() ? 0 : stages[s].gpus[static_cast<std::size_t>(r)];
        cap(rep.stages[s].devices[static_cast<std::size_t>(r)] + " (cuda:" + std::to_string(gpu) + ")", gpu_room[i],
            "bytes free for this rank's KV once the weights are there",
            engine::kv_block_bytes_per_rank(model_.hparams, stages[s], bt));
      }
    return blocks;
  }
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const std::uint64_t per = engine::kv_block_bytes_per_rank(model_.hparams, stages[s], bt);
    for (std::size_t r = 0; r < stages[s].devices.size(); ++r)
      cap(rep.stages[s].devices[r], stages[s].devices[r]->memory_available(), "bytes free", per);
  }
  return blocks;
}

std::vector<std::shared_ptr<DomainRunner>> Service::build_domains(const doc::Gear& gear, bool slow_start) {
  std::vector<std::shared_ptr<DomainRunner>> out;
  // Every replica's layout first: the GPUs' KV room is shared out among all
  // the gear's ranks on each GPU before any of them takes its pages.
  std::vector<engine::DomainConfig> configs;
  std::vector<std::vector<std::string>> device_names;
  for (const auto& rep : gear.replicas) {
    engine::DomainConfig dc;
    std::vector<std::string> devices;
    dc.stages.clear();
    for (const auto& st : rep.stages) {
      engine::StageLayout sl{st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), {}};
      for (const auto& name : st.devices) {
        auto it = vdevs_.find(name);
        if (it != vdevs_.end()) sl.devices.push_back(it->second.get());
      }
      if (sl.devices.size() != st.devices.size()) sl.devices.clear();  // not all virtual: unaccounted
      if (cfg_.backend == "cuda")
        for (const auto& name : st.devices) sl.gpus.push_back(gpu_ordinal(name));
      dc.stages.push_back(std::move(sl));
      devices.insert(devices.end(), st.devices.begin(), st.devices.end());
    }
    configs.push_back(std::move(dc));
    device_names.push_back(std::move(devices));
  }
  const std::vector<std::vector<std::uint64_t>> gpu_room = gpu_kv_room(configs);
  for (std::size_t ri = 0; ri < gear.replicas.size(); ++ri) {
    const auto& rep = gear.replicas[ri];
    engine::DomainConfig& dc = configs[ri];
    const std::vector<std::string>& devices = device_names[ri];
    dc.kv_blocks = kv_blocks_for(gear, rep, dc.stages, gpu_room[ri]);
    dc.block_tokens = cfg_.block_tokens;
    dc.max_batched_tokens = std::min(cfg_.max_batched_tokens, gear.max_batched_tokens);
    dc.max_running = cfg_.max_running;
    dc.micro_batches = gear.micro_batches;
    dc.backend = backend_;
    std::string id;
    {
      std::lock_guard lk(mu_);
      id = "d" + std::to_string(next_domain_++);
    }
    engine::Domain::EngineFactory make;
    if (cfg_.engine_factory)
      make = [this, &rep](const engine::DomainConfig& c) { return cfg_.engine_factory(rep, c); };
    else
      make = engine::Domain::real_engine(*store_);
    auto d = std::make_shared<DomainRunner>(id, gear.name, devices, model_.hparams, dc, make, cfg_.step_observer);
    if (slow_start) d->slow_start(std::max(1, cfg_.max_running * 7 / 10), cfg_.slow_start_steps);
    out.push_back(std::move(d));
  }
  // Warm-up: one dummy request through every stage and rank of each domain.
  for (auto& d : out) {
    auto done = std::make_shared<std::promise<std::string>>();
    engine::GenerationRequest r;
    r.id = "warmup-" + d->id();
    r.prompt = {tok_->bos() >= 0 ? tok_->bos() : 0};
    r.max_tokens = 1;
    r.on_event = [done](const engine::GenerationEvent& e) {
      if (e.finished) done->set_value(e.finish_reason == "error" ? e.error : "");
    };
    d->submit(std::move(r));
    std::string err = done->get_future().get();
    if (!err.empty()) throw ControlError("ftp.WarmupFailed", "domain " + d->id() + " failed its warm-up: " + err);
  }
  return out;
}

void Service::start() {
  const doc::Gear* g = cfg_.gears.find(cfg_.start_gear);
  auto doms = build_domains(*g, false);
  {
    std::lock_guard lk(mu_);
    gear_ = g->name;
    for (auto& d : doms) {
      d->set_state("serving");
      d->set_weight(1.0 / static_cast<double>(doms.size()));
      domains_.push_back(d);
    }
  }
  accepting_ = true;
  ready_ = true;
}

void Service::drain_and_stop() {
  if (stopped_.exchange(true)) return;
  accepting_ = false;
  ready_ = false;
  // Wait for a shift in progress to end, then let every domain finish its work.
  std::lock_guard sl(shift_mu_);
  std::vector<std::shared_ptr<DomainRunner>> doms;
  {
    std::lock_guard lk(mu_);
    doms = domains_;
  }
  for (auto& d : doms) d->set_state("draining");
  if (!wait_drained(doms, cfg_.drain_timeout_ms)) {
    // Out of time: the requests still running end with an error event (none
    // is dropped without one; the HTTP log names each), then the domains stop.
    const std::string why = "the service is stopping and the drain timeout of " +
                            std::to_string(cfg_.drain_timeout_ms) + " ms has passed";
    for (auto& d : doms) d->abort_all(why);
  }
  retire(doms);
}

void Service::retire(const std::vector<std::shared_ptr<DomainRunner>>& doms) {
  for (auto& d : doms) {
    d->stop();  // returns once its requests are done
    d->set_state("retired");
  }
  std::lock_guard lk(mu_);
  domains_.erase(std::remove_if(domains_.begin(), domains_.end(),
                                [&](const auto& d) { return std::find(doms.begin(), doms.end(), d) != doms.end(); }),
                 domains_.end());
}

std::shared_ptr<DomainRunner> Service::route(const CompletionRequest& r, int prompt_len) {
  std::lock_guard lk(mu_);
  std::vector<std::shared_ptr<DomainRunner>> cand;
  for (auto& d : domains_) {
    std::string st = d->state();
    if ((st == "serving" || st == "warming") && d->weight() > 0 && d->domain().failure().empty()) cand.push_back(d);
  }
  if (cand.empty()) return nullptr;
  if (r.priority > 0 || (cfg_.route_long_prompt_tokens > 0 && prompt_len >= cfg_.route_long_prompt_tokens)) {
    // High priority and long prompts go to the domain of the largest tensor-parallel degree.
    auto tp = [&](const DomainRunner& d) { return d.domain().config().stages.front().tp; };
    auto best = std::max_element(cand.begin(), cand.end(), [&](const auto& a, const auto& b) { return tp(*a) < tp(*b); });
    return *best;
  }
  // Smooth weighted round robin: deterministic, proportional to weights.
  double total = 0;
  std::shared_ptr<DomainRunner> pick;
  for (auto& d : cand) {
    credit_[d->id()] += d->weight();
    total += d->weight();
    if (!pick || credit_[d->id()] > credit_[pick->id()]) pick = d;
  }
  credit_[pick->id()] -= total;
  return pick;
}

int Service::max_prompt_tokens() const noexcept {
  const int ctx = context_length();
  return cfg_.max_prompt_tokens > 0 ? std::min(cfg_.max_prompt_tokens, ctx - 1) : ctx - 1;
}

void Service::check_prompt_bytes(std::size_t bytes) const {
  const std::size_t most = static_cast<std::size_t>(std::max(0, max_prompt_tokens())) * tok_->max_token_bytes();
  if (bytes > most)
    throw RequestError(400, "invalid_request_error", "prompt",
                       "this model's maximum prompt length is " + std::to_string(max_prompt_tokens()) +
                           " tokens; a prompt of " + std::to_string(bytes) + " bytes takes at least " +
                           std::to_string(bytes / tok_->max_token_bytes()) + " tokens",
                       "context_length_exceeded");
}

void Service::submit(CompletionRequest r) {
  if (!accepting_) throw RequestError(503, "unavailable_error", "", "the service is draining and accepts no new requests");
  std::vector<int> prompt = r.prompt_tokens;
  if (prompt.empty()) {
    check_prompt_bytes(r.prompt.size());
    try {
      prompt = tok_->encode_prompt(r.prompt);
    } catch (const InputError& e) {
      throw RequestError(400, "invalid_request_error", "prompt", e.what());
    }
  }
  const int ctx = context_length();
  const int max_prompt = max_prompt_tokens();
  const int n = static_cast<int>(prompt.size());
  if (n > max_prompt)
    throw RequestError(400, "invalid_request_error", "prompt",
                       "this model's maximum prompt length is " + std::to_string(max_prompt) + " tokens; the prompt has " +
                           std::to_string(n),
                       "context_length_exceeded");
  if (r.max_tokens < 1)
    throw RequestError(400, "invalid_request_error", "max_tokens", "max_tokens must be at least 1, got " + std::to_string(r.max_tokens));
  if (r.max_tokens > cfg_.max_tokens_limit)
    throw RequestError(400, "invalid_request_error", "max_tokens",
                       "max_tokens " + std::to_string(r.max_tokens) + " exceeds the limit of " +
                           std::to_string(cfg_.max_tokens_limit));
  if (static_cast<std::int64_t>(n) + r.max_tokens > ctx)
    throw RequestError(400, "invalid_request_error", "max_tokens",
                       "this model's maximum context length is " + std::to_string(ctx) + " tokens; the prompt (" +
                           std::to_string(n) + ") plus max_tokens (" + std::to_string(r.max_tokens) + ") exceed it",
                       "context_length_exceeded");

  struct Track {
    std::int64_t arrival_us, first_us = -1;  // the service's clock, microseconds: sub-ms TTFTs are not 0
    int tokens = 0;
    std::unique_ptr<TextStream> text;
  };
  auto tr = std::make_shared<Track>();
  tr->arrival_us = now_us();
  tr->text = std::make_unique<TextStream>(*tok_, prompt, r.stop);

  engine::GenerationRequest g;
  g.id = r.id;
  g.prompt = prompt;
  g.sampling = r.sampling;
  g.max_tokens = r.max_tokens;
  g.eos = eog_.eos;
  g.stop_tokens = eog_.stop_tokens;
  TextStream* ts = tr->text.get();
  // The text stream sees each token in the stop check (before its event),
  // so a stop string ends the request at the token that made it.
  g.stop_check = [ts](const std::vector<int>& out) {
    ts->feed(out.back());
    return ts->stopped();
  };
  auto on_event = r.on_event;
  // The domain that takes the request, set before it is queued there (the
  // events come after).
  auto where = std::make_shared<DomainRunner*>(nullptr);
  g.on_event = [this, tr, on_event, where, n](const engine::GenerationEvent& e) {
    DomainRunner* dp = *where;
    CompletionEvent ce;
    ce.request_id = e.request_id;
    ce.domain_id = e.domain_id;
    ce.prompt_tokens = n;
    const std::int64_t t_us = now_us(), t = t_us / 1000;
    auto ms_since = [t_us](std::int64_t us) { return static_cast<double>(t_us - us) / 1000.0; };
    if (e.token >= 0) {
      ++tr->tokens;
      ++tokens_out_;
      if (tr->first_us < 0) {
        tr->first_us = t_us;
        double ttft = ms_since(tr->arrival_us);
        ttft_.add(ttft, t);
        std::lock_guard lk(metrics_mu_);
        observe_ms(hist_[0], ttft);
      }
      if (!eog_.ends(e.token)) ce.text = tr->text->take();
    }
    ce.completion_tokens = tr->tokens;
    if (e.finished) {
      ce.text += tr->text->finish();
      ce.finished = true;
      ce.finish_reason = e.finish_reason;
      ce.error = e.error;
      double e2e = ms_since(tr->arrival_us);
      e2e_.add(e2e, t);
      dp->e2e.add(e2e, t);
      {
        std::lock_guard lk(metrics_mu_);
        finished_.emplace_back(t, n, tr->tokens);
        while (!finished_.empty() && std::get<0>(finished_.front()) < t - 60000) finished_.pop_front();
      }
      ++dp->served;
      if (e.finish_reason == "error") {
        ++dp->errors;
        ++requests_failed_;
      }
      std::lock_guard lk(metrics_mu_);
      observe_ms(hist_[2], e2e);
      if (tr->tokens > 1 && tr->first_us >= 0) {
        double tpot = ms_since(tr->first_us) / (tr->tokens - 1);
        tpot_.add(tpot, t);
        observe_ms(hist_[1], tpot);
      }
    }
    if (on_event && (ce.finished || !ce.text.empty())) on_event(ce);
  };
  // A domain can retire between route() and its submit (a shift's last
  // step, a drain, a rollback): it then refuses, and the request goes to
  // the domains that serve now.
  for (int attempt = 0;; ++attempt) {
    auto dom = route(r, n);
    if (!dom || attempt == 4) throw RequestError(503, "unavailable_error", "", "no serving domain");
    *where = dom.get();
    try {
      if (dom->submit(std::move(g))) break;
    } catch (const InputError& e) {
      throw RequestError(400, "invalid_request_error", "prompt", e.what());
    }
  }
  // Counted once accepted: a refused request is neither traffic nor load.
  {
    std::lock_guard lk(metrics_mu_);
    const std::int64_t arrival_ms = tr->arrival_us / 1000;
    arrivals_.push_back(arrival_ms);
    while (!arrivals_.empty() && arrivals_.front() < arrival_ms - 60000) arrivals_.pop_front();
  }
  ++requests_total_;
  tokens_in_ += static_cast<std::uint64_t>(n);
}

void Service::cancel(const std::string& request_id) {
  std::vector<std::shared_ptr<DomainRunner>> doms;
  {
    std::lock_guard lk(mu_);
    doms = domains_;
  }
  // The request is in one of them; the others forget the id at their next step.
  for (auto& d : doms) d->cancel(request_id);
}

void Service::set_weights(const std::vector<std::shared_ptr<DomainRunner>>& doms, double share) {
  for (auto& d : doms) d->set_weight(doms.empty() ? 0 : share / static_cast<double>(doms.size()));
}

bool Service::wait_drained(const std::vector<std::shared_ptr<DomainRunner>>& doms, int timeout_ms) {
  // A wait on the domains' threads, which run in real time.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (auto& d : doms)
    if (!d->wait_idle(deadline)) return false;
  return true;
}

doc::ShiftEvent Service::shift(const ShiftOptions& o, const ShiftProgress& progress) {
  std::unique_lock sl(shift_mu_, std::try_to_lock);
  if (!sl.owns_lock())
    throw ControlError("ftp.ShiftInProgress", "a shift is in progress; one shift at a time");
  reap_drained();
  const doc::Gear* target = cfg_.gears.find(o.to);
  if (!target) throw ControlError("ftp.NoSuchGear", "no gear \"" + o.to + "\" in the gear table", Exit::usage);
  if (!accepting_) throw ControlError("ftp.NotServing", "the service is draining");
  std::string from = current_gear();
  if (from == o.to && serving_domains() > 0)
    throw ControlError("ftp.SameGear", "already in gear \"" + o.to + "\"", Exit::usage);
  std::vector<double> ramp = o.ramp.empty() ? cfg_.ramp : o.ramp;
  check_ramp(ramp, "ramp");
  int step_ms = o.step_interval_ms >= 0 ? o.step_interval_ms : cfg_.step_interval_ms;

  shifting_ = true;
  struct Reset {
    std::atomic<bool>& f;
    ~Reset() { f = false; }
  } reset{shifting_};

  doc::ShiftEvent ev;
  {
    std::lock_guard lk(mu_);
    ev.shift_id = "shift-" + std::to_string(++next_shift_);
  }
  ev.from = from;
  ev.to = o.to;
  ev.trigger = o.trigger;
  const std::int64_t t_start = now_ms();
  doc::Percentiles before{e2e_.percentile(50, t_start - 60000), e2e_.percentile(99, t_start - 60000)};
  std::int64_t phase_us = cfg_.clock->now_us();
  auto emit = [&](const std::string& phase, double share, const std::string& msg) {
    ev.t_ms = now_ms();
    ev.phase = phase;
    ev.traffic_share = share;
    const std::int64_t t_us = cfg_.clock->now_us();
    ev.phase_ms = static_cast<double>(t_us - phase_us) / 1000.0;
    ev.message = msg;
    phase_us = t_us;
    if (progress) progress(ev);
  };

  std::vector<std::shared_ptr<DomainRunner>> old;
  {
    std::lock_guard lk(mu_);
    for (auto& d : domains_)
      if (d->state() == "serving") old.push_back(d);
  }
  std::vector<std::string> devs = target->devices();
  std::string devlist;
  for (const auto& d : devs) devlist += (devlist.empty() ? "" : ",") + d;
  // Release weight mode: fetch the target gear's weights ahead, so the
  // reload overlaps the reservation instead of the first steps.
  std::string reserve_msg = "devices " + devlist;
  if (target->weight_mode == "release" && store_) {
    auto bytes = for_each_rank(*target, [](const std::string&) { return true; },
                               [&](int f, int n, int tp, int r) { return store_->prefetch_rank(f, n, tp, r); });
    reserve_msg += "; weights prefetched: " + std::to_string(bytes) + " bytes";
  }
  emit("reserve", 0, reserve_msg);

  std::vector<std::shared_ptr<DomainRunner>> fresh;
  auto finish = [&](const std::string& outcome, const std::string& msg) {
    ev.outcome = outcome;
    ev.before = before;
    ev.after = doc::Percentiles{e2e_.percentile(50, t_start), e2e_.percentile(99, t_start)};
    emit("done", outcome == "committed" ? 1.0 : 0.0, msg);
    {
      std::lock_guard lk(mu_);
      records_.push_back(ev);
    }
    std::lock_guard lk(metrics_mu_);
    ++shifts_by_outcome_[outcome];
    return ev;
  };
  auto rollback = [&](const std::string& why, const std::string& outcome) {
    // Traffic returns to the old domains; the shadow drains and retires.
    set_weights(old, 1.0);
    set_weights(fresh, 0.0);
    for (auto& d : fresh) {
      d->set_state("draining");
      d->set_background();
    }
    emit("rollback", 0, why);
    // A shadow that cannot drain in time stays draining and retires at the
    // next shift or drain (reap_drained).
    if (wait_drained(fresh, cfg_.drain_timeout_ms)) retire(fresh);
    return finish(outcome, why);
  };

  try {
    fresh = build_domains(*target, true);
  } catch (const std::exception& e) {
    for (auto& d : fresh) d->stop();
    fresh.clear();
    return finish("failed", std::string("warm-up: ") + e.what());
  }
  {
    std::lock_guard lk(mu_);
    for (auto& d : fresh) domains_.push_back(d);
  }
  emit("warm", 0, std::to_string(fresh.size()) + " domain(s) built and warmed");

  bool fault = o.inject_fault == "check";
  for (double share : ramp) {
    std::int64_t step_start = now_ms();
    set_weights(fresh, share);
    set_weights(old, 1.0 - share);
    if (share >= 1.0) {
      emit("ramp", share, "100 % of new requests on the new domains");
      break;
    }
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    // The check: no failed request on the new domains, and their P99 E2E
    // within rollback_p99_factor of the pre-shift baseline.
    std::uint64_t errs = 0;
    double p99 = 0;
    std::size_t samples = 0;
    for (auto& d : fresh) {
      errs += d->errors.load();
      p99 = std::max(p99, d->e2e.percentile(99, step_start));
      samples += d->e2e.count(step_start);
    }
    std::string why;
    if (fault) why = "fault injected: check failed";
    else if (errs > 0) why = std::to_string(errs) + " request(s) failed on the new domains";
    else if (samples >= 20 && before.p99 > 0 && p99 > cfg_.rollback_p99_factor * before.p99)
      why = "P99 E2E " + fmt(p99) + " ms > " + fmt(cfg_.rollback_p99_factor) + " x baseline " + fmt(before.p99) + " ms";
    if (!why.empty()) return rollback(why, "rolled-back");
    emit("ramp", share, "check passed (" + std::to_string(samples) + " samples, P99 " + fmt(p99) + " ms)");
  }

  for (auto& d : old) {
    d->set_state("draining");
    d->set_weight(0);
    d->set_background();  // its last decodes yield to the new domain's first tokens
  }
  for (auto& d : fresh) d->set_state("serving");
  {
    std::lock_guard lk(mu_);
    gear_ = target->name;
  }
  bool drained = wait_drained(old, cfg_.drain_timeout_ms);
  emit("drain", 1.0,
       drained ? "old domains drained"
               : "drain timed out after " + std::to_string(cfg_.drain_timeout_ms) +
                     " ms; the old domains finish their requests in the background and retire at the next shift or "
                     "drain");
  std::string retire_msg;
  if (drained) {
    retire(old);
    retire_msg = std::to_string(old.size()) + " old domain(s) retired, devices released";
    // Release weight mode: devices that leave drop their weights.
    if (std::uint64_t bytes = release_weights_leaving(from); bytes > 0)
      retire_msg += "; weights released: " + std::to_string(bytes) + " bytes";
  } else {
    retire_msg = std::to_string(old.size()) + " old domain(s) still draining; none retired yet";
  }
  emit("retire", 1.0, retire_msg);
  return finish("committed", "shifted " + from + " -> " + target->name);
}

int Service::drain_domain(const std::string& id, bool force, int timeout_ms,
                          const std::function<void(const Json&)>& progress) {
  std::lock_guard sl(shift_mu_);  // not during a shift
  reap_drained();
  std::shared_ptr<DomainRunner> dom;
  std::vector<std::shared_ptr<DomainRunner>> others;
  {
    std::lock_guard lk(mu_);
    for (auto& d : domains_) {
      if (d->id() == id)
        dom = d;
      else if (d->state() == "serving")
        others.push_back(d);
    }
  }
  if (!dom) throw ControlError("ftp.NoSuchDomain", "no domain \"" + id + "\"", Exit::usage);
  if (others.empty() && !force)
    throw ControlError("ftp.LastDomain", "domain " + id + " is the last serving domain; use force to drain it anyway");
  dom->set_state("draining");
  dom->set_weight(0);
  dom->set_background();
  set_weights(others, 1.0);
  int waited = dom->inflight();
  if (progress) progress(Json{{"domain", id}, {"state", "draining"}, {"inflight", waited}});
  bool ok = wait_drained({dom}, timeout_ms);
  if (!ok) throw ControlError("ftp.DrainTimeout", "domain " + id + " still has " + std::to_string(dom->inflight()) +
                                                " request(s) after " + std::to_string(timeout_ms) + " ms",
                              Exit::timeout);
  retire({dom});
  if (progress) progress(Json{{"domain", id}, {"state", "retired"}, {"devices", dom->devices()}});
  return waited;
}

std::vector<std::string> Service::domains_on_devices(const std::vector<std::string>& devices) const {
  std::vector<std::string> out;
  std::lock_guard lk(mu_);
  for (auto& d : domains_)
    for (const auto& dev : d->devices())
      if (std::find(devices.begin(), devices.end(), dev) != devices.end()) {
        out.push_back(d->id());
        break;
      }
  return out;
}

void Service::check_model(const doc::GearTable& table) const {
  const auto& hp = model_.hparams;
  const auto& m = table.model;
  if (m.n_layers != hp.n_layer || m.n_heads != hp.n_head || m.n_kv_heads != hp.n_head_kv)
    throw InputError("gear table: model.n_layers/n_heads/n_kv_heads (" + std::to_string(m.n_layers) + "/" +
                     std::to_string(m.n_heads) + "/" + std::to_string(m.n_kv_heads) + ") do not match the model (" +
                     std::to_string(hp.n_layer) + "/" + std::to_string(hp.n_head) + "/" + std::to_string(hp.n_head_kv) +
                     ")");
}

void Service::reload(doc::GearTable table) {
  doc::validate(table);
  check_model(table);
  if (cfg_.reload_check) cfg_.reload_check(table);
  // Not during a shift: the control socket's loop and the signal thread
  // call this, and neither may wait for a shift's ramp.
  std::unique_lock sl(shift_mu_, std::try_to_lock);
  if (!sl.owns_lock())
    throw ControlError("ftp.ShiftInProgress", "a shift is in progress; reload the gear table after it");
  std::string cur = current_gear();
  if (!table.find(cur))
    throw ControlError("ftp.NoSuchGear", "the new gear table lacks the current gear \"" + cur + "\"", Exit::usage);
  std::lock_guard lk(mu_);
  cfg_.gears = std::move(table);
  ++table_generation_;
}

doc::GearTable Service::gear_table() const {
  std::lock_guard lk(mu_);
  return cfg_.gears;
}

int Service::serving_domains() const { return serving_domains_except({}); }

int Service::serving_domains_except(const std::vector<std::string>& ids) const {
  std::lock_guard lk(mu_);
  return static_cast<int>(std::count_if(domains_.begin(), domains_.end(), [&](const auto& d) {
    return d->state() == "serving" && d->domain().failure().empty() &&
           std::find(ids.begin(), ids.end(), d->id()) == ids.end();
  }));
}

void Service::reap_drained() {
  std::vector<std::shared_ptr<DomainRunner>> idle;
  {
    std::lock_guard lk(mu_);
    for (auto& d : domains_)
      if (d->state() == "draining" && d->inflight() == 0) idle.push_back(d);
  }
  retire(idle);
  std::vector<std::string> gears;
  for (const auto& d : idle)
    if (std::find(gears.begin(), gears.end(), d->gear()) == gears.end()) gears.push_back(d->gear());
  for (const auto& g : gears) release_weights_leaving(g);
}

std::uint64_t Service::release_weights_leaving(const std::string& gear) {
  const doc::Gear* from = cfg_.gears.find(gear);
  if (!from || from->weight_mode != "release" || !store_) return 0;
  // The devices of the domains that remain keep their weights.
  std::vector<std::string> keep;
  {
    std::lock_guard lk(mu_);
    for (const auto& d : domains_) keep.insert(keep.end(), d->devices().begin(), d->devices().end());
  }
  auto leaving = [&](const std::string& d) { return std::find(keep.begin(), keep.end(), d) == keep.end(); };
  return for_each_rank(*from, leaving, [&](int f, int n, int tp, int r) { return store_->release_rank(f, n, tp, r); });
}

Json Service::status() const {
  Json doms = Json::array();
  std::lock_guard lk(mu_);
  for (auto& d : domains_)
    doms.push_back(Json{{"id", d->id()},
                        {"gear", d->gear()},
                        {"state", d->state()},
                        {"devices", d->devices()},
                        {"traffic_share", d->weight()},
                        {"running", d->domain().running()},
                        {"waiting", d->domain().waiting()},
                        {"kv_usage", d->domain().kv_usage()},
                        {"kv_blocks", d->domain().config().kv_blocks},
                        {"failure", d->domain().failure().empty() ? Json() : Json(d->domain().failure())}});
  Json devs = Json::array();
  for (const auto& [name, d] : vdevs_)
    devs.push_back(Json{{"id", name}, {"threads", d->threads()}, {"cpus", d->cpus()},
                        {"memory_used", d->memory_used()}, {"memory_budget", d->memory_budget()}});
  return Json{{"kind", "ftp.status/v1"},
              {"devices", devs},
              {"model", cfg_.model_name},
              {"gear", gear_},
              {"shifting", shifting_.load()},
              {"ready", ready_.load()},
              {"accepting", accepting_.load()},
              {"requests_total", requests_total_.load()},
              {"requests_failed", requests_failed_.load()},
              {"domains", doms}};
}

Json Service::gears_json() const {
  std::lock_guard lk(mu_);
  Json j = doc::to_json(cfg_.gears);
  j["current"] = gear_;
  return j;
}

Json Service::records() const {
  Json out = Json::array();
  std::lock_guard lk(mu_);
  for (const auto& r : records_) out.push_back(doc::to_json(r));
  return out;
}

namespace {

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

doc::Observation Service::observe() const {
  doc::Observation o;
  o.t_ms = now_ms();
  o.shifting = shifting_.load();
  o.ttft_ms = {ttft_.percentile(50, o.t_ms - 30000), ttft_.percentile(99, o.t_ms - 30000)};
  o.tpot_ms = {tpot_.percentile(50, o.t_ms - 30000), tpot_.percentile(99, o.t_ms - 30000)};
  o.e2e_ms = {e2e_.percentile(50, o.t_ms - 30000), e2e_.percentile(99, o.t_ms - 30000)};
  std::vector<std::pair<std::string, double>> busy;  // domain id, busy s
  std::vector<std::vector<std::string>> busy_devices;
  {
    std::lock_guard lk(mu_);
    o.gear = gear_;
    for (auto& d : domains_) {
      doc::DomainView v;
      v.id = d->id();
      v.gear = d->gear();
      v.state = d->state();
      v.devices = d->devices();
      v.traffic_share = d->weight();
      v.running = d->domain().running();
      v.waiting = d->domain().waiting();
      o.queue_depth += v.waiting;
      o.kv_watermark = std::max(o.kv_watermark, d->domain().kv_usage());
      o.bubble_ratio = std::max(o.bubble_ratio, d->bubble_ratio());
      busy.emplace_back(d->id(), d->busy_s());
      busy_devices.push_back(d->devices());
      o.domains.push_back(std::move(v));
    }
  }
  std::lock_guard lk(metrics_mu_);
  std::size_t recent = std::count_if(arrivals_.begin(), arrivals_.end(), [&](auto t) { return t >= o.t_ms - 10000; });
  o.request_rate = static_cast<double>(recent) / 10.0;
  depth_samples_.emplace_back(o.t_ms, o.queue_depth);
  while (!depth_samples_.empty() && depth_samples_.front().first < o.t_ms - 30000) depth_samples_.pop_front();
  double sum = 0;
  for (const auto& [t, dep] : depth_samples_) sum += dep;
  o.queue_depth_mean = sum / static_cast<double>(depth_samples_.size());
  double p_sum = 0, out_sum = 0, n = 0;
  for (const auto& [t, p, out] : finished_)
    if (t >= o.t_ms - 60000) {
      p_sum += p;
      out_sum += out;
      ++n;
    }
  if (n > 0) {
    o.mean_prompt_tokens = p_sum / n;
    o.mean_output_tokens = out_sum / n;
  }
  double mean_service_ms = e2e_.count(o.t_ms - 30000) ? e2e_.percentile(50, o.t_ms - 30000) : 0;
  o.est_queue_time_ms = mean_service_ms * o.queue_depth;
  // Contention: the share of CPU time taken by other processes (and steal)
  // over the last 5 min (ARCHITECTURE.md section 4), from /proc samples kept
  // at each observation, whoever asked for it.
  std::uint64_t total = 0, cbusy = 0, self = 0;
  if (read_cpu_ticks(total, cbusy, self)) {
    cpu_samples_.push_back(CpuSample{o.t_ms, total, cbusy, self});
    while (cpu_samples_.size() > 2 && cpu_samples_[1].t_ms <= o.t_ms - kContentionWindowMs) cpu_samples_.pop_front();
    const CpuSample& a = cpu_samples_.front();
    if (cpu_samples_.size() > 1 && total > a.total) {
      double others = static_cast<double>(cbusy - a.busy) - static_cast<double>(self - a.self);
      o.contention_index = std::clamp(others / static_cast<double>(total - a.total), 0.0, 1.0);
    }
  }
  // Utilization of each device: the share of time its domain was stepping.
  for (std::size_t i = 0; i < busy.size(); ++i) {
    auto [it, fresh] = busy_seen_.emplace(busy[i].first, std::make_pair(o.t_ms, busy[i].second));
    double util = 0;
    if (!fresh && o.t_ms > it->second.first)
      util = std::clamp((busy[i].second - it->second.second) * 1000.0 / static_cast<double>(o.t_ms - it->second.first), 0.0, 1.0);
    it->second = {o.t_ms, busy[i].second};
    for (const auto& dev : busy_devices[i]) {
      auto d = std::find_if(o.devices.begin(), o.devices.end(), [&](const auto& x) { return x.id == dev; });
      if (d == o.devices.end())
        o.devices.push_back(doc::DeviceLoad{dev, util});
      else
        d->utilization = std::min(1.0, d->utilization + util);
    }
  }
  return o;
}

std::string Service::prometheus() const {
  std::ostringstream m;
  auto st = status();
  int running = 0, waiting = 0;
  double kv = 0;
  std::map<std::string, int> by_state = {{"warming", 0}, {"serving", 0}, {"draining", 0}, {"retired", 0}};
  for (const auto& d : st["domains"]) {
    running += d["running"].get<int>();
    waiting += d["waiting"].get<int>();
    kv = std::max(kv, d["kv_usage"].get<double>());
    ++by_state[d["state"].get<std::string>()];
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
    << "ftp_gear_info{gear=\"" << backslash_escape(st["gear"].get<std::string>()) << "\"} 1\n";
  m << "# HELP ftp_domains Domains by state.\n# TYPE ftp_domains gauge\n";
  for (const auto& [s, n] : by_state) m << "ftp_domains{state=\"" << s << "\"} " << n << "\n";
  std::lock_guard lk(metrics_mu_);
  m << "# HELP ftp_shifts_total Shifts by outcome.\n# TYPE ftp_shifts_total counter\n";
  for (const char* o : {"committed", "rolled-back", "failed"}) {
    auto it = shifts_by_outcome_.find(o);
    m << "ftp_shifts_total{outcome=\"" << o << "\"} " << (it == shifts_by_outcome_.end() ? 0 : it->second) << "\n";
  }
  const char* names[3] = {"ftp_ttft_seconds", "ftp_tpot_seconds", "ftp_e2e_seconds"};
  const char* helps[3] = {"Time to first token.", "Time per output token after the first.", "End-to-end request latency."};
  for (int i = 0; i < 3; ++i) {
    const Histogram& h = hist_[i];
    m << "# HELP " << names[i] << " " << helps[i] << "\n# TYPE " << names[i] << " histogram\n";
    std::uint64_t acc = 0;
    for (std::size_t b = 0; b < kBoundsMs.size(); ++b) {
      acc += h.counts[b];
      m << names[i] << "_bucket{le=\"" << fmt(kBoundsMs[b] / 1000.0) << "\"} " << acc << "\n";
    }
    acc += h.counts.back();
    m << names[i] << "_bucket{le=\"+Inf\"} " << acc << "\n";
    m << names[i] << "_sum " << prom(h.sum / 1000.0) << "\n" << names[i] << "_count " << h.count << "\n";
  }
  return m.str();
}

}  // namespace ftp::serve
