// SPDX-License-Identifier: Apache-2.0
// The CPU backend: one rank is a thread on a virtual device (with helper
// threads for its products where the device has CPUs to spare), its buffers
// and KV pages are host memory, matmuls go to lib/engine/ops (BLAS and the
// SIMD kernels; Q8_0 matrices from the store's packed copy where it has
// one), all-reduce and the head's gather to the stage's communicator
// (in-process, or Gloo across processes).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "comm/collective.hpp"
#include "comm/inproc.hpp"
#include "comm/pool.hpp"
#include "core/error.hpp"
#include "engine/intra_op.hpp"
#include "engine/kv_cache.hpp"
#include "engine/ops.hpp"
#include "engine/rank_backend.hpp"
#include "model/quant.hpp"

namespace ftp::engine {

namespace {

class CpuRank final : public RankBackend {
 public:
  CpuRank(const WeightStore& w, const RankSpec& spec, std::shared_ptr<comm::Collective> comm)
      : w_(w), hp_(w.hparams()), spec_(spec), comm_(std::move(comm)), packed_(w.packed_for_cpu()),
        pool_(spec.threads, spec.device) {
    const RankLayerView v = split_rank(hp_, spec.tp, spec.rank);
    kvh_ = v.kv_heads.size();
    kv_ = std::make_unique<KvStore>(spec.n_layers, spec.kv_blocks, spec.block_tokens, kvh_, hp_.head_dim,
                                    resolve_kv_dtype(spec.kv_dtype, w.matrix_dtype()));
    if (spec.device)
      spec.device->reserve(kv_->bytes(), "KV cache of stage " + std::to_string(spec.stage) + " rank " +
                                             std::to_string(spec.rank));
  }
  ~CpuRank() override {
    if (spec_.device) spec_.device->release(kv_->bytes());
  }

  void bind_thread() override {
    if (spec_.device) spec_.device->bind_current_thread();
  }
  void lower_helpers_priority(int delta) override { pool_.lower_priority(delta); }
  std::uint64_t kv_bytes() const override { return kv_->bytes(); }

  float* buffer(Buf id, std::size_t n) override {
    auto& b = bufs_[static_cast<std::size_t>(id)];
    if (b.size() < n) b.resize(n);
    return b.data();
  }
  void set_batch(const BatchLayout& b) override {
    b_ = &b;
    if (scores_.size() < static_cast<std::size_t>(b.max_pos)) scores_.resize(static_cast<std::size_t>(b.max_pos));
  }
  void upload(const float* host, float* dev, std::size_t n) override {
    if (host != dev) std::memcpy(dev, host, n * sizeof(float));
  }
  void download(const float* dev, float* host, std::size_t n) override {
    if (host != dev) std::memcpy(host, dev, n * sizeof(float));
  }
  void choose_tokens(const float* logits, std::size_t n_vocab, std::size_t n_rows, const TokenChoice* choices,
                     int* out, TokenLogprobs* lp) override {
    // The logits are host memory already: chosen in place, not copied.
    for (std::size_t i = 0; i < n_rows; ++i) {
      out[i] = choose_token(logits + i * n_vocab, n_vocab, choices[i]);
      if (lp && choices[i].logprobs >= 0) lp[i] = token_logprobs(logits + i * n_vocab, n_vocab, out[i], choices[i].logprobs);
    }
  }

