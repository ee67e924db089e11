// SPDX-License-Identifier: Apache-2.0
#include "engine/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "hardware/cpu/virtual_device.hpp"
#include "comm/running_ranks.hpp"
#include "core/error.hpp"

namespace ftp::engine {

/// Nice added to a background (draining) domain's threads: under CFS a
/// thread of nice 10 weighs about a tenth of one of nice 0.
constexpr int kBackgroundNice = 10;

RankThread::RankThread() : thread_([this] { loop(); }) {}

RankThread::~RankThread() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RankThread::post(std::function<void()> task) {
  std::lock_guard lk(mu_);
  task_ = std::move(task);
  busy_ = true;
  error_ = nullptr;
  cv_.notify_all();
}

void RankThread::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [this] { return !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void RankThread::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || (busy_ && task_); });
    if (stop_) return;
    auto task = std::move(task_);
    task_ = nullptr;
    lk.unlock();
    std::exception_ptr err;
    try {
      task();
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    error_ = err;
    busy_ = false;
    cv_.notify_all();
  }
}

Executor::Executor(const WeightStore& weights, std::vector<StageLayout> stages, int n_kv_blocks, int block_tokens,
                   Backend* backend, int max_rows, std::shared_ptr<const Placement> placement)
    : w_(weights), hp_(weights.hparams()), stages_(std::move(stages)), block_tokens_(block_tokens) {
  placement_ = std::move(placement);
  if (placement_ && (placement_->owner.size() != stages_.size() || !placement_->group))
    throw InputError("executor: the placement has " + std::to_string(placement_->owner.size()) + " stages, the domain " +
                     std::to_string(stages_.size()));
  if (stages_.empty()) throw InputError("executor: a domain has at least one stage");
  if (block_tokens < 1) throw InputError("executor: block_tokens must be positive");
  Backend& be = backend ? *backend : cpu_backend();
  const std::vector<std::vector<int>> threads = resolve_rank_threads(stages_);
  int next = 0;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    const StageLayout& l = stages_[s];
    if (l.first_layer != next || l.n_layers < 1 || l.first_layer + l.n_layers > hp_.n_layer)
      throw InputError("executor: stage " + std::to_string(s) + " layers [" + std::to_string(l.first_layer) + ", " +
                       std::to_string(l.first_layer + l.n_layers) + ") do not continue from layer " + std::to_string(next));
    if (!l.devices.empty() && static_cast<int>(l.devices.size()) != l.tp)
      throw InputError("executor: stage " + std::to_string(s) + " has " + std::to_string(l.devices.size()) +
                       " devices for tp " + std::to_string(l.tp));
    if (!l.gpus.empty() && static_cast<int>(l.gpus.size()) != l.tp)
      throw InputError("executor: stage " + std::to_string(s) + " has " + std::to_string(l.gpus.size()) +
                       " GPUs for tp " + std::to_string(l.tp));
    next = l.first_layer + l.n_layers;
    Stage st;
    st.layout = l;
    st.first = s == 0;
    st.last = s + 1 == stages_.size();
    for (int r = 0; r < l.tp; ++r) st.vocab_widths.push_back(static_cast<std::size_t>(w_.vocab_rows(l.tp, r).size()));
    const std::vector<RankSpec> specs = stage_rank_specs(l, static_cast<int>(s), static_cast<int>(stages_.size()),
                                                         n_kv_blocks, block_tokens, max_rows, threads[s]);
    // The ranks placed here (all of them without a placement).
    std::vector<int> local;
    if (placement_ && static_cast<int>(placement_->owner[s].size()) != l.tp)
      throw InputError("executor: the placement of stage " + std::to_string(s) + " has " +
                       std::to_string(placement_->owner[s].size()) + " ranks for tp " + std::to_string(l.tp));
    for (int r = 0; r < l.tp; ++r)
      if (owner(static_cast<int>(s), r) == self()) local.push_back(r);
    // The ranks reserve their KV pages on their devices; if one cannot, the
    // ranks made so far give theirs back as they are destroyed.
    std::vector<std::unique_ptr<RankBackend>> ranks;
    if (static_cast<int>(local.size()) == l.tp) {
      ranks = be.make_stage(w_, specs);
    } else if (!local.empty()) {
      std::vector<RankSpec> mine;
      for (int r : local) mine.push_back(specs[static_cast<std::size_t>(r)]);
      ranks = be.make_stage_ranks(w_, mine, placement_->stage_comm(static_cast<int>(s), local));
    }
    for (std::size_t i = 0; i < local.size(); ++i) {
      const int r = local[i];
      Rank rk;
      rk.index = r;
      // Views of the rank's device's copy in device-memory mode, else of the mapped file.
      const hardware::VirtualDevice* dev = l.devices.empty() ? nullptr : l.devices[static_cast<std::size_t>(r)];
      for (int L = 0; L < l.n_layers; ++L) rk.layers.push_back(w_.layer(l.first_layer + L, l.tp, r, dev));
      rk.be = std::move(ranks[i]);
      rk.thread = std::make_unique<RankThread>();
      RankBackend* rb = rk.be.get();
      rk.thread->post([rb] { rb->bind_thread(); });
      rk.thread->wait();
      st.ranks.push_back(std::move(rk));
    }
    st_.push_back(std::move(st));
  }
  if (next != hp_.n_layer)
    throw InputError("executor: stages end at layer " + std::to_string(next) + ", the model has " +
                     std::to_string(hp_.n_layer));
  stage_busy_s_.assign(stages_.size(), 0.0);
  for (const StageLayout& l : stages_)
    if (l.tp > 1) collective_ranks_ += l.tp;
}

