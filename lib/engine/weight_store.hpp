// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/packed_weights.hpp"
#include "model/model.hpp"

namespace ftp::engine {

/// Half-open index range [begin, end).
struct Range {
  int begin = 0;
  int end = 0;
  int size() const noexcept { return end - begin; }
};

/// A view of a sub-matrix of a weight tensor as it lies in the model file
/// (any dtype): rows [r0, r0 + rows) and columns [c0, c0 + cols) of the
/// row-major [out][in] tensor. Never a copy.
struct MatView {
  const model::TensorView* t = nullptr;
  std::int64_t r0 = 0, rows = 0;
  std::int64_t c0 = 0, cols = 0;
};

/// A range of a float32 vector the store converted (a bias): elements
/// [first, first + n) of the vector at `base`. Never a copy; `base` is what
/// a device backend looks up its resident copy by.
struct VecView {
  const float* base = nullptr;  ///< the whole vector; null when the layer has none
  std::int64_t first = 0, n = 0;

  bool empty() const noexcept { return base == nullptr; }
  const float* data() const noexcept { return base + first; }
};

/// The part of a layer's weights one tensor-parallel rank uses.
/// Column-parallel matrices (q, k, v, gate, up) are row ranges of [out][in];
/// row-parallel ones (o, down) are column ranges: both are views of the
/// same resident tensors for every gear.
struct RankLayerView {
  const float* attn_norm = nullptr;  ///< [n_embd]
  const float* ffn_norm = nullptr;   ///< [n_embd]
  MatView wq, wk, wv;                ///< rows of this rank's heads
  MatView wo;                        ///< all n_embd rows, columns of this rank's query heads
  MatView w_gate, w_up;              ///< rows of this rank's feed-forward slice
  MatView w_down;                    ///< all n_embd rows, columns of the feed-forward slice
  VecView bq, bk, bv;                ///< the biases of this rank's heads (like wq, wk, wv's rows); empty when none
  const float* q_norm = nullptr;     ///< [head_dim] per-head RMSNorm of q, shared by every head (so every rank); null when none
  const float* k_norm = nullptr;     ///< [head_dim] the same for k
  Range q_heads;                     ///< query heads of this rank
  Range kv_heads;                    ///< KV heads it reads (replicated when tp > n_head_kv)
  Range ff;                          ///< feed-forward rows of this rank
};

/// How heads and feed-forward rows are split over `tp` ranks. Heads split
/// evenly (tp must divide n_head, and divide n_head_kv or be a multiple of
/// it: KV heads are then replicated). The feed-forward width is split as
/// evenly as possible, so widths that tp does not divide (stories260K's 172
/// at TP 8) give shards of uneven width.
RankLayerView split_rank(const model::HParams& hp, int tp, int rank);

/// Why rank views of a row-parallel matrix (wo, w_down: a column range)
/// cannot serve tensor parallelism `tp`, or "" when they can: a range of a
/// Q4_0..Q6_K tensor must start and end on a block boundary (32 or 256
/// columns). WeightStore::layer throws it as an ftp::InputError, so a gear
/// that splits inside a block is refused when its domain is built.
std::string row_parallel_refusal(const MatView& m, int tp);

/// The resident weights: the model's tensors where they lie (memory-mapped,
/// in their stored dtype), viewed by every domain of every gear. Only the
/// vectors are converted to float32: the norms (n_embd or head_dim floats
/// each), the q/k/v biases, rope_freqs. Biases are split like the rows of
/// their matrices (VecView ranges of one vector); per-head norms are shared
/// by every head, so every rank views the whole vector.
/// Building a domain takes views: no weight byte is copied.
///
/// One exception, made once per store and not per domain: the CPU backend's
/// packed copy of the Q8_0 matrices (PackedWeights, packed_for_cpu), the
/// store's one-time preparation for that backend, counted apart
/// (packed_bytes). Every domain of every gear then reads that one copy.
class WeightStore {
 public:
  /// `m` must outlive the store.
  explicit WeightStore(const model::Model& m);

  const model::HParams& hparams() const noexcept { return m_.hparams; }
  const model::Model& model() const noexcept { return m_; }

  /// The stored dtype of the model's matrices (the first layer's wq): what
  /// KvDtype::automatic follows (resolve_kv_dtype).
  model::DType matrix_dtype() const noexcept;

  /// Views of one layer for rank `rank` of `tp`; no allocation, no copy.
  RankLayerView layer(int layer, int tp, int rank) const;

  /// The embedding row of `token` as float32.
  void embed(int token, float* out) const;
  const float* output_norm() const noexcept { return output_norm_.data(); }
  /// [n_rot/2] factors dividing each RoPE pair's frequency (Llama 3
  /// rope_freqs), or null when the model has none.
  const float* rope_freqs() const noexcept { return rope_freqs_.empty() ? nullptr : rope_freqs_.data(); }
  /// The classifier [n_vocab][n_embd] (the token embedding when tied).
  MatView output() const;

  /// The CPU backend's packed copies of the Q8_0 matrices: made on the first
  /// call (thread-safe; the CPU backend calls it when it builds a stage),
  /// the same object afterwards. Null when nothing is packed: packing is
  /// off (PackedWeights::wanted(), or release mode), or the model has no
  /// Q8_0 matrix.
  const PackedWeights* packed_for_cpu() const;
  /// Release weight mode reads the mapped tensors only: release_rank must
  /// free what the domains read, and a packed copy would stay resident. So a
  /// store whose gear table uses release mode never packs (the service calls
  /// this before building a domain). Throws ftp::Error if the copy exists.
  void use_release_mode();
  /// Bytes of the packed copy (0 before packed_for_cpu or without one).
  std::uint64_t packed_bytes() const;

  /// Release weight mode: gives the memory of one rank's weight views of
  /// layers [first, first + n) back to the system (madvise MADV_DONTNEED on
  /// the whole pages inside each view's byte span). The views stay valid:
  /// pages come back from the file on the next touch. Returns bytes advised.
  /// Only the mapped file's pages: a packed copy stays (see use_release_mode).
  std::uint64_t release_rank(int first, int n, int tp, int rank) const;
  /// Prefetch before a domain that needs these views starts (MADV_WILLNEED):
  /// the reload overlaps the wait instead of the first steps. Returns bytes.
  std::uint64_t prefetch_rank(int first, int n, int tp, int rank) const;

  /// Bytes of the weights in the model file (mapped, not copied).
  std::uint64_t weight_bytes() const noexcept { return weight_bytes_; }
  /// Bytes the store allocated itself for every domain (the float32
  /// vectors); the packed copy is packed_bytes.
  std::uint64_t owned_bytes() const noexcept { return owned_bytes_; }

 private:
  std::uint64_t advise(int first, int n, int tp, int rank, int advice) const;
  const model::Model& m_;
  /// One layer's vectors as float32 (empty where the layer has none).
  struct LayerVecs {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  };
  std::vector<LayerVecs> vecs_;
  std::vector<float> output_norm_, rope_freqs_;
  std::uint64_t weight_bytes_ = 0, owned_bytes_ = 0;
  mutable std::mutex pack_mu_;
  mutable bool pack_tried_ = false;
  bool release_mode_ = false;
  mutable std::unique_ptr<PackedWeights> packed_;
};

}  // namespace ftp::engine
