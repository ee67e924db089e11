// SPDX-License-Identifier: Apache-2.0
#include "core/number.hpp"
#include "serve/service.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/rank_backend.hpp"
#include "member/gather.hpp"
#include "member/spanning.hpp"
#include "plan/device_memory.hpp"
#include "serve/domain_runner.hpp"
#include "serve/generate.hpp"
#include "topology/probe.hpp"

namespace ftp::serve {

namespace {

using json::Json;

DevicePool::Kind pool_kind(const ServiceConfig& c) {
  if (c.engine_factory) return DevicePool::Kind::named;
  return c.backend == "cuda" ? DevicePool::Kind::cuda : DevicePool::Kind::cpu;
}

}  // namespace

Service::Service(const model::Model& model, ServiceConfig config)
    : model_(model), cfg_(std::move(config)), tok_(model::tokenizer_of(model)),
      eog_(end_of_generation(model, *tok_)), telemetry_(cfg_.model_name, context_length()),
      admission_(cfg_.admission), router_(cfg_.route_long_prompt_tokens) {
  if (!cfg_.clock) cfg_.clock = std::make_shared<control::SystemClock>();
  t0_us_ = cfg_.clock->now_us();
  check_model(cfg_.gears);
  doc::validate(cfg_.gears);
  if (cfg_.start_gear.empty()) cfg_.start_gear = cfg_.gears.gears.at(0).name;
  if (!cfg_.gears.find(cfg_.start_gear))
    throw ControlError("ftp.NoSuchGear", "--start-gear: no gear \"" + cfg_.start_gear + "\" in the gear table",
                       Exit::usage);
  if (cfg_.device_memory) {
    auto no = [](const std::string& why) { throw InputError("--device-memory: " + why); };
    if (cfg_.engine_factory) no("the simulated engine holds no weights (it needs the real engine)");
    if (cfg_.backend != "cpu")
      no("it imitates a GPU's memory on CPU virtual devices (--backend cpu), not backend " + cfg_.backend);
    if (cfg_.members) no("members hold their own weights; it runs in one process only");
    // A device's TP-2t shard inside its TP-t shard: its copy is the union of the shards it serves.
    plan::nest_ranks(cfg_.gears);
  }
  if (!cfg_.engine_factory) {
    // Fails here, before anything is served, where the backend cannot run
    // (a build without CUDA, no GPU): a BackendError naming why.
    backend_ = &engine::backend_named(cfg_.backend);
    store_ = std::make_unique<engine::WeightStore>(model);
    // Release weight mode frees the mapped pages the domains read: with any
    // gear in that mode, the CPU backend reads the mapped tensors, not a
    // packed copy (WeightStore::use_release_mode).
    for (const auto& g : cfg_.gears.gears)
      if (g.weight_mode == "release") store_->use_release_mode();
  }
  pool_ = std::make_unique<DevicePool>(pool_kind(cfg_), cfg_.gears, cfg_.virtual_devices,
                                       cfg_.topology ? &*cfg_.topology : nullptr, cfg_.virtual_device_memory);
  if (cfg_.members) {
    pool_->set_machine_name(cfg_.machine_name);
    member_hook_ = std::make_shared<MemberHook>();
    member_hook_->service = this;
    for (const auto& m : cfg_.members->members()) on_member(m);
    cfg_.members->on_change([hook = member_hook_](const member::MemberInfo& m) {
      std::lock_guard lk(hook->mu);
      if (hook->service) hook->service->on_member(m);
    });
  }
  pool_->canonicalize(cfg_.gears);  // "GPU-<uuid>", "cuda:1" -> the pool's "gpu1"
  // GPU ranks nest too (a TP-2t shard inside the TP-t one): each GPU's union is its largest shard.
  if (pool_->kind() == DevicePool::Kind::cuda) plan::nest_ranks(cfg_.gears);
  if (pool_->kind() == DevicePool::Kind::cuda) gpu_signals_ = hardware::nvml::GpuSignals::open();
  pool_->check(cfg_.gears);
  output_ = std::make_unique<OutputProcessor>(*tok_, eog_, telemetry_, [this] { return now_us(); });
  ShifterConfig sc;
  sc.ramp = cfg_.ramp;
  sc.step_interval_ms = cfg_.step_interval_ms;
  sc.rollback_p99_factor = cfg_.rollback_p99_factor;
  sc.drain_timeout_ms = cfg_.drain_timeout_ms;
  if (store_)
    weights_ = std::make_unique<WeightResidency>(*store_, backend_, *pool_,
                                                 [this](const DeviceBinding& b, const doc::Gear& g) { return shards_of(b, g); });
  shifter_ = std::make_unique<Shifter>(
      domains_, telemetry_, *pool_, weights_.get(), *cfg_.clock, [this] { return now_ms(); },
      [this](const doc::Gear& g, bool slow, WarmUpFacts& warm) { return build_domains(g, slow, warm); },
      [this](const std::string& name) { return find_gear(name); }, sc,
      [this](const std::string& id) {
        std::lock_guard lk(route_mu_);
        router_.forget(id);
      });
  if (backend_) shifter_->set_communicator_stats([b = backend_] { return b->communicator_stats(); });
  if (!cfg_.state_dir.empty()) {
    journal_ = std::make_unique<Journal>(cfg_.state_dir);
    interrupted_ = journal_->recover();
    shifter_->set_journal(journal_.get());
  }
  reruns_ = std::make_unique<Reruns>();
}

Service::~Service() {
  if (member_hook_) {
    std::lock_guard lk(member_hook_->mu);
    member_hook_->service = nullptr;
  }
  drain_and_stop();
  reruns_.reset();  // gives up the requests still waiting for a domain
}

void Service::on_member(const member::MemberInfo& m) {
  if (m.alive) {
    pool_->member_joined(m.name, m.devices);
    return;
  }
  pool_->member_lost(m.name, m.lost_why);
  // Its domains' requests end now with an error event; the domains fail
  // (their engine names the member) and take no new ones.
  for (const auto& id : domains_.on_devices(m.devices))
    if (auto d = domains_.find(id)) d->abort_all("member " + m.name + " lost (" + m.lost_why + ")");
}

int Service::context_length() const noexcept { return model_.hparams.n_ctx_train; }

std::int64_t Service::now_us() const { return cfg_.clock->now_us() - t0_us_; }

std::int64_t Service::now_ms() const { return now_us() / 1000; }

std::optional<doc::Gear> Service::find_gear(const std::string& name) const {
  std::lock_guard lk(table_mu_);
  const doc::Gear* g = cfg_.gears.find(name);
  return g ? std::optional<doc::Gear>(*g) : std::nullopt;
}

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
                       "; its KV pool at kv_cache_cap " + number_text(gear.kv_cache_cap) + " holds " + std::to_string(fit) +
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

DomainList Service::build_domains(const doc::Gear& gear, bool slow_start, WarmUpFacts& warm) {
  DomainList out;
  // Replicas with ranks on members' devices, by index: their stages by name.
  std::map<std::size_t, member::SpanningDomain> spanning;
  // Every replica's layout first: the GPUs' KV room is shared out among all
  // the gear's ranks on each GPU before any of them takes its pages.
  std::vector<engine::DomainConfig> configs;
  std::vector<std::vector<std::string>> device_names;
  for (const auto& rep : gear.replicas) {
    engine::DomainConfig dc;
    std::vector<std::string> devices;
    dc.stages.clear();
    member::SpanningDomain span;
    span.kv_dtype = cfg_.kv_dtype;
    for (const auto& st : rep.stages) {
      engine::StageLayout sl{st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), {}};
      sl.kv_dtype = cfg_.kv_dtype;
      span.stages.push_back({st.first_layer, st.n_layers, st.devices});
      for (const auto& name : st.devices) {
        const DeviceBinding b = pool_->bind(name);  // throws for a name the pool lacks
        if (!b.member.empty()) spanning[configs.size()] = span;
        if (b.virtual_device) sl.devices.push_back(b.virtual_device);
        if (b.gpu >= 0) sl.gpus.push_back(b.gpu);
      }
      // CPU virtual devices are accounted; GPUs keep their own memory (gpu_kv_room).
      if (sl.devices.size() != st.devices.size()) sl.devices.clear();
      if (sl.gpus.size() != st.devices.size()) sl.gpus.clear();
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
    const std::string id = domains_.next_id();
    engine::Domain::EngineFactory make;
    if (cfg_.engine_factory) {
      make = [this, &rep](const engine::DomainConfig& c) { return cfg_.engine_factory(rep, c); };
    } else if (auto sp = spanning.find(ri); sp != spanning.end()) {
      member::SpanningDomain span = sp->second;
      span.stages.clear();
      for (const auto& st : rep.stages) span.stages.push_back({st.first_layer, st.n_layers, st.devices});
      span.id = id;
      make = [this, span](const engine::DomainConfig& c) mutable {
        span.kv_blocks = c.kv_blocks;
        span.block_tokens = c.block_tokens;
        span.max_rows = c.max_batched_tokens;
        return member::build_spanning_engine(
            *cfg_.members, cfg_.machine_name, *store_, span,
            [this](const std::string& name) { return pool_->bind(name).virtual_device; }, backend_, cfg_.gloo);
      };
    } else
      make = engine::Domain::real_engine(*store_);
    // Warm-up (engine::Domain::warm_up), before the domain's thread starts
    // and before anything can route to it: dummy requests at each decode
    // batch size its backend wants warmed (the CUDA graphs' sizes; powers
    // of two on CPU), after one prefill of the step's token budget. They
    // reach no client, telemetry, admission or router; their KV pages are
    // free again when it returns. An engine factory's domains (the
    // simulated engine) run one dummy request through every stage.
    engine::WarmUpPlan plan;
    plan.token = tok_->bos() >= 0 ? tok_->bos() : 0;
    if (cfg_.engine_factory || !backend_) {
      plan.batch_sizes = {1};
    } else {
      plan.batch_sizes = backend_->warm_batch_sizes(dc.max_running);
      plan.prefill_tokens = dc.max_batched_tokens;
    }
    const std::uint64_t graphs_before = backend_ ? backend_->graphs_captured() : 0;
    std::shared_ptr<DomainRunner> d;
    try {
      d = std::make_shared<DomainRunner>(id, gear.name, devices, model_.hparams, dc, make, cfg_.step_observer, plan);
    } catch (...) {
      for (auto& x : out) {
        x->stop();
        pool_->release(x->id());
      }
      try {
        throw;
      } catch (const engine::WarmUpError& e) {
        throw ControlError("ftp.WarmupFailed", e.what());
      }
    }
    if (backend_) warm.graphs_captured += backend_->graphs_captured() - graphs_before;
    warm.ms += d->warmed().ms;
    for (int b : d->warmed().batch_sizes)
      if (std::find(warm.batch_sizes.begin(), warm.batch_sizes.end(), b) == warm.batch_sizes.end()) warm.batch_sizes.push_back(b);
    // After the warm-up: its steps do not use up the slow start's.
    if (slow_start) d->slow_start(std::max(1, cfg_.max_running * 7 / 10), cfg_.slow_start_steps);
    pool_->lease(id, devices);
    out.push_back(std::move(d));
  }
  std::sort(warm.batch_sizes.begin(), warm.batch_sizes.end());
  return out;
}

void Service::check_table_fits() const {
  if (!store_) return;  // an engine factory's devices hold nothing of ours
  plan::ModelShape shape = plan::model_shape_of(model_, cfg_.model_name);
  shape.kv_dtype = std::string(engine::to_string(engine::resolve_kv_dtype(cfg_.kv_dtype, store_->matrix_dtype())));
  doc::Topology topo;
  topo.devices = pool_->devices();
  plan::Workload w;
  w.max_batched_tokens = cfg_.max_batched_tokens;
  // The least a domain is built with: one request of the full context.
  std::lock_guard lk(table_mu_);
  const auto mem = plan::device_memory(shape, cfg_.gears, topo, w, 1, context_length());
  if (const plan::DeviceMemory* d = plan::first_short(mem))
    throw InputError("the gear table does not fit device " + d->device + ": it needs " +
                     std::to_string(static_cast<std::uint64_t>(d->need())) + " bytes (weights " +
                     std::to_string(static_cast<std::uint64_t>(d->weights)) +
                     " as the union of its shards over the gears, KV " + std::to_string(static_cast<std::uint64_t>(d->kv)) +
                     " for one request of the full context at its gears' kv_cache_cap, activations " +
                     std::to_string(static_cast<std::uint64_t>(d->activations)) + ", CUDA graphs " +
                     std::to_string(static_cast<std::uint64_t>(d->graphs)) + ", NCCL buffers " +
                     std::to_string(static_cast<std::uint64_t>(d->comm_buffers)) + "), " +
                     std::to_string(d->memory_bytes) + " bytes free");
}

std::map<hardware::VirtualDevice*, Service::DeviceShards> Service::device_shards(const doc::GearTable& table) const {
  std::map<hardware::VirtualDevice*, DeviceShards> out;
  for (const doc::Gear& g : table.gears)
    for (const doc::Replica& rep : g.replicas)
      for (std::size_t s = 0; s < rep.stages.size(); ++s) {
        const doc::Stage& st = rep.stages[s];
        const int tp = static_cast<int>(st.devices.size());
        for (int r = 0; r < tp; ++r)
          if (hardware::VirtualDevice* vd = pool_->bind(st.devices[static_cast<std::size_t>(r)]).virtual_device) {
            DeviceShards& d = out[vd];
            if (d.name.empty()) d.name = st.devices[static_cast<std::size_t>(r)];
            d.shards.push_back(engine::RankShard{st.first_layer, st.n_layers, tp, r, s == 0, s + 1 == rep.stages.size()});
          }
      }
  return out;
}

std::map<int, std::vector<engine::RankShard>> Service::gpu_shards(const doc::GearTable& table) const {
  std::map<int, std::vector<engine::RankShard>> out;
  for (const doc::Gear& g : table.gears) {
    if (g.weight_mode == "release") continue;  // uploaded by its ranks when built, freed at retire
    for (const doc::Replica& rep : g.replicas)
      for (std::size_t s = 0; s < rep.stages.size(); ++s) {
        const doc::Stage& st = rep.stages[s];
        const int tp = static_cast<int>(st.devices.size());
        for (int r = 0; r < tp; ++r) {
          const std::string& name = st.devices[static_cast<std::size_t>(r)];
          if (name.find('/') != std::string::npos) continue;  // a member's device: its own process uploads
          const DeviceBinding b = pool_->bind(name);
          if (b.gpu >= 0)
            out[b.gpu].push_back(engine::RankShard{st.first_layer, st.n_layers, tp, r, s == 0, s + 1 == rep.stages.size()});
        }
      }
  }
  return out;
}

std::vector<engine::RankShard> Service::shards_of(const DeviceBinding& b, const doc::Gear& gear) const {
  std::lock_guard lk(table_mu_);
  if (b.virtual_device) {
    // The union over the table in force, as at start (a reload may have changed it).
    auto all = device_shards(cfg_.gears);
    auto it = all.find(b.virtual_device);
    return it == all.end() ? std::vector<engine::RankShard>{} : it->second.shards;
  }
  // A GPU: the resident gears' union, as at start, and the shards `gear` puts there.
  std::vector<engine::RankShard> out = gpu_shards(cfg_.gears)[b.gpu];
  if (gear.weight_mode == "release") {
    doc::GearTable one;
    one.gears = {gear};
    one.gears[0].weight_mode = "resident";
    for (const auto& sh : gpu_shards(one)[b.gpu]) out.push_back(sh);
  }
  return out;
}

void Service::copy_weights_to_devices() {
  if (store_ && backend_ && pool_->kind() == DevicePool::Kind::cuda) {
    // Each GPU holds the union of the shards its ranks serve over the
    // table, uploaded once, before the first domain (issue 17).
    std::lock_guard lk(table_mu_);
    backend_->make_resident(*store_, gpu_shards(cfg_.gears));
    return;
  }
  if (!cfg_.device_memory || !store_ || store_->device_memory()) return;
  std::lock_guard lk(table_mu_);
  for (const auto& [vd, d] : device_shards(cfg_.gears)) store_->copy_to_device(*vd, d.shards);
}

std::vector<std::vector<engine::RankSpec>> Service::stage_groups(const doc::GearTable& table) const {
  std::vector<std::vector<engine::RankSpec>> out;
  for (const doc::Gear& g : table.gears)
    for (const doc::Replica& rep : g.replicas)
      for (const doc::Stage& st : rep.stages) {
        std::vector<engine::RankSpec> specs;
        bool member = false;
        for (std::size_t r = 0; r < st.devices.size(); ++r) {
          // A member's device ("n1/vd0"): its stage meets over Gloo, and the member may not have joined yet.
          if (st.devices[r].find('/') != std::string::npos) {
            member = true;
            break;
          }
          const DeviceBinding b = pool_->bind(st.devices[r]);
          engine::RankSpec rs;
          rs.rank = static_cast<int>(r);
          rs.tp = static_cast<int>(st.devices.size());
          rs.device = b.virtual_device;
          rs.gpu = b.gpu;
          specs.push_back(rs);
        }
        if (!member) out.push_back(std::move(specs));  // a stage across processes meets over Gloo
      }
  return out;
}

void Service::prepare_communicators() {
  if (!backend_ || !store_ || cfg_.engine_factory) return;
  std::vector<std::vector<engine::RankSpec>> groups;
  {
    std::lock_guard lk(table_mu_);
    groups = stage_groups(cfg_.gears);
  }
  backend_->prepare_communicators(groups);
}

void Service::start() {
  check_table_fits();
  copy_weights_to_devices();
  prepare_communicators();
  const std::optional<doc::Gear> g = find_gear(cfg_.start_gear);
  DomainList doms = build_domains(*g, false, start_warm_);
  for (auto& d : doms) {
    d->set_state(doc::DomainState::serving);
    d->set_weight(1.0 / static_cast<double>(doms.size()));
  }
  domains_.add(doms);
  domains_.set_gear(g->name);
  accepting_ = true;
  ready_ = true;
}

void Service::drain_and_stop() {
  if (stopped_.exchange(true)) return;
  accepting_ = false;
  ready_ = false;
  shifter_->drain_all();
}

std::shared_ptr<DomainRunner> Service::route(const CompletionRequest& r, int prompt_len) {
  std::vector<std::shared_ptr<DomainRunner>> doms;
  std::vector<control::RouteCandidate> cands;
  for (auto& d : domains_.all()) {
    const doc::DomainState st = d->state();
    // A shadow takes its ramp share while it is still warming.
    if ((st == doc::DomainState::serving || st == doc::DomainState::warming) && d->weight() > 0 &&
        d->domain().failure().empty()) {
      cands.push_back(control::RouteCandidate{d->id(), d->weight(), d->tp()});
      doms.push_back(d);
    }
  }
  std::lock_guard lk(route_mu_);
  const int i = router_.pick(cands, control::RouteRequest{r.priority, prompt_len});
  return i < 0 ? nullptr : doms[static_cast<std::size_t>(i)];
}

int Service::max_prompt_tokens() const noexcept {
  const int ctx = context_length();
  return cfg_.max_prompt_tokens > 0 ? std::min(cfg_.max_prompt_tokens, ctx - 1) : ctx - 1;
}

void Service::check_prompt_bytes(std::size_t bytes) const {
  const std::size_t most = static_cast<std::size_t>(std::max(0, max_prompt_tokens())) * tok_->max_token_bytes();
  if (bytes > most)
    throw RequestError(Refusal::context_exceeded, "prompt",
                       "this model's maximum prompt length is " + std::to_string(max_prompt_tokens()) +
                           " tokens; a prompt of " + std::to_string(bytes) + " bytes takes at least " +
                           std::to_string(bytes / tok_->max_token_bytes()) + " tokens");
}

void Service::check_generation_fields(const CompletionRequest& r) const {
  auto bad = [](const char* param, const std::string& msg) {
    throw RequestError(Refusal::invalid_input, param, std::string(param) + ": " + msg);
  };
  if (r.n < 1 || r.n > cfg_.max_running)
    bad("n", "must be between 1 and " + std::to_string(cfg_.max_running) + " (--max-running), got " + std::to_string(r.n));
  if (r.min_tokens < 0 || r.min_tokens > r.max_tokens)
    bad("min_tokens", "must be between 0 and max_tokens (" + std::to_string(r.max_tokens) + "), got " +
                          std::to_string(r.min_tokens));
  if (r.logprobs < -1 || r.logprobs > engine::kMaxTopLogprobs)
    bad("logprobs", "must be between 0 and " + std::to_string(engine::kMaxTopLogprobs) + ", got " + std::to_string(r.logprobs));
  const int vocab = model_.hparams.n_vocab;
  for (std::size_t i = 0; i < r.stop_token_ids.size(); ++i)
    if (r.stop_token_ids[i] < 0 || r.stop_token_ids[i] >= vocab)
      throw RequestError(Refusal::invalid_input, "stop_token_ids",
                         "stop_token_ids[" + std::to_string(i) + "]: token id " + std::to_string(r.stop_token_ids[i]) +
                             " outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
  if (!(r.sampling.repetition_penalty > 0.0f))
    bad("repetition_penalty", "must be greater than 0, got " + std::to_string(r.sampling.repetition_penalty));
}

int Service::retry_after_s() const {
  const double p50_ms = telemetry_.e2e_since(now_ms() - 30000).p50;
  return std::clamp(static_cast<int>(std::ceil(p50_ms / 1000.0)), 1, 60);
}

void Service::submit(CompletionRequest r) {
  try {
    admit_and_route(r);
  } catch (const Refused& e) {
    telemetry_.refused(e.reason());
    throw;
  } catch (const RequestError&) {
    telemetry_.invalid_request();
    throw;
  }
}

struct Service::Placed {
  CompletionRequest request;  ///< without its prompt text; on_event gives back the ticket
  std::vector<int> prompt;
  std::int64_t arrival_ms = 0, arrival_us = 0;
  int reruns = 0;             ///< runs after the first (at most kMaxReruns)
  std::atomic<bool> scheduled{false};
  std::shared_ptr<std::shared_ptr<Admission::Ticket>> ticket;
};

namespace {
/// Runs of one request after its first: a request is not bounced between
/// failing domains for ever.
constexpr int kMaxReruns = 2;
}  // namespace

void Service::admit_and_route(CompletionRequest& r) {
  if (!accepting_) throw Refused(RefusalReason::draining, 1, "the service is draining and accepts no new requests");
  std::vector<int> prompt = r.prompt_tokens;
  if (prompt.empty()) {
    check_prompt_bytes(r.prompt.size());
    try {
      prompt = tok_->encode_prompt(r.prompt);
    } catch (const InputError& e) {
      throw RequestError(Refusal::invalid_input, "prompt", e.what());
    }
  }
  const int ctx = context_length();
  const int max_prompt = max_prompt_tokens();
  const int n = static_cast<int>(prompt.size());
  if (n > max_prompt)
    throw RequestError(Refusal::context_exceeded, "prompt",
                       "this model's maximum prompt length is " + std::to_string(max_prompt) + " tokens; the prompt has " +
                           std::to_string(n));
  if (r.max_tokens < 1)
    throw RequestError(Refusal::invalid_input, "max_tokens", "max_tokens must be at least 1, got " + std::to_string(r.max_tokens));
  if (r.max_tokens > cfg_.max_tokens_limit)
    throw RequestError(Refusal::invalid_input, "max_tokens",
                       "max_tokens " + std::to_string(r.max_tokens) + " exceeds the limit of " +
                           std::to_string(cfg_.max_tokens_limit));
  if (static_cast<std::int64_t>(n) + r.max_tokens > ctx)
    throw RequestError(Refusal::context_exceeded, "max_tokens",
                       "this model's maximum context length is " + std::to_string(ctx) + " tokens; the prompt (" +
                           std::to_string(n) + ") plus max_tokens (" + std::to_string(r.max_tokens) + ") exceed it");
  check_generation_fields(r);

  auto p = std::make_shared<Placed>();
  p->arrival_ms = now_ms();
  p->arrival_us = now_us();
  // Its place in the waiting queue, given back at its first event.
  p->ticket = std::make_shared<std::shared_ptr<Admission::Ticket>>();
  if (r.on_event)
    r.on_event = [ticket = p->ticket, next = std::move(r.on_event)](const CompletionEvent& e) {
      if (*ticket) (*ticket)->release();
      next(e);
    };
  r.prompt.clear();  // tokenised: a rerun needs only the tokens
  p->request = std::move(r);
  p->prompt = std::move(prompt);
  // The domain that takes the request, set before it is queued there (the
  // events come after).
  auto where = std::make_shared<DomainRunner*>(nullptr);
  engine::GenerationRequest g = engine_request(p, where);
  // A domain can retire between route() and its submit (a shift's last
  // step, a drain, a rollback): it then refuses, and the request goes to
  // the domains that serve now.
  for (int attempt = 0;; ++attempt) {
    auto dom = route(p->request, n);
    if (!dom || attempt == 4) throw Refused(RefusalReason::no_domain, 1, "no serving domain");
    *where = dom.get();
    *p->ticket = admission_.admit(dom->id(), n, retry_after_s());  // throws Refused past the bounds
    try {
      if (dom->submit(std::move(g))) break;
    } catch (const InputError& e) {
      (*p->ticket)->release();
      throw RequestError(Refusal::invalid_input, "prompt", e.what());
    }
    (*p->ticket)->release();
  }
  // Counted once accepted: a refused request is neither traffic nor load.
  telemetry_.request_accepted(p->arrival_ms, n);
}

engine::GenerationRequest Service::engine_request(const std::shared_ptr<Placed>& p,
                                                  const std::shared_ptr<DomainRunner*>& where) {
  engine::GenerationRequest g = output_->prepare(p->request, p->prompt, where, p->arrival_us);
  g.group = p->request.group;
  // Its queue time ends, and its place in the waiting queue is given back,
  // when it first joins a running batch.
  g.on_scheduled = [this, p] {
    if (*p->ticket) (*p->ticket)->release();
    if (!p->scheduled.exchange(true)) telemetry_.queued(static_cast<double>(now_ms() - p->arrival_ms));
  };
  // One run's state, on its domain's thread: whether a token came, and
  // whether the run was handed over to a rerun (its later events dropped).
  struct Run {
    bool streamed = false, handed_over = false;
  };
  g.on_event = [this, p, where, run = std::make_shared<Run>(),
                next = std::move(g.on_event)](const engine::GenerationEvent& e) {
    if (run->handed_over) return;
    if (e.finished && e.finish_reason == engine::FinishReason::withdrawn) {
      // Given back unstarted by a draining domain: placed on a serving one
      // (once, though each of its choices says so).
      run->handed_over = true;
      place_withdrawn(p, e.domain_id);
      return;
    }
    if (e.token >= 0) run->streamed = true;
    if (e.finished && e.finish_reason == engine::FinishReason::error && !run->streamed && *where &&
        rerun(p, **where, e)) {
      run->handed_over = true;
      return;
    }
    next(e);
  };
  return g;
}

bool Service::rerun(const std::shared_ptr<Placed>& p, DomainRunner& from, const engine::GenerationEvent& e) {
  // Only when the domain cannot run anything more (its engine failed:
  // a member lost, a step across processes broken): a request that fails
  // for its own sake, or a forced drain, ends as it did.
  if (from.domain().failure().empty() || !accepting_ || p->reruns >= kMaxReruns || !reruns_) return false;
  ++p->reruns;
  if (*p->ticket) (*p->ticket)->release();
  telemetry_.request_rerun();
  reruns_->add([this, p] { return place_again(p); },
               [this, p, why = e.error](const std::string& gave_up) { fail_placed(p, why + "; not run again: " + gave_up); },
               cfg_.rerun_wait_ms);
  return true;
}

void Service::place_withdrawn(const std::shared_ptr<Placed>& p, const std::string& from) {
  if (*p->ticket) (*p->ticket)->release();
  telemetry_.request_moved();
  const std::string why = "withdrawn unstarted from draining domain " + from;
  if (!reruns_) return fail_placed(p, why + "; the service is stopping");
  reruns_->add([this, p] { return place_again(p); },
               [this, p, why](const std::string& gave_up) { fail_placed(p, why + "; not placed: " + gave_up); },
               cfg_.rerun_wait_ms);
}

bool Service::place_again(const std::shared_ptr<Placed>& p) {
  auto where = std::make_shared<DomainRunner*>(nullptr);
  engine::GenerationRequest g = engine_request(p, where);
  // Admitted already: never refused now, but it waits in its new domain's
  // queue, and the requests after it see it there (Admission::carry).
  const int n = static_cast<int>(p->prompt.size());
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto dom = route(p->request, n);
    if (!dom) return false;
    *where = dom.get();
    *p->ticket = admission_.carry(dom->id(), n);
    try {
      if (dom->submit(std::move(g))) return true;
    } catch (const InputError& e) {
      (*p->ticket)->release();
      fail_placed(p, std::string("run again on domain ") + dom->id() + ": " + e.what());
      return true;
    }
    (*p->ticket)->release();
  }
  return false;
}

void Service::fail_placed(const std::shared_ptr<Placed>& p, const std::string& error) {
  const int n = static_cast<int>(p->prompt.size());
  telemetry_.request_finished(now_ms(), n, 0, static_cast<double>(now_us() - p->arrival_us) / 1000.0, std::nullopt,
                              engine::FinishReason::error);
  if (!p->request.on_event) return;
  for (int c = 0; c < std::max(1, p->request.n); ++c) {
    CompletionEvent ce;
    ce.request_id = p->request.id;
    ce.choice = c;
    ce.prompt_tokens = n;
    ce.finished = true;
    ce.finish_reason = engine::FinishReason::error;
    ce.error = error;
    p->request.on_event(ce);
  }
}

void Service::cancel(const std::string& request_id) {
  // The request is in one of them; the others forget the id at their next step.
  for (auto& d : domains_.all()) d->cancel(request_id);
}

doc::ShiftEvent Service::shift(const ShiftOptions& o, const ShiftProgress& progress) {
  return shifter_->shift(o, progress, accepting_.load());
}

int Service::drain_domain(const std::string& id, bool force, int timeout_ms,
                          const std::function<void(const Json&)>& progress) {
  return shifter_->drain_domain(id, force, timeout_ms, progress);
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
  pool_->canonicalize(table);
  if (pool_->kind() == DevicePool::Kind::cuda) plan::nest_ranks(table);
  if (cfg_.device_memory) plan::nest_ranks(table);
  pool_->check(table);
  if (cfg_.reload_check) cfg_.reload_check(table);
  if (cfg_.device_memory && store_ && store_->device_memory())
    for (const auto& [vd, d] : device_shards(table))
      if (const std::string why = store_->missing_on_device(*vd, d.shards); !why.empty())
        throw InputError("the new gear table needs weights that device " + d.name +
                         " does not hold (--device-memory copies each device's shards once, at start; restart "
                         "the daemon to serve this table): " + why);
  // Not during a shift: the control socket's loop and the signal thread
  // call this, and neither may wait for a shift's ramp.
  shifter_->outside_shift([&] {
    const std::string cur = current_gear();
    if (!table.find(cur))
      throw ControlError("ftp.NoSuchGear", "the new gear table lacks the current gear \"" + cur + "\"", Exit::usage);
    std::lock_guard lk(table_mu_);
    cfg_.gears = std::move(table);
    ++table_generation_;
  });
  // The pool follows the table: its new device sets are made now, not at the next shift.
  if (ready_) prepare_communicators();
}

doc::GearTable Service::gear_table() const {
  std::lock_guard lk(table_mu_);
  return cfg_.gears;
}

std::vector<DomainSample> Service::samples() const {
  std::vector<DomainSample> out;
  for (const auto& d : domains_.all()) {
    DomainSample s;
    s.view.id = d->id();
    s.view.gear = d->gear();
    s.view.state = d->state();
    s.view.devices = d->devices();
    s.view.traffic_share = d->weight();
    s.view.running = d->domain().running();
    s.view.waiting = d->domain().waiting();
    s.kv_usage = d->domain().kv_usage();
    s.bubble_ratio = d->bubble_ratio();
    s.busy_s = d->busy_s();
    s.preemptions = d->domain().stats().preemptions;
    s.queued_prompt_tokens = static_cast<double>(d->domain().queued_prompt_tokens());
    out.push_back(std::move(s));
  }
  return out;
}

Json Service::status() const {
  Json doms = Json::array();
  for (const auto& d : domains_.all())
    doms.push_back(Json{{"id", d->id()},
                        {"gear", d->gear()},
                        {"state", std::string(doc::to_string(d->state()))},
                        {"devices", d->devices()},
                        {"traffic_share", d->weight()},
                        {"running", d->domain().running()},
                        {"waiting", d->domain().waiting()},
                        {"kv_usage", d->domain().kv_usage()},
                        {"kv_blocks", d->domain().config().kv_blocks},
                        {"failure", d->domain().failure().empty() ? Json() : Json(d->domain().failure())}});
  return Json{{"kind", "ftp.status/v1"},
              {"devices", pool_->status()},
              {"device_memory", cfg_.device_memory},
              {"weights_copied_bytes", store_ ? store_->copied_bytes() : 0},
              {"model", cfg_.model_name},
              {"gear", current_gear()},
              {"shifting", shifter_->shifting()},
              {"ready", ready()},  // as /ready answers: no serving domain is not ready
              {"accepting", accepting_.load()},
              {"requests_total", telemetry_.requests_total()},
              {"requests_failed", telemetry_.requests_failed()},
              {"requests_rerun", telemetry_.requests_rerun()},
              {"requests_moved", telemetry_.requests_moved()},
              {"domains", doms}};
}

doc::Topology Service::gathered_topology(bool quick) const {
  topology::ProbeOptions po;
  po.virtual_devices = cfg_.backend == "cuda" ? 0 : std::max(cfg_.virtual_devices, 1);
  po.quick = quick;
  po.gpus = cfg_.backend == "cuda";
  doc::Topology local = topology::probe_local(po);
  for (auto& n : local.nodes) n.id = cfg_.machine_name;
  for (auto& d : local.devices) d.node = cfg_.machine_name;
  if (!cfg_.members) return local;
  member::GatherOptions g;
  g.quick = quick;
  g.gloo = cfg_.gloo;
  return member::gather_topology(*cfg_.members, std::move(local), g);
}

Json Service::gears_json() const {
  Json j = doc::to_json(gear_table());
  j["current"] = current_gear();
  return j;
}

void Service::sample_gpus(std::vector<doc::GpuLoad>& gpus, std::string& why) const {
  if (!gpu_signals_) {
    why = std::string("no GPU in the device pool (") + to_string(pool_->kind()) + " devices)";
    return;
  }
  if (why = gpu_signals_->unavailable(); !why.empty()) {
    why = "NVML: " + why;
    return;
  }
  std::map<std::string, std::string> ids;  // uuid -> the pool's id
  for (const auto& d : pool_->devices())
    if (d.type == "gpu" && !d.uuid.empty()) ids[d.uuid] = d.id;
  gpus = gpu_signals_->sample(ids);
  const auto lost = pool_->lost();
  for (const auto& g : gpus)
    if (!g.available && ids.count(g.uuid) && !lost.count(g.id)) pool_->mark_lost(g.id, "NVML: " + g.unavailable_because);
}

doc::Observation Service::observe() const {
  doc::Observation o = telemetry_.observe(now_ms(), current_gear(), shifter_->shifting(), samples());
  sample_gpus(o.gpus, o.gpu_signals_unavailable);
  for (const auto& [id, why] : pool_->lost()) o.lost_devices.push_back(doc::LostDevice{id, why});
  return o;
}

std::string Service::prometheus() const {
  ServiceSample s;
  sample_gpus(s.gpus, s.gpu_signals_unavailable);
  s.gear = current_gear();
  for (const auto& d : pool_->status()) s.devices_leased += d.value("state", "") == "leased" ? 1 : 0;
  return telemetry_.prometheus(s, samples());
}

}  // namespace ftp::serve