Executor::~Executor() {
  // Rank threads go first: nothing may run on a backend being destroyed.
  for (auto& st : st_)
    for (auto& rk : st.ranks) rk.thread.reset();
}

std::uint64_t Executor::kv_bytes() const {
  std::uint64_t b = 0;
  for (const auto& st : st_)
    for (const auto& rk : st.ranks) b += rk.be->kv_bytes();
  return b;
}

void Executor::run_stage_rank(Stage& st, int r, MicroBatch& mb) {
  const int E = hp_.n_embd, hd = hp_.head_dim, T = mb.n_tokens;
  Rank& rk = st.ranks[static_cast<std::size_t>(r)];
  RankBackend& be = *rk.be;
  const RankLayerView& v0 = rk.layers[0];
  const int nq = v0.q_heads.size(), nkv = v0.kv_heads.size();
  const std::size_t Ts = static_cast<std::size_t>(T), qn = Ts * nq * hd, kvn = Ts * nkv * hd, xn_ = Ts * E;
  const std::size_t ffn = Ts * static_cast<std::size_t>(std::max(v0.ff.size(), 1));

  be.set_batch(mb.layout);
  float* x = be.buffer(Buf::x, xn_);
  float* xn = be.buffer(Buf::xn, xn_);
  float* q = be.buffer(Buf::q, qn);
  float* k = be.buffer(Buf::k, kvn);
  float* v = be.buffer(Buf::v, kvn);
  float* att = be.buffer(Buf::att, qn);
  float* part = be.buffer(Buf::part, xn_);
  float* g = be.buffer(Buf::gate, ffn);
  float* u = be.buffer(Buf::up, ffn);
  if (st.first) {
    be.embed(x);
    be.all_reduce(x, xn_);  // vocabulary-parallel: each row from the one rank holding its token
  } else
    be.upload(mb.x.data(), x, xn_);

  be.run(mb.layout.decode_only ? T : -1, [&] {
    for (int L = 0; L < st.layout.n_layers; ++L) {
      const RankLayerView& w = rk.layers[static_cast<std::size_t>(L)];
      be.rmsnorm(x, w.attn_norm, xn, T);
      be.matmul(xn, w.wq, q, T);
      be.matmul(xn, w.wk, k, T);
      be.matmul(xn, w.wv, v, T);
      if (!w.bq.empty()) be.add_bias(q, w.bq);
      if (!w.bk.empty()) be.add_bias(k, w.bk);
      if (!w.bv.empty()) be.add_bias(v, w.bv);
      if (w.q_norm) be.head_rmsnorm(q, w.q_norm, nq);
      if (w.k_norm) be.head_rmsnorm(k, w.k_norm, nkv);
      be.rope(q, nq);
      be.rope(k, nkv);
      be.kv_write(L, k, v);
      be.attention(L, q, att, nq, w.q_heads.begin, w.kv_heads.begin);
      be.matmul(att, w.wo, part, T);
      be.all_reduce(part, xn_);
      be.add(x, part, xn_);

      be.rmsnorm(x, w.ffn_norm, xn, T);
      if (w.ff.size() > 0) {
        be.matmul(xn, w.w_gate, g, T);
        be.matmul(xn, w.w_up, u, T);
        be.silu_mul(g, u, Ts * static_cast<std::size_t>(w.ff.size()));
        be.matmul(g, w.w_down, part, T);
        be.all_reduce(part, xn_);
        be.add(x, part, xn_);
      } else {
        // A rank without a feed-forward slice (uneven shards) adds nothing
        // but still meets its peers in the all-reduce.
        be.zero(part, xn_);
        be.all_reduce(part, xn_);
        be.add(x, part, xn_);
      }
    }
  });

  if (!st.last) {
    if (rk.index == 0) {
      mb.x.resize(xn_);
      be.download(x, mb.x.data(), xn_);
    } else {
      be.sync();
    }
    return;
  }
  // The classifier, for the last row of each chunk that wants logits. The
  // head is vocabulary-parallel: each rank computes the logits of its
  // vocabulary rows and the stage gathers the slices into rank 0's full
  // rows (copies: exact), where they are chosen or returned. Only rank 0
  // holds full rows; rank 0 receives (tp - 1)/tp of them and no other
  // rank receives anything.
  const std::size_t nl = mb.layout.logit_rows.size();
  if (nl == 0) {
    be.sync();
    return;
  }
  const std::size_t V = static_cast<std::size_t>(hp_.n_vocab);
  float* lin = be.buffer(Buf::logits_in, nl * E);
  be.gather_logit_rows(x, lin);
  const int tp = st.layout.tp;
  const hardware::VirtualDevice* dev =
      st.layout.devices.empty() ? nullptr : st.layout.devices[static_cast<std::size_t>(rk.index)];
  be.rmsnorm(lin, w_.output_norm(dev), xn, static_cast<int>(nl));
  const MatView head = w_.output(tp, rk.index, dev);
  float* logits = rk.index == 0 ? be.buffer(Buf::logits, nl * V) : nullptr;
  if (tp == 1) {
    be.matmul(xn, head, logits, static_cast<int>(nl));
  } else {
    const std::size_t vr = static_cast<std::size_t>(head.rows);
    float* part = be.buffer(Buf::logits_part, nl * std::max<std::size_t>(vr, 1));
    if (vr > 0) be.matmul(xn, head, part, static_cast<int>(nl));
    be.gather_columns(part, nl, st.vocab_widths, logits);
  }
  if (rk.index != 0) {
    be.sync();
    return;
  }
  if (mb.tokens)
    be.choose_tokens(logits, V, nl, mb.choices, mb.tokens, mb.logprobs);
  else
    be.download_rows(logits, V, mb.logits.data(), nl);
}

