// SPDX-License-Identifier: Apache-2.0
#include "sim/simulated_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/cluster.hpp"
#include "doc/kinds.hpp"
#include "plan/planner.hpp"

namespace ftp::sim {

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

model::HParams hparams_of(const plan::ModelShape& s) {
  model::HParams hp;
  hp.name = s.name;
  hp.n_vocab = s.vocab_size;
  hp.n_ctx_train = s.context_length;
  hp.n_embd = s.hidden_size;
  hp.n_ff = s.intermediate_size;
  hp.n_layer = s.n_layers;
  hp.n_head = s.n_heads;
  hp.n_head_kv = s.n_kv_heads;
  hp.head_dim = s.head_dim;
  hp.n_rot = s.head_dim;
  hp.tied_output = s.tie_embeddings;
  return hp;
}

model::TokenizerData sim_byte_tokenizer(int n_vocab) {
  if (n_vocab < 260)
    throw InputError("the byte-level stand-in tokenizer needs vocab_size >= 260 (3 special, 256 bytes, the space), got " +
                     std::to_string(n_vocab));
  model::TokenizerData d;
  d.model = "llama";
  d.pre = "default";
  d.add_space_prefix = false;
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.types = {2, 3, 3};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    d.types.push_back(6);
  }
  d.tokens.push_back("\u2581");  // SentencePiece's space
  d.types.push_back(1);
  for (int i = 260; i < n_vocab; ++i) {
    d.tokens.push_back("<sim-" + std::to_string(i) + ">");
    d.types.push_back(5);
  }
  d.scores.assign(d.tokens.size(), 0.0f);
  d.unk = 0;
  d.bos = 1;
  d.eos = 2;
  return d;
}

doc::Topology read_topology(const std::string& path) {
  return json::parse_file(path, [](const json::Json& j) {
    const std::string k = j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "";
    if (k == doc::kind::cluster) return doc::topology_from_cluster_spec(j);
    if (k == doc::kind::topology) return doc::topology_from_json(j);
    throw InputError("kind: expected \"" + std::string(doc::kind::topology) + "\" or \"" + std::string(doc::kind::cluster) +
                     "\", got \"" + k + "\"");
  });
}

namespace {

plan::StageSpan span_of(const plan::ModelShape& shape, const engine::StageLayout& sl) {
  return plan::StageSpan{sl.n_layers, sl.first_layer == 0, sl.first_layer + sl.n_layers == shape.n_layers};
}

void check_layers(const plan::ModelShape& shape, const engine::DomainConfig& config) {
  int next = 0;
  for (std::size_t i = 0; i < config.stages.size(); ++i) {
    const auto& sl = config.stages[i];
    if (sl.first_layer != next || sl.n_layers < 1)
      throw InputError("domain " + config.id + ": stages[" + std::to_string(i) + "]: layers " +
                       std::to_string(sl.first_layer) + "+" + std::to_string(sl.n_layers) + " do not follow layer " +
                       std::to_string(next));
    next += sl.n_layers;
  }
  if (next != shape.n_layers)
    throw InputError("domain " + config.id + ": stages cover " + std::to_string(next) + " layers, the model has " +
                     std::to_string(shape.n_layers));
}

}  // namespace

std::vector<plan::ReplicaStage> replica_stages(const plan::ModelShape& shape, const doc::Topology& topo,
                                               const doc::Replica& replica, const engine::DomainConfig& config) {
  check_layers(shape, config);
  if (replica.stages.size() != config.stages.size())
    throw InputError("domain " + config.id + ": the replica has " + std::to_string(replica.stages.size()) +
                     " stages, the domain " + std::to_string(config.stages.size()));
  std::vector<plan::ReplicaStage> out;
  for (std::size_t i = 0; i < replica.stages.size(); ++i) {
    const auto& devs = replica.stages[i].devices;
    for (const auto& id : devs) {
      const doc::Device* d = topo.find_device(id);
      if (!d) throw InputError("topology " + topo.name + ": no device \"" + id + "\" (named by the gear)");
      if (!(d->gemm_tflop_s > 0))
        throw InputError("topology " + topo.name + ": device " + id +
                         ": gemm_tflop_s is missing or 0; the simulated engine needs measured speeds (ftp-probe)");
      if (!(d->memory_bandwidth_gb_s > 0))
        throw InputError("topology " + topo.name + ": device " + id +
                         ": memory_bandwidth_gb_s is missing or 0; the simulated engine needs measured speeds (ftp-probe)");
    }
    plan::ReplicaStage st{span_of(shape, config.stages[i]), plan::group_perf(topo, devs), 0, 0};
    if (i + 1 < replica.stages.size()) {
      const auto& a = devs.back();
      const auto& b = replica.stages[i + 1].devices.front();
      auto link = topo.link_between(a, b);
      if (!link) throw InputError("topology " + topo.name + ": no link between " + a + " and " + b + " for the pipeline send");
      st.send_gb_s = link->bandwidth_gb_s;
      st.send_latency_us = link->latency_us;
    }
    out.push_back(st);
  }
  return out;
}