  void embed(float* x) override {
    const MatView e = w_.embedding(spec_.tp, spec_.rank, spec_.device);
    const int first = w_.vocab_rows(spec_.tp, spec_.rank).begin;
    for (int r = 0; r < b_->n_rows; ++r) {
      const std::int64_t local = b_->tokens[static_cast<std::size_t>(r)] - first;
      float* out = row(x, r, hp_.n_embd);
      if (local < 0 || local >= e.rows)
        std::fill_n(out, hp_.n_embd, 0.0f);
      else
        model::to_f32(*e.t, (e.r0 + local) * e.t->cols, e.t->cols, out);
    }
  }
  void gather_columns(const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                      float* full) override {
    if (spec_.tp > 1) return comm_->gather_columns(spec_.rank, slice, rows, widths, full);
    if (slice != full && !widths.empty()) std::copy_n(slice, rows * widths[0], full);
  }
  void rmsnorm(const float* x, const float* w, float* out, int rows) override {
    for (int r = 0; r < rows; ++r) ops::rmsnorm(row(x, r, hp_.n_embd), w, row(out, r, hp_.n_embd), hp_.n_embd, hp_.rms_eps);
  }
  void matmul(const float* x, const MatView& w, float* out, int rows) override {
    if (!packed_) return split_matmul(pool_, x, w, nullptr, out, rows);
    // A matrix is packed (Q8_0) or copied onto huge pages (the other
    // quantized types, the same bytes), never both: one lookup for Q8_0.
    if (const PackedQ8* p = packed_->find(w.t)) return split_matmul(pool_, x, w, p, out, rows);
    MatView v = w;
    if (const model::TensorView* c = packed_->copy_of(w.t)) v.t = c;
    split_matmul(pool_, x, v, nullptr, out, rows);
  }
  void add_bias(float* x, const VecView& b) override {
    const float* bias = b.data();
    const int n = static_cast<int>(b.n);
    for (int r = 0; r < b_->n_rows; ++r) {
      float* xr = row(x, r, n);
      for (int i = 0; i < n; ++i) xr[i] += bias[i];
    }
  }
  void head_rmsnorm(float* v, const float* w, int n_heads) override {
    const int hd = hp_.head_dim;
    for (int h = 0; h < b_->n_rows * n_heads; ++h) ops::rmsnorm(row(v, h, hd), w, row(v, h, hd), hd, hp_.rms_eps);
  }
  void rope(float* v, int n_heads) override {
    for (int r = 0; r < b_->n_rows; ++r)
      ops::rope(row(v, r, n_heads * hp_.head_dim), n_heads, hp_.head_dim, hp_.n_rot, b_->pos[static_cast<std::size_t>(r)],
                hp_.rope_theta, hp_.rope_type, w_.rope_freqs());
  }
  void kv_write(int layer, const float* k, const float* v) override {
    const int hd = hp_.head_dim, B = spec_.block_tokens;
    for (int r = 0; r < b_->n_rows; ++r) {
      int slot = b_->slot[static_cast<std::size_t>(r)], blk = slot / B, s = slot % B;
      for (int j = 0; j < kvh_; ++j) {
        // K pages transposed, [head_dim][slot]: attention reads a page's
        // positions as vectors (ops::attention_head).
        const float* kr = row(k, r, kvh_ * hd) + j * hd;
        const float* vr = row(v, r, kvh_ * hd) + j * hd;
        switch (kv_->dtype()) {
          case KvDtype::f32: {
            float* kt = static_cast<float*>(kv_->k(layer, blk, j)) + s;
            for (int d = 0; d < hd; ++d) kt[static_cast<std::ptrdiff_t>(d) * B] = kr[d];
            std::copy_n(vr, hd, static_cast<float*>(kv_->v(layer, blk, j)) + s * hd);
            break;
          }
          case KvDtype::f16: store16(layer, blk, j, s, kr, vr, model::quant::f32_to_f16); break;
          default: store16(layer, blk, j, s, kr, vr, f32_to_bf16); break;
        }
      }
    }
  }
  void attention(int layer, const float* q, float* out, int nq, int q_head0, int kv_head0) override {
    const int hd = hp_.head_dim, B = spec_.block_tokens, group = hp_.n_head / hp_.n_head_kv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* scores = scores_.data();
    for (int r = 0; r < b_->n_rows; ++r) {
      const int n = b_->pos[static_cast<std::size_t>(r)] + 1;
      const int* table = &b_->block_table[static_cast<std::size_t>(b_->seq[static_cast<std::size_t>(r)]) * b_->max_blocks];
      const int pages = (n + B - 1) / B;
      kp_.resize(static_cast<std::size_t>(pages));
      vp_.resize(static_cast<std::size_t>(pages));
      int kv_now = -1;
      for (int h = 0; h < nq; ++h) {
        const int kvj = (q_head0 + h) / group - kv_head0;
        if (kvj != kv_now) {  // the pages of this KV head (query heads of a group share them)
          pages_of_head(layer, table, pages, kvj);
          kv_now = kvj;
        }
        ops::attention_head(row(q, r, nq * hd) + h * hd, kp_.data(), vp_.data(), n, hd, B, scale, scores,
                            row(out, r, nq * hd) + h * hd);
      }
    }
  }
  void silu_mul(float* g, const float* u, std::size_t n) override { ops::silu_mul(g, u, n); }
  void zero(float* x, std::size_t n) override { std::fill_n(x, n, 0.0f); }
  void add(float* x, const float* y, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) x[i] += y[i];
  }
  void all_reduce(float* x, std::size_t n) override {
    if (spec_.tp > 1) comm_->all_reduce_sum(spec_.rank, x, n);
  }
  void gather_logit_rows(const float* x, float* out) override {
    const int E = hp_.n_embd;
    for (std::size_t i = 0; i < b_->logit_rows.size(); ++i)
      std::copy_n(row(x, b_->logit_rows[i], E), E, out + i * static_cast<std::size_t>(E));
  }
  void abort() noexcept override { comm_->abort(); }
  bool recover() noexcept override { return comm_->reset(); }

