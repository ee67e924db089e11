// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hardware/cpu/virtual_device.hpp"
#include "engine/packed_weights.hpp"
#include "model/model.hpp"
#include "model/tp_split.hpp"

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

/// One rank's part of a gear, as a device serves it: rank `rank` of `tp`
/// of the stage over layers [first_layer, first_layer + n_layers), which is
/// the domain's first stage (it embeds) or its last (it holds the head).
struct RankShard {
  int first_layer = 0, n_layers = 0;
  int tp = 1, rank = 0;
  bool first = false, last = false;
  bool operator==(const RankShard&) const = default;
};

/// One rectangle of a mapped tensor that a device's shard union holds:
/// rows [r0, r0 + rows) and columns [c0, c0 + cols) of `from` (a
/// column-parallel matrix: whole rows; a row-parallel one: whole columns,
/// widened to whole blocks of its dtype).
struct ShardSegment {
  const model::TensorView* from = nullptr;
  std::int64_t r0 = 0, rows = 0, c0 = 0, cols = 0;
  std::uint64_t bytes = 0;
  /// Whether the view `m` (of the same tensor's bytes) lies inside.
  bool holds(const MatView& m) const noexcept {
    return m.t && from && m.t->data == from->data && m.r0 >= r0 && m.r0 + m.rows <= r0 + rows && m.c0 >= c0 &&
           m.c0 + m.cols <= c0 + cols;
  }
};

/// What a device holds for the ranks of `shards` (WeightStore::shard_union):
/// the one computation behind device-memory mode's copies and the CUDA
/// backend's resident uploads.
struct ShardUnion {
  std::vector<ShardSegment> segments;  ///< each tensor's merged views, each byte once
  std::vector<int> layers;             ///< the layers held (their vectors), ascending
  bool embedding = false;              ///< a first stage's rank: its vocabulary rows of the token embedding
  bool head = false;                   ///< a last stage's rank: its vocabulary rows of the classifier, the final norm
  std::uint64_t matrix_bytes = 0;      ///< of the segments
  std::uint64_t vector_bytes = 0;      ///< the layers' float32 vectors and the final norm
  std::uint64_t bytes() const noexcept { return matrix_bytes + vector_bytes; }
};

/// The resident weights: the model's tensors where they lie (memory-mapped,
/// in their stored dtype), viewed by every domain of every gear. Only the
/// vectors are converted to float32: the norms (n_embd or head_dim floats
/// each), the q/k/v biases, rope_freqs. Biases are split like the rows of
/// their matrices (VecView ranges of one vector); per-head norms are shared
/// by every head, so every rank views the whole vector.
/// Building a domain takes views: no weight byte is copied.
///
/// One exception, made once per store and not per domain: the CPU backend's
/// packed copy of the Q8_0 matrices and huge-page copy of the other
/// quantized ones (PackedWeights, packed_for_cpu), the store's one-time
/// preparation for that backend, counted apart (packed_bytes). Every domain
/// of every gear then reads that one copy.
///
/// Device-memory mode (copy_to_device; ftp-serve --device-memory) gives a
/// CPU virtual device what a GPU would hold: a private copy of exactly the
/// union of the views its ranks read over every gear of the table, made
/// once at start and reserved on the device. The views of a rank on that
/// device (layer, embed, output, output_norm given the device) then point
/// into its copy; building a domain still copies nothing.
class WeightStore {
 public:
  /// `m` must outlive the store.
  explicit WeightStore(const model::Model& m);
  /// Gives the devices' copies back (their reservations): the devices
  /// must outlive the store.
  ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  const model::HParams& hparams() const noexcept { return m_.hparams; }
  const model::Model& model() const noexcept { return m_; }

  /// The stored dtype of the model's matrices (the first layer's wq): what
  /// KvDtype::automatic follows (resolve_kv_dtype).
  model::DType matrix_dtype() const noexcept;

  /// Views of one layer for rank `rank` of `tp`; no allocation, no copy.
  /// With `device`: views of that device's copy where it has one
  /// (copy_to_device); in device-memory mode a device without one, or a
  /// view its copy lacks, is an ftp::Error naming both.
  RankLayerView layer(int layer, int tp, int rank, const hardware::VirtualDevice* device = nullptr) const;

  /// The token embedding rows that rank `rank` of `tp` holds
  /// (model::row_split of the vocabulary: vocabulary-parallel, each rank
  /// embeds the tokens of its rows and the stage sums the ranks' rows);
  /// from `device`'s copy, as layer. Rows r0.. of the view are tokens
  /// embedding_rows(tp, rank).begin...
  MatView embedding(int tp, int rank, const hardware::VirtualDevice* device = nullptr) const;
  /// Which vocabulary rows (token ids) rank `rank` of `tp` holds of the
  /// embedding and of the head.
  model::RowSplit vocab_rows(int tp, int rank) const noexcept;
  /// [n_embd] the final norm (from `device`'s copy, as layer).
  const float* output_norm(const hardware::VirtualDevice* device = nullptr) const;
  /// [n_rot/2] factors dividing each RoPE pair's frequency (Llama 3
  /// rope_freqs), or null when the model has none.
  const float* rope_freqs() const noexcept { return rope_freqs_.empty() ? nullptr : rope_freqs_.data(); }
  /// The classifier [n_vocab][n_embd] (the token embedding when tied;
  /// from `device`'s copy, as layer): the rows of rank `rank` of `tp`
  /// (vocab_rows; vocabulary-parallel: each rank of a last stage computes
  /// the logits of its rows), all of them at tp 1.
  MatView output(int tp, int rank, const hardware::VirtualDevice* device = nullptr) const;
  MatView output(const hardware::VirtualDevice* device = nullptr) const { return output(1, 0, device); }

