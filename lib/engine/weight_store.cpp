// SPDX-License-Identifier: Apache-2.0
#include "engine/weight_store.hpp"

#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.hpp"

namespace ftp::engine {

namespace {

Range split(int n, int parts, int index) {
  // Even split, the first n % parts ranks one larger; contiguous.
  int base = n / parts, extra = n % parts;
  int begin = index * base + std::min(index, extra);
  return Range{begin, begin + base + (index < extra ? 1 : 0)};
}

std::vector<float> vec_f32(const model::TensorView& t) {
  if (t.empty()) return {};
  std::vector<float> v(static_cast<std::size_t>(t.elements()));
  model::to_f32(t, 0, t.elements(), v.data());
  return v;
}

const float* or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

VecView slice(const std::vector<float>& v, std::int64_t first, std::int64_t n) {
  if (v.empty()) return {};
  return VecView{v.data(), first, n};
}

}  // namespace

RankLayerView split_rank(const model::HParams& hp, int tp, int rank) {
  if (tp < 1 || rank < 0 || rank >= tp)
    throw Error("split_rank: rank " + std::to_string(rank) + " of tp " + std::to_string(tp));
  if (hp.n_head % tp != 0)
    throw InputError("tp " + std::to_string(tp) + " does not divide n_head " + std::to_string(hp.n_head));
  if (tp <= hp.n_head_kv ? hp.n_head_kv % tp != 0 : tp % hp.n_head_kv != 0)
    throw InputError("tp " + std::to_string(tp) + " must divide n_head_kv " + std::to_string(hp.n_head_kv) +
                     " or be a multiple of it");
  if (tp > hp.n_ff)
    throw InputError("tp " + std::to_string(tp) + " exceeds the feed-forward width " + std::to_string(hp.n_ff));
  RankLayerView v{};
  int qh = hp.n_head / tp;
  v.q_heads = Range{rank * qh, (rank + 1) * qh};
  if (tp <= hp.n_head_kv) {
    int kvh = hp.n_head_kv / tp;
    v.kv_heads = Range{rank * kvh, (rank + 1) * kvh};
  } else {
    // More ranks than KV heads: each rank reads the one KV head its query
    // heads belong to; tp / n_head_kv ranks view the same head's weights.
    int kv = v.q_heads.begin / (hp.n_head / hp.n_head_kv);
    v.kv_heads = Range{kv, kv + 1};
  }
  v.ff = split(hp.n_ff, tp, rank);
  return v;
}

WeightStore::WeightStore(const model::Model& m) : m_(m) {
  const auto& w = m.weights;
  auto count = [&](const model::TensorView& t) { weight_bytes_ += t.bytes; };
  count(w.tok_embd);
  count(w.output_norm);
  if (w.output.data != w.tok_embd.data) count(w.output);
  for (const auto& l : w.layers) {
    for (const auto* t : l.tensors())
      count(*t);
    LayerVecs lv{vec_f32(l.attn_norm), vec_f32(l.ffn_norm), vec_f32(l.bq),     vec_f32(l.bk),
                 vec_f32(l.bv),        vec_f32(l.q_norm),   vec_f32(l.k_norm)};
    for (const auto* v : {&lv.attn_norm, &lv.ffn_norm, &lv.bq, &lv.bk, &lv.bv, &lv.q_norm, &lv.k_norm})
      owned_bytes_ += v->size() * sizeof(float);
    vecs_.push_back(std::move(lv));
  }
  output_norm_ = vec_f32(w.output_norm);
  rope_freqs_ = vec_f32(w.rope_freqs);
  count(w.rope_freqs);
  owned_bytes_ += (output_norm_.size() + rope_freqs_.size()) * sizeof(float);
}

model::DType WeightStore::matrix_dtype() const noexcept {
  return m_.weights.layers.empty() ? model::DType::f32 : m_.weights.layers.front().wq.dtype;
}

RankLayerView WeightStore::layer(int layer, int tp, int rank) const {
  const model::LayerWeights& l = m_.weights.layers.at(static_cast<std::size_t>(layer));
  const auto& hp = m_.hparams;
  RankLayerView v = split_rank(hp, tp, rank);
  const std::int64_t E = hp.n_embd, hd = hp.head_dim;
  const LayerVecs& lv = vecs_[static_cast<std::size_t>(layer)];
  v.attn_norm = lv.attn_norm.data();
  v.ffn_norm = lv.ffn_norm.data();
  v.bq = slice(lv.bq, v.q_heads.begin * hd, v.q_heads.size() * hd);
  v.bk = slice(lv.bk, v.kv_heads.begin * hd, v.kv_heads.size() * hd);
  v.bv = slice(lv.bv, v.kv_heads.begin * hd, v.kv_heads.size() * hd);
  v.q_norm = or_null(lv.q_norm);
  v.k_norm = or_null(lv.k_norm);
  v.wq = MatView{&l.wq, v.q_heads.begin * hd, v.q_heads.size() * hd, 0, E};
  v.wk = MatView{&l.wk, v.kv_heads.begin * hd, v.kv_heads.size() * hd, 0, E};
  v.wv = MatView{&l.wv, v.kv_heads.begin * hd, v.kv_heads.size() * hd, 0, E};
  v.wo = MatView{&l.wo, 0, E, v.q_heads.begin * hd, v.q_heads.size() * hd};
  v.w_gate = MatView{&l.w_gate, v.ff.begin, v.ff.size(), 0, E};
  v.w_up = MatView{&l.w_up, v.ff.begin, v.ff.size(), 0, E};
  v.w_down = MatView{&l.w_down, 0, E, v.ff.begin, v.ff.size()};
  for (const MatView* m : {&v.wo, &v.w_down}) {
    const std::string why = row_parallel_refusal(*m, tp);
    if (!why.empty()) throw InputError(why);
  }
  return v;
}

std::string row_parallel_refusal(const MatView& m, int tp) {
  const model::TensorView& t = *m.t;
  const int blk = model::dtype_block(t.dtype);
  // Q8_0 keeps its portable path for such views; the other block types
  // quantize the activations per block as llama.cpp does, which a rank
  // holding part of a block cannot do as one rank would.
  if (blk == 1 || t.dtype == model::DType::q8_0 || (m.c0 % blk == 0 && m.cols % blk == 0)) return "";
  return "tp " + std::to_string(tp) + ": " + t.name + " is " + model::dtype_name(t.dtype) + " (blocks of " +
         std::to_string(blk) + " columns) and tensor parallelism would split its " + std::to_string(t.cols) +
         " columns at " + std::to_string(m.c0 % blk != 0 ? m.c0 : m.c0 + m.cols) +
         ", inside a block: a row-parallel split must fall on a block boundary (choose a smaller tp)";
}

void WeightStore::embed(int token, float* out) const {
  const auto& t = m_.weights.tok_embd;
  model::to_f32(t, static_cast<std::int64_t>(token) * t.cols, t.cols, out);
}

std::uint64_t WeightStore::advise(int first, int n, int tp, int rank, int advice) const {
  // Dropping pages of memory that is not a file mapping would lose them.
  if (!m_.weights_file_mapped) return 0;
  const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t bytes = 0;
  for (int L = first; L < first + n; ++L) {
    RankLayerView v = layer(L, tp, rank);
    for (const MatView* m : {&v.wq, &v.wk, &v.wv, &v.wo, &v.w_gate, &v.w_up, &v.w_down}) {
      const model::TensorView& t = *m->t;
      if (m->rows == 0 || m->cols == 0) continue;
      std::int64_t first_el = m->r0 * t.cols + m->c0;
      std::int64_t last_el = (m->r0 + m->rows - 1) * t.cols + m->c0 + m->cols;  // one past
      auto base = reinterpret_cast<std::uintptr_t>(t.data);
      // Whole blocks of a quantized tensor: the one holding the first element to the one holding the last.
      const std::int64_t blk = model::dtype_block(t.dtype);
      std::uintptr_t a = base + model::dtype_bytes(t.dtype, first_el / blk * blk);
      std::uintptr_t b = base + std::min<std::size_t>(t.bytes, model::dtype_bytes(t.dtype, (last_el + blk - 1) / blk * blk));
      // Whole pages inside the span only: never touch a neighbour's bytes.
      std::uintptr_t pa = (a + page - 1) / page * page, pb = b / page * page;
      if (pb > pa && ::madvise(reinterpret_cast<void*>(pa), pb - pa, advice) == 0) bytes += pb - pa;
    }
  }
  return bytes;
}

std::uint64_t WeightStore::release_rank(int first, int n, int tp, int rank) const {
  return advise(first, n, tp, rank, MADV_DONTNEED);
}

std::uint64_t WeightStore::prefetch_rank(int first, int n, int tp, int rank) const {
  return advise(first, n, tp, rank, MADV_WILLNEED);
}

const PackedWeights* WeightStore::packed_for_cpu() const {
  std::lock_guard lk(pack_mu_);
  if (!pack_tried_) {
    pack_tried_ = true;
    if (!release_mode_ && PackedWeights::wanted()) {
      auto p = std::make_unique<PackedWeights>(m_);
      if (p->tensors() > 0) packed_ = std::move(p);
    }
  }
  return packed_.get();
}

void WeightStore::use_release_mode() {
  std::lock_guard lk(pack_mu_);
  if (packed_) throw Error("weight store: release mode after the CPU backend packed the Q8_0 weights");
  release_mode_ = true;
}

std::uint64_t WeightStore::packed_bytes() const {
  std::lock_guard lk(pack_mu_);
  return packed_ ? packed_->bytes() : 0;
}

MatView WeightStore::output() const {
  const auto& t = m_.weights.output.data ? m_.weights.output : m_.weights.tok_embd;
  return MatView{&t, 0, t.rows, 0, t.cols};
}

}  // namespace ftp::engine