void Executor::recycle(std::vector<std::vector<float>>&& logits) {
  const std::size_t V = static_cast<std::size_t>(hp_.n_vocab);
  std::lock_guard lk(spare_mu_);
  for (auto& row : logits)
    if (row.capacity() >= V && spare_logits_.size() < most_logit_rows_) spare_logits_.push_back(std::move(row));
  logits.clear();
}

std::string Executor::failure() const {
  std::lock_guard lk(failure_mu_);
  return failure_;
}

std::vector<Executor::MicroBatch> Executor::plan_micro_batches(const std::vector<SeqChunk>& chunks, int micro_batches,
                                                                std::size_t& logit_rows) {
  if (std::string f = failure(); !f.empty()) throw Error("executor: " + f);
  check_chunks(chunks, hp_.n_vocab, block_tokens_, "executor");
  auto groups = split_micro_batches(chunks, micro_batches);
  std::vector<MicroBatch> mbs(groups.size());
  logit_rows = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    mbs[i].chunks = std::move(groups[i]);
    mbs[i].layout = make_batch_layout(mbs[i].chunks, block_tokens_);
    mbs[i].n_tokens = mbs[i].layout.n_rows;
    logit_rows += mbs[i].layout.logit_rows.size();
  }
  return mbs;
}

std::vector<std::vector<float>> Executor::forward(const std::vector<SeqChunk>& chunks, int micro_batches) {
  std::size_t rows = 0;
  auto mbs = plan_micro_batches(chunks, micro_batches, rows);
  // The returned logits, in chunk order (micro-batches hold contiguous
  // groups of chunks): the last stage writes each row in place.
  std::vector<std::vector<float>> logits;
  const std::size_t V = static_cast<std::size_t>(hp_.n_vocab);
  {
    std::lock_guard lk(spare_mu_);
    most_logit_rows_ = std::max(most_logit_rows_, rows);
    while (logits.size() < rows && !spare_logits_.empty()) {
      logits.push_back(std::move(spare_logits_.back()));
      spare_logits_.pop_back();
      logits.back().resize(V);  // every element is written below
    }
  }
  while (logits.size() < rows) logits.emplace_back(V);
  std::size_t next_row = 0;
  for (auto& mb : mbs)
    for (std::size_t i = 0; i < mb.layout.logit_rows.size(); ++i) mb.logits.push_back(logits[next_row++].data());
  if (placement_) {
    placement_->send_plan(make_step_plan(StepPlan::Kind::logits, chunks, micro_batches));
    run_placed(mbs);
  } else {
    run_micro_batches(mbs);
  }
  return logits;
}