 private:
  /// One 16-bit position: K into its column of the transposed page, V into its row.
  template <typename Conv>
  void store16(int layer, int blk, int j, int s, const float* kr, const float* vr, Conv conv) {
    const int hd = hp_.head_dim, B = spec_.block_tokens;
    auto* kt = static_cast<std::uint16_t*>(kv_->k(layer, blk, j)) + s;
    auto* vt = static_cast<std::uint16_t*>(kv_->v(layer, blk, j)) + static_cast<std::ptrdiff_t>(s) * hd;
    for (int d = 0; d < hd; ++d) {
      kt[static_cast<std::ptrdiff_t>(d) * B] = conv(kr[d]);
      vt[d] = conv(vr[d]);
    }
  }
  /// kp_, vp_ <- the float32 pages of KV head kvj for `pages` pages of
  /// `table`: the store's own pages (f32), or their exact widening into
  /// wide_ (f16, bf16; the query heads of a group share one widening).
  void pages_of_head(int layer, const int* table, int pages, int kvj) {
    const std::size_t page = static_cast<std::size_t>(spec_.block_tokens) * hp_.head_dim;
    if (kv_->dtype() == KvDtype::f32) {
      for (int b = 0; b < pages; ++b) {
        kp_[static_cast<std::size_t>(b)] = static_cast<const float*>(kv_->k(layer, table[b], kvj));
        vp_[static_cast<std::size_t>(b)] = static_cast<const float*>(kv_->v(layer, table[b], kvj));
      }
      return;
    }
    if (wide_.size() < 2 * page * static_cast<std::size_t>(pages)) wide_.resize(2 * page * static_cast<std::size_t>(pages));
    const bool half = kv_->dtype() == KvDtype::f16;
    for (int b = 0; b < pages; ++b) {
      float* kw = wide_.data() + 2 * page * static_cast<std::size_t>(b);
      float* vw = kw + page;
      const auto* k16 = static_cast<const std::uint16_t*>(kv_->k(layer, table[b], kvj));
      const auto* v16 = static_cast<const std::uint16_t*>(kv_->v(layer, table[b], kvj));
      if (half) {
        ops::widen_f16(k16, kw, page);
        ops::widen_f16(v16, vw, page);
      } else {
        for (std::size_t i = 0; i < page; ++i) kw[i] = bf16_to_f32(k16[i]);
        for (std::size_t i = 0; i < page; ++i) vw[i] = bf16_to_f32(v16[i]);
      }
      kp_[static_cast<std::size_t>(b)] = kw;
      vp_[static_cast<std::size_t>(b)] = vw;
    }
  }