std::vector<plan::ReplicaStage> uniform_stages(const plan::ModelShape& shape, const engine::DomainConfig& config,
                                               const plan::GroupPerf& perf) {
  check_layers(shape, config);
  std::vector<plan::ReplicaStage> out;
  for (const auto& sl : config.stages) {
    plan::GroupPerf g = perf;
    g.tp = sl.tp;
    out.push_back(plan::ReplicaStage{span_of(shape, sl), g, 0, 0});
  }
  return out;
}

void micro_batch_work(const std::vector<engine::SeqChunk>& chunks, int micro_batches, std::vector<plan::StepWork>& out,
                      std::vector<int>& index) {
  engine::micro_batch_indices(chunks, micro_batches, index);
  out.assign(index.empty() ? 0 : static_cast<std::size_t>(index.back()) + 1, plan::StepWork{});
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const engine::SeqChunk& c = chunks[k];
    plan::StepWork& x = out[static_cast<std::size_t>(index[k])];
    const double n = double(c.tokens.size()), s = c.start_pos;
    x.tokens += n;
    x.attention_pairs += n * s + n * (n + 1) / 2;
    x.kv_positions += s + n;
    x.logit_rows += c.want_logits ? 1 : 0;
  }
}

std::vector<plan::StepWork> micro_batch_work(const std::vector<engine::SeqChunk>& chunks, int micro_batches) {
  std::vector<plan::StepWork> out;
  std::vector<int> index;
  micro_batch_work(chunks, micro_batches, out, index);
  return out;
}

SimulatedEngine::SimulatedEngine(SimulatedEngineOptions options) : o_(std::move(options)) {
  const auto& s = o_.shape;
  if (o_.stages.empty()) throw InputError("simulated engine: no stages");
  int layers = 0;
  for (std::size_t i = 0; i < o_.stages.size(); ++i) {
    const auto& st = o_.stages[i];
    const std::string where = "simulated engine: stages[" + std::to_string(i) + "]: ";
    if (!(st.perf.tflop_s > 0)) throw InputError(where + "tflop_s must be positive");
    if (!(st.perf.gb_s > 0)) throw InputError(where + "gb_s must be positive");
    if (st.perf.tp < 1) throw InputError(where + "tp must be positive");
    layers += st.span.n_layers;
  }
  if (layers != s.n_layers)
    throw InputError("simulated engine: stages hold " + std::to_string(layers) + " layers, the model " +
                     std::to_string(s.n_layers));
  if (o_.block_tokens < 1) throw InputError("simulated engine: block_tokens must be positive");
  hp_ = hparams_of(s);
  busy_.assign(o_.stages.size(), 0.0);
  if (!o_.token_ids.empty()) {
    for (int t : o_.token_ids)
      if (t < 0 || t >= hp_.n_vocab)
        throw InputError("simulated engine: token_ids: " + std::to_string(t) + " outside the vocabulary");
    ids_ = o_.token_ids;
  } else {
    for (int t = 0; t < hp_.n_vocab; ++t)
      if (std::find(o_.avoid.begin(), o_.avoid.end(), t) == o_.avoid.end()) ids_.push_back(t);
  }
  if (ids_.empty()) throw InputError("simulated engine: no token left for the simulated stream");
}

std::uint64_t SimulatedEngine::kv_bytes() const {
  double per_block = 0;
  for (const auto& st : o_.stages)
    per_block += double(st.span.n_layers) * st.perf.tp * o_.shape.kv_bytes_per_token_layer(st.perf.tp) * o_.block_tokens;
  return static_cast<std::uint64_t>(per_block * o_.kv_blocks);
}

int SimulatedEngine::next_token(int last, int position) const {
  std::uint64_t h = mix(o_.seed ^ mix(static_cast<std::uint64_t>(position) * 0x100000001b3ull ^
                                      static_cast<std::uint64_t>(static_cast<std::uint32_t>(last))));
  return ids_[static_cast<std::size_t>(h % ids_.size())];
}

