// SPDX-License-Identifier: Apache-2.0
#include "engine/weight_store.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.hpp"
#include "model/tp_split.hpp"

namespace ftp::engine {

namespace {

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
  // The split itself is model::tp_split's, which the planner counts by.
  const model::TpSplit s = model::tp_split(hp.n_head, hp.n_head_kv, hp.n_ff, tp, rank);
  RankLayerView v{};
  v.q_heads = Range{s.q_begin, s.q_end};
  v.kv_heads = Range{s.kv_begin, s.kv_end};
  v.ff = Range{s.ff_begin, s.ff_end};
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

RankLayerView WeightStore::mapped_layer(int layer, int tp, int rank) const {
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
    if (!release_mode_ && copies_.empty() && (PackedWeights::wanted() || PackedWeights::copies_wanted())) {
      auto p = std::make_unique<PackedWeights>(m_);
      if (p->tensors() > 0) packed_ = std::move(p);
    }
  }
  return packed_.get();
}

void WeightStore::use_release_mode() {
  std::lock_guard lk(pack_mu_);
  if (packed_) throw Error("weight store: release mode after the CPU backend made its copy of the weights (packed Q8_0, huge-page copies)");
  release_mode_ = true;
}

std::uint64_t WeightStore::packed_bytes() const {
  std::lock_guard lk(pack_mu_);
  return packed_ ? packed_->bytes() : 0;
}


// --- Device-memory mode -------------------------------------------------

struct WeightStore::DeviceCopy {
  /// A rectangle of one mapped tensor, copied: rows [r0, r0 + view.rows) and
  /// columns [c0, c0 + view.cols) of the mapped tensor `from` (found by its
  /// data: a tied head's view is of the embedding's bytes).
  struct Segment {
    ShardSegment at;         // where in the mapped tensor
    model::TensorView view;  // the copy, in the tensor's dtype; view.data into DeviceCopy::mem
    bool holds(const MatView& m) const { return at.holds(m); }
  };

  hardware::VirtualDevice* device = nullptr;
  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<void, Free> mem;        // every segment
  std::vector<Segment> segments;          // never resized once made: views point at them
  std::map<int, LayerVecs> vecs;          // the layers held: their vectors
  std::vector<float> output_norm;         // with the head
  std::uint64_t bytes = 0;
  bool released = false;                  // release_device freed it; copy_to_device makes it again