std::vector<int> Executor::forward_choose(const std::vector<SeqChunk>& chunks, int micro_batches,
                                          const std::vector<TokenChoice>& choices) {
  return choose(chunks, micro_batches, choices, nullptr);
}

std::vector<int> Executor::forward_choose_logprobs(const std::vector<SeqChunk>& chunks, int micro_batches,
                                                   const std::vector<TokenChoice>& choices,
                                                   std::vector<TokenLogprobs>& logprobs) {
  // Across processes the last stage sends back token ids only; with
  // log-probabilities asked, the logits come back and both are taken here.
  if (placement_) return Engine::forward_choose_logprobs(chunks, micro_batches, choices, logprobs);
  return choose(chunks, micro_batches, choices, &logprobs);
}

std::vector<int> Executor::choose(const std::vector<SeqChunk>& chunks, int micro_batches,
                                  const std::vector<TokenChoice>& choices, std::vector<TokenLogprobs>* logprobs) {
  std::size_t rows = 0;
  auto mbs = plan_micro_batches(chunks, micro_batches, rows);
  check_choices(choices.size(), rows, "executor: forward_choose");
  std::vector<int> tokens(rows);
  if (logprobs) logprobs->assign(rows, TokenLogprobs{});
  std::size_t next_row = 0;
  for (auto& mb : mbs) {
    mb.choices = choices.data() + next_row;
    mb.tokens = tokens.data() + next_row;
    if (logprobs) mb.logprobs = logprobs->data() + next_row;
    next_row += mb.layout.logit_rows.size();
  }
  if (placement_) {
    placement_->send_plan(make_step_plan(StepPlan::Kind::choose, chunks, micro_batches, choices));
    run_placed(mbs);
  } else {
    run_micro_batches(mbs);
  }
  return tokens;
}

