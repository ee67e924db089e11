// SPDX-License-Identifier: Apache-2.0
#include "engine/executor.hpp"

#include <chrono>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "engine/ops.hpp"

namespace ftp::engine {

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

Executor::Executor(const WeightStore& weights, std::vector<StageLayout> stages, int n_kv_blocks, int block_tokens)
    : w_(weights), hp_(weights.hparams()), stages_(std::move(stages)), block_tokens_(block_tokens) {
  if (stages_.empty()) throw InputError("executor: a domain has at least one stage");
  if (block_tokens < 1) throw InputError("executor: block_tokens must be positive");
  ops::blas_single_threaded();
  int next = 0;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    const StageLayout& l = stages_[s];
    if (l.first_layer != next || l.n_layers < 1 || l.first_layer + l.n_layers > hp_.n_layer)
      throw InputError("executor: stage " + std::to_string(s) + " layers [" + std::to_string(l.first_layer) + ", " +
                       std::to_string(l.first_layer + l.n_layers) + ") do not continue from layer " + std::to_string(next));
    next = l.first_layer + l.n_layers;
    Stage st;
    st.layout = l;
    st.comm = std::make_unique<comm::InprocCommunicator>(l.tp);
    for (int r = 0; r < l.tp; ++r) {
      Rank rk;
      for (int L = 0; L < l.n_layers; ++L) rk.layers.push_back(w_.layer(l.first_layer + L, l.tp, r));
      rk.kv = std::make_unique<KvStore>(l.n_layers, n_kv_blocks, block_tokens, rk.layers[0].kv_heads.size(),
                                        hp_.head_dim);
      rk.thread = std::make_unique<RankThread>();
      if (!l.devices.empty()) {
        if (static_cast<int>(l.devices.size()) != l.tp)
          throw InputError("executor: stage " + std::to_string(s) + " has " + std::to_string(l.devices.size()) +
                           " devices for tp " + std::to_string(l.tp));
        backend::VirtualDevice* dev = l.devices[static_cast<std::size_t>(r)];
        try {
          dev->reserve(rk.kv->bytes(), "KV cache of stage " + std::to_string(s) + " rank " + std::to_string(r));
        } catch (...) {
          // Give back what the ranks before this one reserved.
          for (auto& done_st : st_)
            for (auto& done_rk : done_st.ranks)
              if (done_rk.device) done_rk.device->release(done_rk.kv->bytes());
          for (auto& done_rk : st.ranks)
            if (done_rk.device) done_rk.device->release(done_rk.kv->bytes());
          throw;
        }
        rk.device = dev;
        rk.thread->post([dev] { dev->bind_current_thread(); });
        rk.thread->wait();
      }
      st.ranks.push_back(std::move(rk));
    }
    st_.push_back(std::move(st));
  }
  if (next != hp_.n_layer)
    throw InputError("executor: stages end at layer " + std::to_string(next) + ", the model has " +
                     std::to_string(hp_.n_layer));
  stage_busy_s_.assign(stages_.size(), 0.0);
}

Executor::~Executor() {
  for (auto& st : st_)
    for (auto& rk : st.ranks)
      if (rk.device) rk.device->release(rk.kv->bytes());
}

std::uint64_t Executor::kv_bytes() const {
  std::uint64_t b = 0;
  for (const auto& st : st_)
    for (const auto& rk : st.ranks) b += rk.kv->bytes();
  return b;
}