  const Segment* find(const MatView& m) const {
    for (const Segment& s : segments)
      if (s.holds(m)) return &s;
    return nullptr;
  }
};

namespace {

constexpr std::size_t kSegmentAlign = 64;  // bytes: a cache line, what the SIMD kernels like

std::size_t aligned(std::size_t n) { return (n + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign; }

/// The merged intervals [a, b) of `iv` (touching ones join).
std::vector<std::pair<std::int64_t, std::int64_t>> merged(std::vector<std::pair<std::int64_t, std::int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& x : iv)
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  return out;
}

std::string range_text(const MatView& m) {
  return m.t->name + " rows [" + std::to_string(m.r0) + ", " + std::to_string(m.r0 + m.rows) + ") columns [" +
         std::to_string(m.c0) + ", " + std::to_string(m.c0 + m.cols) + ")";
}

}  // namespace

WeightStore::~WeightStore() {
  for (auto& [dev, c] : copies_) c->device->release_weights(c->bytes);
}

const WeightStore::DeviceCopy* WeightStore::copy_of(const hardware::VirtualDevice* device) const {
  if (!device || copies_.empty()) return nullptr;
  auto it = copies_.find(device);
  if (it == copies_.end())
    throw Error("device-memory mode: device " + device->name() + " holds no copy of the weights (it serves no gear of the table)");
  if (it->second->released)
    throw Error("device-memory mode: device " + device->name() +
                "'s weights were released (release weight mode) and are not copied back yet");
  return it->second.get();
}

RankLayerView WeightStore::layer(int layer, int tp, int rank, const hardware::VirtualDevice* device) const {
  RankLayerView v = mapped_layer(layer, tp, rank);
  const DeviceCopy* c = copy_of(device);
  if (!c) return v;
  auto vecs = c->vecs.find(layer);
  if (vecs == c->vecs.end())
    throw Error("device-memory mode: device " + device->name() + " holds no copy of layer " + std::to_string(layer));
  for (MatView* m : {&v.wq, &v.wk, &v.wv, &v.wo, &v.w_gate, &v.w_up, &v.w_down}) {
    if (m->rows == 0 || m->cols == 0) continue;
    const DeviceCopy::Segment* s = c->find(*m);
    if (!s)
      throw Error("device-memory mode: device " + device->name() + " holds no copy of " + range_text(*m) +
                  " (rank " + std::to_string(rank) + " of tp " + std::to_string(tp) + ")");
    *m = MatView{&s->view, m->r0 - s->at.r0, m->rows, m->c0 - s->at.c0, m->cols};
  }
  const LayerVecs& lv = vecs->second;
  v.attn_norm = lv.attn_norm.data();
  v.ffn_norm = lv.ffn_norm.data();
  v.bq = slice(lv.bq, v.bq.first, v.bq.n);
  v.bk = slice(lv.bk, v.bk.first, v.bk.n);
  v.bv = slice(lv.bv, v.bv.first, v.bv.n);
  v.q_norm = or_null(lv.q_norm);
  v.k_norm = or_null(lv.k_norm);
  return v;
}

model::RowSplit WeightStore::vocab_rows(int tp, int rank) const noexcept {
  return model::row_split(hparams().n_vocab, tp, rank);
}

MatView WeightStore::on_device(const MatView& m, const hardware::VirtualDevice* device, const char* what) const {
  const DeviceCopy* c = copy_of(device);
  if (!c || m.rows == 0) return m;
  const DeviceCopy::Segment* s = c->find(m);
  if (!s)
    throw Error("device-memory mode: device " + device->name() + " holds no copy of " + what + " (" + range_text(m) + ")");
  return MatView{&s->view, m.r0 - s->at.r0, m.rows, m.c0 - s->at.c0, m.cols};
}

MatView WeightStore::embedding(int tp, int rank, const hardware::VirtualDevice* device) const {
  const model::TensorView& t = m_.weights.tok_embd;
  const model::RowSplit v = vocab_rows(tp, rank);
  return on_device(MatView{&t, v.begin, v.size(), 0, t.cols}, device, "the embedding");
}

const float* WeightStore::output_norm(const hardware::VirtualDevice* device) const {
  if (const DeviceCopy* c = copy_of(device)) {
    if (c->output_norm.empty())
      throw Error("device-memory mode: device " + device->name() + " holds no copy of the final norm");
    return c->output_norm.data();
  }
  return output_norm_.data();
}

MatView WeightStore::output(int tp, int rank, const hardware::VirtualDevice* device) const {
  const auto& t = m_.weights.output.data ? m_.weights.output : m_.weights.tok_embd;
  const model::RowSplit v = vocab_rows(tp, rank);
  return on_device(MatView{&t, v.begin, v.size(), 0, t.cols}, device, "the head");
}

ShardUnion WeightStore::shard_union(const std::vector<RankShard>& shards) const {
  ShardUnion u;
  // Every view of every shard, by tensor (its data: a tied head is the embedding's).
  std::map<const void*, std::pair<const model::TensorView*, std::vector<MatView>>> views;
  std::set<int> layers;
  for (const RankShard& sh : shards) {
    for (int L = sh.first_layer; L < sh.first_layer + sh.n_layers; ++L) {
      const RankLayerView v = mapped_layer(L, sh.tp, sh.rank);
      for (const MatView* m : {&v.wq, &v.wk, &v.wv, &v.wo, &v.w_gate, &v.w_up, &v.w_down})
        if (m->rows > 0 && m->cols > 0) {
          auto& e = views[m->t->data];
          e.first = m->t;
          e.second.push_back(*m);
        }
      layers.insert(L);
    }
    // The vocabulary rows of the embedding and the head (one tensor when tied: shared).
    for (const MatView& m : {sh.first ? embedding(sh.tp, sh.rank) : MatView{},
                             sh.last ? output(sh.tp, sh.rank) : MatView{}})
      if (m.rows > 0) {
        auto& e = views[m.t->data];
        e.first = m.t;
        e.second.push_back(m);
      }
    u.embedding = u.embedding || sh.first;
    u.head = u.head || sh.last;
  }
  // Each tensor's views merged into rectangles: row ranges of a
  // column-parallel matrix (its views have every column), else column
  // ranges, widened to whole blocks, of a row-parallel one (every row).
  for (const auto& entry : views) {
    const auto& tv = entry.second;
    const model::TensorView& t = *tv.first;
    const bool by_rows = std::all_of(tv.second.begin(), tv.second.end(),
                                     [&](const MatView& m) { return m.c0 == 0 && m.cols == t.cols; });
    const std::int64_t blk = model::dtype_block(t.dtype);
    std::vector<std::pair<std::int64_t, std::int64_t>> iv;
    for (const MatView& m : tv.second) {
      if (by_rows) {
        iv.emplace_back(m.r0, m.r0 + m.rows);
        continue;
      }
      if (m.r0 != 0 || m.rows != t.rows)
        throw Error("device-memory mode: " + range_text(m) + " is neither whole rows nor whole columns");
      iv.emplace_back(m.c0 / blk * blk, std::min<std::int64_t>(t.cols, (m.c0 + m.cols + blk - 1) / blk * blk));
    }
    for (const auto& [a, b] : merged(std::move(iv))) {
      ShardSegment g;
      g.from = &t;
      g.r0 = by_rows ? a : 0;
      g.c0 = by_rows ? 0 : a;
      g.rows = by_rows ? b - a : t.rows;
      g.cols = by_rows ? t.cols : b - a;
      g.bytes = model::dtype_bytes(t.dtype, g.rows * g.cols);
      u.matrix_bytes += g.bytes;
      u.segments.push_back(g);
    }
  }
  u.layers.assign(layers.begin(), layers.end());
  for (int L : u.layers)
    for (const auto& [p, n] : layer_vectors(L)) u.vector_bytes += n * sizeof(float);
  if (u.head) u.vector_bytes += output_norm_.size() * sizeof(float);
  return u;
}

std::vector<std::pair<const float*, std::size_t>> WeightStore::layer_vectors(int layer) const {
  const LayerVecs& lv = vecs_.at(static_cast<std::size_t>(layer));
  std::vector<std::pair<const float*, std::size_t>> out;
  for (const auto* v : {&lv.attn_norm, &lv.ffn_norm, &lv.bq, &lv.bk, &lv.bv, &lv.q_norm, &lv.k_norm})
    if (!v->empty()) out.emplace_back(v->data(), v->size());
  return out;
}

std::uint64_t WeightStore::copy_to_device(hardware::VirtualDevice& device, const std::vector<RankShard>& shards) {
  // The map's nodes are made at start only: a released copy is made again
  // in its own node, which no other thread reads (no domain on the device).
  auto slot = copies_.find(&device);
  if (slot != copies_.end() && !slot->second->released)
    throw Error("device-memory mode: device " + device.name() + " has its copy already");
  {
    std::lock_guard lk(pack_mu_);
    if (packed_) throw Error("weight store: device-memory mode after the CPU backend made its copy of the weights (packed Q8_0, huge-page copies)");
    pack_tried_ = true;  // the copies are read as they are, never packed
  }
  const ShardUnion u = shard_union(shards);
  auto c = std::make_unique<DeviceCopy>();
  c->device = &device;
  for (int L : u.layers) c->vecs.try_emplace(L, vecs_[static_cast<std::size_t>(L)]);
  if (u.head) c->output_norm = output_norm_;
  for (const ShardSegment& g : u.segments) {
    DeviceCopy::Segment s;
    s.at = g;
    s.view = *g.from;
    s.view.rows = g.rows;
    s.view.cols = g.cols;
    s.view.bytes = g.bytes;
    s.view.data = nullptr;
    c->segments.push_back(std::move(s));
  }
  std::size_t total = 0;
  for (const DeviceCopy::Segment& s : c->segments) total += aligned(s.view.bytes);
  c->bytes = u.bytes();
  // Reserved before anything is allocated: a copy that does not fit is refused, naming the device.
  device.reserve_weights(c->bytes, "weights (device-memory mode: " + std::to_string(c->segments.size()) +
                                       " ranges of its shards' union)");
  try {
    c->mem.reset(total > 0 ? std::aligned_alloc(kSegmentAlign, total) : nullptr);
    if (total > 0 && !c->mem) throw Error("device-memory mode: cannot allocate " + std::to_string(total) + " bytes");
    auto* base = static_cast<unsigned char*>(c->mem.get());
    std::size_t off = 0;
    for (DeviceCopy::Segment& s : c->segments) {
      unsigned char* dst = base + off;
      off += aligned(s.view.bytes);
      const model::TensorView& t = *s.at.from;
      const auto* src = static_cast<const unsigned char*>(t.data);
      if (s.view.cols == t.cols) {
        std::memcpy(dst, src + model::dtype_bytes(t.dtype, s.at.r0 * t.cols), s.view.bytes);
      } else {
        const std::size_t row = model::dtype_bytes(t.dtype, s.view.cols);
        for (std::int64_t r = 0; r < t.rows; ++r)
          std::memcpy(dst + static_cast<std::size_t>(r) * row, src + model::dtype_bytes(t.dtype, r * t.cols + s.at.c0), row);
      }
      s.view.data = dst;
    }
  } catch (...) {
    device.release_weights(c->bytes);
    throw;
  }
  copied_bytes_ += c->bytes;
  const std::uint64_t b = c->bytes;
  if (slot != copies_.end())
    slot->second = std::move(c);
  else
    copies_.emplace(&device, std::move(c));
  return b;
}

std::uint64_t WeightStore::release_device(hardware::VirtualDevice& device) {
  auto it = copies_.find(&device);
  if (it == copies_.end() || it->second->released) return 0;
  const std::uint64_t b = it->second->bytes;
  auto gone = std::make_unique<DeviceCopy>();
  gone->device = &device;
  gone->released = true;
  it->second = std::move(gone);  // frees the memory of every segment
  device.release_weights(b);
  return b;
}

bool WeightStore::released(const hardware::VirtualDevice& device) const {
  auto it = copies_.find(&device);
  return it != copies_.end() && it->second->released;
}

std::string WeightStore::missing_on_device(const hardware::VirtualDevice& device,
                                           const std::vector<RankShard>& shards) const {
  if (released(device)) return "";
  try {
    for (const RankShard& sh : shards) {
      for (int L = sh.first_layer; L < sh.first_layer + sh.n_layers; ++L) layer(L, sh.tp, sh.rank, &device);
      if (sh.first) embedding(sh.tp, sh.rank, &device);
      if (sh.last) {
        output(sh.tp, sh.rank, &device);
        output_norm(&device);
      }
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::uint64_t WeightStore::device_bytes(const hardware::VirtualDevice* device) const {
  auto it = copies_.find(device);
  return it == copies_.end() ? 0 : it->second->bytes;
}

std::uint64_t WeightStore::copied_bytes() const { return copied_bytes_; }

bool WeightStore::device_memory() const { return !copies_.empty(); }

}  // namespace ftp::engine