  template <typename T>
  static T* row(T* base, int r, int width) {
    return base + static_cast<std::size_t>(r) * static_cast<std::size_t>(width);
  }

  const WeightStore& w_;
  const model::HParams& hp_;
  RankSpec spec_;
  std::shared_ptr<comm::Collective> comm_;
  const PackedWeights* packed_;  // the store's, shared by every domain; null: none
  int kvh_ = 0;
  std::unique_ptr<KvStore> kv_;
  std::array<std::vector<float>, static_cast<std::size_t>(Buf::count)> bufs_;
  std::vector<float> scores_;
  std::vector<const float*> kp_, vp_;  // one head's KV pages (attention)
  std::vector<float> wide_;            // 16-bit pages widened to float32 for attention_head
  const BatchLayout* b_ = nullptr;
  IntraOpPool pool_;  // the rank thread and its helpers: the products split by rows
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() { ops::blas_single_threaded(); }
  std::string name() const override { return "cpu"; }
  std::vector<std::unique_ptr<RankBackend>> make_stage(const WeightStore& weights,
                                                       const std::vector<RankSpec>& specs) override {
    if (specs.empty()) throw InputError("cpu backend: a stage has at least one rank");
    // The store's one-time preparation for this backend (packing its Q8_0
    // matrices) happens with its first stage; every later stage shares it.
    weights.packed_for_cpu();
    return make_stage_ranks(weights, specs, pool_.acquire(pool_key(specs)));
  }
  void prepare_communicators(const std::vector<std::vector<RankSpec>>& stages) override {
    // The pool keeps communicators of the table's devices only (as the NCCL
    // root spans the table's GPUs only), then makes the table's sets.
    std::map<comm::InprocPool::Key, int> count;
    std::vector<std::string> devices;
    for (const auto& st : stages)
      if (!st.empty()) {
        const comm::InprocPool::Key key = pool_key(st);
        ++count[key];
        devices.insert(devices.end(), key.begin(), key.end());
      }
    pool_.span(devices);
    for (const auto& [key, n] : count) pool_.prepare(key, n);
  }
  CommunicatorStats communicator_stats() const override { return {pool_.created(), pool_.create_ms()}; }
  std::vector<std::string> communicator_devices() const override { return pool_.devices(); }
  std::vector<std::unique_ptr<RankBackend>> make_stage_ranks(const WeightStore& weights, const std::vector<RankSpec>& specs,
                                                             std::shared_ptr<comm::Collective> comm) override {
    if (specs.empty()) throw InputError("cpu backend: a stage has at least one rank here");
    weights.packed_for_cpu();
    std::vector<std::unique_ptr<RankBackend>> ranks;
    for (const RankSpec& s : specs) ranks.push_back(std::make_unique<CpuRank>(weights, s, comm));
    return ranks;
  }

 private:
  /// A stage's device set: its ranks' virtual devices in rank order.
  static comm::InprocPool::Key pool_key(const std::vector<RankSpec>& specs) {
    comm::InprocPool::Key k;
    for (const RankSpec& s : specs) k.push_back(s.device ? s.device->name() : "");
    return k;
  }
  comm::InprocPool pool_;
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

Backend& backend_named(const std::string& name) {
  if (name == "cpu") return cpu_backend();
  if (name == "cuda") return cuda_backend();
  throw InputError("backend \"" + name + "\": unknown (choices: cpu, cuda)");
}

}  // namespace ftp::engine