  /// The union of what the ranks of `shards` read, as one device holds it
  /// (the rules of copy_to_device below); no allocation of weights.
  ShardUnion shard_union(const std::vector<RankShard>& shards) const;
  /// The float32 vectors of layer `layer` as the store converted them
  /// (norms, biases, per-head norms; empty ones where the layer has none).
  std::vector<std::pair<const float*, std::size_t>> layer_vectors(int layer) const;

  /// Device-memory mode: copies into memory of `device`'s own exactly what
  /// the ranks of `shards` read (their union, each byte once: rows of the
  /// column-parallel matrices, whole blocks of columns of the row-parallel
  /// ones, the layers' vectors, the vocabulary rows of the embedding for a
  /// first stage's ranks and of the head, with the final norm, for a last
  /// stage's), reserving the bytes
  /// on the device first (hardware::OutOfDeviceMemory names it when they do
  /// not fit). The bytes plan::shard_union_bytes counts, but for the layers'
  /// biases and per-head norms, which the plan's shapes do not have. Once
  /// per device, before any domain on it is built (the views are read
  /// without a lock); a second call throws ftp::Error, unless the copy was
  /// released (release_device): it is then made again, from any thread,
  /// while domains on other devices run. Packing for the CPU
  /// backend is off from then on (the copies are read as they are). Returns
  /// the bytes copied.
  std::uint64_t copy_to_device(hardware::VirtualDevice& device, const std::vector<RankShard>& shards);
  /// Release weight mode in device-memory mode: frees `device`'s copy and
  /// gives its reservation back (no domain on the device may remain);
  /// returns the bytes freed, 0 when it holds none. A later copy_to_device
  /// of the device makes it again (what a shift's reserve phase does); until
  /// then views on the device are an ftp::Error naming it.
  std::uint64_t release_device(hardware::VirtualDevice& device);
  /// Whether `device`'s copy was released (release_device) and not made again.
  bool released(const hardware::VirtualDevice& device) const;
  /// "" when `device`'s copy holds every view of `shards`, else which view
  /// it lacks (a reloaded gear table must fit the copies made at start). A
  /// released device lacks nothing: its next copy follows the table in force.
  std::string missing_on_device(const hardware::VirtualDevice& device, const std::vector<RankShard>& shards) const;
  /// Bytes of `device`'s copy; 0 without one.
  std::uint64_t device_bytes(const hardware::VirtualDevice* device) const;
  /// Bytes copied onto devices since the store was made: what a shift adds
  /// to it is what it copied (nothing: views of the copies).
  std::uint64_t copied_bytes() const;
  /// Whether any device holds a copy (device-memory mode).
  bool device_memory() const;

  /// The CPU backend's packed copies of the Q8_0 matrices and huge-page
  /// copies of the other quantized ones: made on the first call
  /// (thread-safe; the CPU backend calls it when it builds a stage), the
  /// same object afterwards. Null when nothing is copied: both are off
  /// (PackedWeights::wanted() and copies_wanted(), or release or
  /// device-memory mode), or the model has no quantized matrix.
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
  /// The mapped views of layer `layer` (what layer() rebases onto a copy).
  RankLayerView mapped_layer(int layer, int tp, int rank) const;
  struct DeviceCopy;
  /// `device`'s copy; null without one (an ftp::Error in device-memory mode).
  const DeviceCopy* copy_of(const hardware::VirtualDevice* device) const;
  /// `m` rebased onto `device`'s copy (unchanged without one); `what` names
  /// it in the error when the copy lacks it.
  MatView on_device(const MatView& m, const hardware::VirtualDevice* device, const char* what) const;
  const model::Model& m_;
  /// One layer's vectors as float32 (empty where the layer has none).
  struct LayerVecs {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  };
  std::map<const hardware::VirtualDevice*, std::unique_ptr<DeviceCopy>> copies_;
  std::atomic<std::uint64_t> copied_bytes_{0};
  std::vector<LayerVecs> vecs_;
  std::vector<float> output_norm_, rope_freqs_;
  std::uint64_t weight_bytes_ = 0, owned_bytes_ = 0;
  mutable std::mutex pack_mu_;
  mutable bool pack_tried_ = false;
  bool release_mode_ = false;
  mutable std::unique_ptr<PackedWeights> packed_;
};

}  // namespace ftp::engine