void Executor::run_stage_rank(Stage& st, int r, MicroBatch& mb, std::vector<float>& x_out, bool /*last*/) {
  const int E = hp_.n_embd, hd = hp_.head_dim, T = mb.n_tokens, B = block_tokens_;
  Rank& rk = st.ranks[static_cast<std::size_t>(r)];
  const RankLayerView& v0 = rk.layers[0];
  const int nq = v0.q_heads.size(), nkv = v0.kv_heads.size();
  const int qn = nq * hd, kvn = nkv * hd, ffn = v0.ff.size();
  const int group = hp_.n_head / hp_.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t Ts = static_cast<std::size_t>(T);

  std::vector<float> x(mb.x);  // each rank holds the stage's activations
  std::vector<float> xn(Ts * E), q(Ts * qn), k(Ts * kvn), v(Ts * kvn), att(Ts * qn), part(Ts * E),
      g(Ts * std::max(ffn, 1)), u(Ts * std::max(ffn, 1));
  int max_pos = 0;
  for (const SeqChunk* c : mb.chunks) max_pos = std::max(max_pos, c->start_pos + static_cast<int>(c->tokens.size()));
  std::vector<float> scores(static_cast<std::size_t>(max_pos));

  for (int L = 0; L < st.layout.n_layers; ++L) {
    const RankLayerView& w = rk.layers[static_cast<std::size_t>(L)];
    for (int t = 0; t < T; ++t) ops::rmsnorm(&x[static_cast<std::size_t>(t) * E], w.attn_norm, &xn[static_cast<std::size_t>(t) * E], E, hp_.rms_eps);
    ops::matmul(xn.data(), w.wq, q.data(), T);
    ops::matmul(xn.data(), w.wk, k.data(), T);
    ops::matmul(xn.data(), w.wv, v.data(), T);

    // RoPE and KV-cache write for every token, then causal attention.
    int row = 0;
    for (const SeqChunk* c : mb.chunks) {
      for (std::size_t i = 0; i < c->tokens.size(); ++i, ++row) {
        int pos = c->start_pos + static_cast<int>(i);
        float* qr = &q[static_cast<std::size_t>(row) * qn];
        float* kr = &k[static_cast<std::size_t>(row) * kvn];
        ops::rope(qr, nq, hd, hp_.n_rot, pos, hp_.rope_theta);
        ops::rope(kr, nkv, hd, hp_.n_rot, pos, hp_.rope_theta);
        int blk = (*c->blocks)[static_cast<std::size_t>(pos / B)], slot = pos % B;
        for (int j = 0; j < nkv; ++j) {
          std::copy_n(kr + j * hd, hd, rk.kv->k(L, blk, j) + slot * hd);
          std::copy_n(&v[static_cast<std::size_t>(row) * kvn + static_cast<std::size_t>(j) * hd], hd,
                      rk.kv->v(L, blk, j) + slot * hd);
        }
      }
    }
    row = 0;
    for (const SeqChunk* c : mb.chunks) {
      for (std::size_t i = 0; i < c->tokens.size(); ++i, ++row) {
        int pos = c->start_pos + static_cast<int>(i);
        for (int h = 0; h < nq; ++h) {
          const float* qh = &q[static_cast<std::size_t>(row) * qn + static_cast<std::size_t>(h) * hd];
          int kvj = (w.q_heads.begin + h) / group - w.kv_heads.begin;
          for (int p = 0; p <= pos; ++p) {
            const float* kp = rk.kv->k(L, (*c->blocks)[static_cast<std::size_t>(p / B)], kvj) + (p % B) * hd;
            float s = 0;
            for (int d = 0; d < hd; ++d) s += qh[d] * kp[d];
            scores[static_cast<std::size_t>(p)] = s * scale;
          }
          ops::softmax(scores.data(), pos + 1);
          float* out = &att[static_cast<std::size_t>(row) * qn + static_cast<std::size_t>(h) * hd];
          std::fill_n(out, hd, 0.0f);
          for (int p = 0; p <= pos; ++p) {
            const float* vp = rk.kv->v(L, (*c->blocks)[static_cast<std::size_t>(p / B)], kvj) + (p % B) * hd;
            float a = scores[static_cast<std::size_t>(p)];
            for (int d = 0; d < hd; ++d) out[d] += a * vp[d];
          }
        }
      }
    }
    ops::matmul(att.data(), w.wo, part.data(), T);
    if (st.layout.tp > 1) st.comm->all_reduce_sum(r, part.data(), part.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += part[i];

    for (int t = 0; t < T; ++t) ops::rmsnorm(&x[static_cast<std::size_t>(t) * E], w.ffn_norm, &xn[static_cast<std::size_t>(t) * E], E, hp_.rms_eps);
    if (ffn > 0) {
      ops::matmul(xn.data(), w.w_gate, g.data(), T);
      ops::matmul(xn.data(), w.w_up, u.data(), T);
      ops::silu_mul(g.data(), u.data(), Ts * ffn);
      ops::matmul(g.data(), w.w_down, part.data(), T);
    } else {
      std::fill(part.begin(), part.end(), 0.0f);
    }
    if (st.layout.tp > 1) st.comm->all_reduce_sum(r, part.data(), part.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += part[i];
  }
  if (r == 0) x_out = std::move(x);
}

std::vector<std::vector<float>> Executor::forward(const std::vector<SeqChunk>& chunks, int micro_batches) {
  const int E = hp_.n_embd;
  const int pp = static_cast<int>(st_.size());
  int total = 0;
  for (const auto& c : chunks) {
    if (c.tokens.empty()) throw Error("executor: an empty chunk");
    int need = (c.start_pos + static_cast<int>(c.tokens.size()) + block_tokens_ - 1) / block_tokens_;
    if (!c.blocks || static_cast<int>(c.blocks->size()) < need)
      throw Error("executor: chunk at position " + std::to_string(c.start_pos) + " lacks KV blocks");
    for (int t : c.tokens)
      if (t < 0 || t >= hp_.n_vocab) throw InputError("token id " + std::to_string(t) + " out of the vocabulary (" + std::to_string(hp_.n_vocab) + ")");
    total += static_cast<int>(c.tokens.size());
  }
  // Micro-batches: contiguous groups of chunks of about equal token counts.
  int m = std::max(1, std::min<int>(micro_batches, static_cast<int>(chunks.size())));
  std::vector<MicroBatch> mbs(static_cast<std::size_t>(m));
  {
    int acc = 0, idx = 0;
    for (const auto& c : chunks) {
      if (idx < m - 1 && acc >= (idx + 1) * total / m && !mbs[static_cast<std::size_t>(idx)].chunks.empty()) ++idx;
      mbs[static_cast<std::size_t>(idx)].chunks.push_back(&c);
      acc += static_cast<int>(c.tokens.size());
    }
  }
  mbs.erase(std::remove_if(mbs.begin(), mbs.end(), [](const MicroBatch& b) { return b.chunks.empty(); }), mbs.end());
  m = static_cast<int>(mbs.size());
  for (auto& mb : mbs) {
    for (const SeqChunk* c : mb.chunks) mb.n_tokens += static_cast<int>(c->tokens.size());
    mb.x.resize(static_cast<std::size_t>(mb.n_tokens) * E);
    std::size_t row = 0;
    for (const SeqChunk* c : mb.chunks)
      for (int t : c->tokens)
        w_.embed(t, &mb.x[(row++) * E]);
  }

  std::fill(stage_busy_s_.begin(), stage_busy_s_.end(), 0.0);
  std::vector<std::vector<float>> handoff(static_cast<std::size_t>(m));
  for (int tick = 0; tick < m + pp - 1; ++tick) {
    std::vector<std::pair<int, int>> active;  // (stage, micro-batch)
    for (int s = 0; s < pp; ++s)
      if (tick - s >= 0 && tick - s < m) active.emplace_back(s, tick - s);
    std::vector<std::vector<float>> outs(active.size());
    // Busy time of each rank's task, for the stage time spread (bubble ratio).
    std::vector<std::vector<double>> rank_s(active.size());
    for (std::size_t a = 0; a < active.size(); ++a) {
      auto [s, b] = active[a];
      Stage& st = st_[static_cast<std::size_t>(s)];
      rank_s[a].assign(static_cast<std::size_t>(st.layout.tp), 0.0);
      for (int r = 0; r < st.layout.tp; ++r)
        st.ranks[static_cast<std::size_t>(r)].thread->post([this, &st, r, &mbs, b, &outs, a, s, pp, &rank_s] {
          auto t_task = std::chrono::steady_clock::now();
          run_stage_rank(st, r, mbs[static_cast<std::size_t>(b)], outs[a], s == pp - 1);
          rank_s[a][static_cast<std::size_t>(r)] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_task).count();
        });
    }
    std::exception_ptr err;
    for (std::size_t a = 0; a < active.size(); ++a) {
      Stage& st = st_[static_cast<std::size_t>(active[a].first)];
      for (auto& rk : st.ranks) {
        try {
          rk.thread->wait();
        } catch (...) {
          // One rank failed: wake its peers out of the collective, then report.
          if (!err) err = std::current_exception();
          st.comm->abort();
        }
      }
      stage_busy_s_[static_cast<std::size_t>(active[a].first)] +=
          *std::max_element(rank_s[a].begin(), rank_s[a].end());
    }
    if (err) std::rethrow_exception(err);
    for (std::size_t a = 0; a < active.size(); ++a) mbs[static_cast<std::size_t>(active[a].second)].x = std::move(outs[a]);
  }

  // The classifier, for the last token of each chunk that wants logits.
  std::vector<std::vector<float>> logits;
  std::vector<float> xn(static_cast<std::size_t>(E));
  for (auto& mb : mbs) {
    std::size_t row = 0;
    for (const SeqChunk* c : mb.chunks) {
      row += c->tokens.size();
      if (!c->want_logits) continue;
      ops::rmsnorm(&mb.x[(row - 1) * E], w_.output_norm(), xn.data(), E, hp_.rms_eps);
      std::vector<float> l(static_cast<std::size_t>(hp_.n_vocab));
      ops::matmul(xn.data(), w_.output(), l.data(), 1);
      logits.push_back(std::move(l));
    }
  }
  return logits;
}

}  // namespace ftp::engine