void Executor::run_plan(const StepPlan& plan) {
  if (!placement_) throw Error("executor: run_plan without a placement");
  std::size_t rows = 0;
  auto mbs = plan_micro_batches(plan.chunks, plan.micro_batches, rows);
  const bool choose = plan.kind == StepPlan::Kind::choose;
  if (choose) check_choices(plan.choices.size(), rows, "executor: run_plan");
  // Where the last stage puts its results when it runs here: scratch, sent
  // to the leader by run_placed.
  std::vector<std::vector<float>> logits(mbs.size());
  std::vector<int> tokens(rows);
  const std::size_t V = static_cast<std::size_t>(hp_.n_vocab);
  std::size_t next_row = 0;
  for (std::size_t b = 0; b < mbs.size(); ++b) {
    MicroBatch& mb = mbs[b];
    const std::size_t nl = mb.layout.logit_rows.size();
    if (choose) {
      mb.choices = plan.choices.data() + next_row;
      mb.tokens = tokens.data() + next_row;
    } else {
      logits[b].resize(nl * V);
      for (std::size_t i = 0; i < nl; ++i) mb.logits.push_back(logits[b].data() + i * V);
    }
    next_row += nl;
  }
  run_placed(mbs);
}

void Executor::run_placed(std::vector<MicroBatch>& mbs) {
  comm::GlooGroup& g = *placement_->group;
  const int last = static_cast<int>(st_.size()) - 1;
  const int holder = owner(last, 0);
  const std::size_t V = static_cast<std::size_t>(hp_.n_vocab);
  try {
    run_micro_batches(mbs);
    for (std::size_t b = 0; b < mbs.size(); ++b) {
      MicroBatch& mb = mbs[b];
      const std::size_t nl = mb.layout.logit_rows.size();
      if (nl == 0) continue;
      const std::uint32_t tag = step_tag::results(static_cast<int>(b));
      if (self() == 0 && holder != 0) {
        if (mb.tokens) {
          g.recv(holder, mb.tokens, nl * sizeof(int), tag);
        } else {
          std::vector<float> rowsv(nl * V);
          g.recv(holder, rowsv.data(), rowsv.size() * sizeof(float), tag);
          for (std::size_t i = 0; i < nl; ++i) std::copy_n(rowsv.data() + i * V, V, mb.logits[i]);
        }
      } else if (self() != 0 && holder == self()) {
        const char* p = mb.tokens ? reinterpret_cast<const char*>(mb.tokens) : reinterpret_cast<const char*>(mb.logits[0]);
        const std::size_t n = mb.tokens ? nl * sizeof(int) : nl * V * sizeof(float);
        g.post_send(0, std::vector<char>(p, p + n), tag);
      }
    }
    g.wait_sends();
  } catch (const std::exception& e) {
    // The group's messages are out of step: this domain cannot run again.
    std::lock_guard lk(failure_mu_);
    if (failure_.empty()) failure_ = std::string("a step across processes failed (") + e.what() + ")";
    throw;
  }
}