double SimulatedEngine::forward_time_s(const std::vector<engine::SeqChunk>& chunks, int micro_batches) const {
  return schedule_s(micro_batch_work(chunks, micro_batches), nullptr);
}

double SimulatedEngine::schedule_s(const std::vector<plan::StepWork>& work, std::vector<double>* busy) const {
  const int m = static_cast<int>(work.size()), pp = static_cast<int>(o_.stages.size());
  const double act = double(o_.shape.hidden_size) * o_.shape.activation_bytes_per_element();
  if (busy) busy->assign(o_.stages.size(), 0.0);
  // The real pipeline's tick schedule: at tick k, stage s runs micro-batch
  // k - s; a tick lasts as long as its slowest (stage, micro-batch). A
  // stage's busy time is the sum of its micro-batches' times.
  double total = 0;
  for (int tick = 0; tick < m + pp - 1; ++tick) {
    double slowest = 0;
    for (int s = 0; s < pp; ++s) {
      const int b = tick - s;
      if (b < 0 || b >= m) continue;
      const auto& st = o_.stages[static_cast<std::size_t>(s)];
      const auto& w = work[static_cast<std::size_t>(b)];
      double t = plan::step_time_s(o_.shape, st.span, st.perf, w, o_.calibration);
      if (busy) (*busy)[static_cast<std::size_t>(s)] += t;
      if (s + 1 < pp) t += plan::p2p_time_s(w.tokens * act, st.send_gb_s, st.send_latency_us);
      slowest = std::max(slowest, t);
    }
    total += slowest;
  }
  return total;
}

void SimulatedEngine::pass(double dt) {
  now_s_ += dt;
  if (o_.pacing == Pacing::virtual_time) {
    if (o_.clock) {
      clock_carry_ms_ += dt * 1e3;
      const double whole = std::floor(clock_carry_ms_);
      clock_carry_ms_ -= whole;
      o_.clock->advance(static_cast<std::int64_t>(whole));
    }
  }
}

void SimulatedEngine::advance_idle_to(double t_s) {
  if (t_s > now_s_) pass(t_s - now_s_);
}

std::vector<std::vector<float>> SimulatedEngine::forward(const std::vector<engine::SeqChunk>& chunks, int micro_batches) {
  std::vector<std::vector<float>> logits;
  run_step(chunks, micro_batches, &logits);
  return logits;
}

std::vector<int> SimulatedEngine::forward_choose(const std::vector<engine::SeqChunk>& chunks, int micro_batches,
                                                 const std::vector<engine::TokenChoice>& choices) {
  std::vector<int> ids = run_step(chunks, micro_batches, nullptr);
  engine::check_choices(choices.size(), ids.size(), "simulated engine: forward_choose");
  return ids;
}

std::vector<int> SimulatedEngine::run_step(const std::vector<engine::SeqChunk>& chunks, int micro_batches,
                                           std::vector<std::vector<float>>* logits) {
  // The wall clock only for real-time pacing: a replay in virtual time never reads it.
  const bool real_time = o_.pacing == Pacing::wait_real_time;
  const auto t_start = real_time ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  engine::check_chunks(chunks, hp_.n_vocab, o_.block_tokens, "simulated engine");
  micro_batch_work(chunks, micro_batches, work_, work_index_);
  const double dt = schedule_s(work_, &busy_);

  std::vector<int> ids;
  for (const auto& c : chunks)
    if (c.want_logits) ids.push_back(next_token(c.tokens.back(), c.start_pos + static_cast<int>(c.tokens.size()) - 1));
  // The stand-in rows inside the step's time (its pacing waits after them).
  if (logits)
    for (const int tok : ids) {
      std::vector<float> l(static_cast<std::size_t>(hp_.n_vocab), -std::numeric_limits<float>::infinity());
      l[static_cast<std::size_t>(tok)] = 0.0f;
      logits->push_back(std::move(l));
    }
  pass(dt);
  if (real_time) {
    // Sleep most of the step, then spin: a sleep overshoots by tens of
    // microseconds, as long as a whole step of a small model.
    const auto end = t_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(dt));
    const auto spin = std::chrono::microseconds(200);
    if (end - std::chrono::steady_clock::now() > spin) std::this_thread::sleep_until(end - spin);
    while (std::chrono::steady_clock::now() < end) std::this_thread::yield();
  }
  return ids;
}

}  // namespace ftp::sim