void Executor::run_micro_batches(std::vector<MicroBatch>& mbs) {
  const int pp = static_cast<int>(st_.size());
  const int m = static_cast<int>(mbs.size());
  // The step's ranks count as running while it lasts: whether a waiting
  // rank may spin depends on the ranks of every step running now.
  comm::StepRanks running(collective_ranks_);
  std::mutex cause_mu;
  std::exception_ptr cause;  // the first rank failure of this forward
  std::fill(stage_busy_s_.begin(), stage_busy_s_.end(), 0.0);
  for (int tick = 0; tick < m + pp - 1; ++tick) {
    std::vector<std::pair<int, int>> active;  // (stage, micro-batch)
    for (int s = 0; s < pp; ++s)
      if (tick - s >= 0 && tick - s < m) active.emplace_back(s, tick - s);
    // Busy time of each rank's task, for the stage time spread (bubble ratio).
    std::vector<std::vector<double>> rank_s(active.size());
    for (std::size_t a = 0; a < active.size(); ++a) {
      auto [s, b] = active[a];
      Stage& st = st_[static_cast<std::size_t>(s)];
      rank_s[a].assign(std::max<std::size_t>(1, st.ranks.size()), 0.0);
      MicroBatch& in = mbs[static_cast<std::size_t>(b)];
      // Activations from the previous stage's rank 0 in another process.
      if (placement_ && s > 0 && !st.ranks.empty() && owner(s - 1, 0) != self()) {
        in.x.resize(static_cast<std::size_t>(in.n_tokens) * static_cast<std::size_t>(hp_.n_embd));
        placement_->group->recv(owner(s - 1, 0), in.x.data(), in.x.size() * sizeof(float), step_tag::activations(s, b));
      }
      for (int r = 0; r < static_cast<int>(st.ranks.size()); ++r)
        st.ranks[static_cast<std::size_t>(r)].thread->post([this, &st, r, &mbs, b, a, &rank_s, &cause_mu, &cause] {
          Rank& me = st.ranks[static_cast<std::size_t>(r)];
          if (background_.load(std::memory_order_relaxed) && !me.background) {
            hardware::lower_current_thread_priority(kBackgroundNice);  // best effort
            me.be->lower_helpers_priority(kBackgroundNice);
            me.background = true;
          }
          auto t_task = std::chrono::steady_clock::now();
          try {
            run_stage_rank(st, r, mbs[static_cast<std::size_t>(b)]);
          } catch (...) {
            // The first failure of the forward is its cause (the peers then
            // fail with "aborted"). Wake the peers out of their collectives
            // now: the domain thread may be waiting on one of them, not on
            // this rank. Every failing stage aborts its own (two stages of
            // one tick can fail together; abort is idempotent).
            {
              std::lock_guard lk(cause_mu);
              if (!cause) cause = std::current_exception();
            }
            for (auto& peer : st.ranks) peer.be->abort();
            throw;
          }
          rank_s[a][static_cast<std::size_t>(r)] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_task).count();
        });
    }
    std::exception_ptr err;
    for (std::size_t a = 0; a < active.size(); ++a) {
      Stage& st = st_[static_cast<std::size_t>(active[a].first)];
      bool failed_stage = false;
      for (auto& rk : st.ranks) {
        try {
          rk.thread->wait();
        } catch (...) {
          // One rank failed (it woke its peers out of the collective).
          if (!err) err = std::current_exception();
          failed_stage = true;
        }
      }
      if (failed_stage) {
        // Every rank of the stage has returned: make its collectives usable
        // for the next step, or mark the engine failed where they cannot be.
        bool ok = true;
        for (auto& rk : st.ranks) ok = rk.be->recover() && ok;
        if (!ok) {
          std::string why = "a rank failed and the stage's collectives cannot be restored";
          std::exception_ptr root;
          {
            std::lock_guard lk(cause_mu);
            root = cause ? cause : err;
          }
          try {
            std::rethrow_exception(root);
          } catch (const std::exception& e) {
            why += " (" + std::string(e.what()) + ")";
          } catch (...) {
          }
          std::lock_guard lk(failure_mu_);
          if (failure_.empty()) failure_ = std::move(why);
        }
      }
      stage_busy_s_[static_cast<std::size_t>(active[a].first)] +=
          *std::max_element(rank_s[a].begin(), rank_s[a].end());
    }
    // Activations to the next stage's other processes (posted: two
    // processes may send to each other in one tick).
    for (std::size_t a = 0; a < active.size() && placement_ && !err; ++a) {
      auto [s, b] = active[a];
      if (s + 1 >= pp || owner(s, 0) != self()) continue;
      const std::vector<float>& x = mbs[static_cast<std::size_t>(b)].x;
      std::vector<int> sent;
      for (int p : placement_->owner[static_cast<std::size_t>(s + 1)]) {
        if (p == self() || std::find(sent.begin(), sent.end(), p) != sent.end()) continue;
        sent.push_back(p);
        const char* bytes = reinterpret_cast<const char*>(x.data());
        placement_->group->post_send(p, std::vector<char>(bytes, bytes + x.size() * sizeof(float)),
                                     step_tag::activations(s + 1, b));
      }
    }
    if (err) {
      std::lock_guard lk(cause_mu);
      std::rethrow_exception(cause ? cause : err);
    }
  }
}

}  // namespace ftp::engine
