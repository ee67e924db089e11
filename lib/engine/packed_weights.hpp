// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/model.hpp"

namespace ftp::engine {

/// One Q8_0 matrix repacked for the CPU backend's AVX-512 VNNI kernel
/// (ops::matmul_packed): rows in groups of kGroup, so that one 512-bit
/// vector holds 4 consecutive columns of 16 rows and one dpbusd does 64
/// multiply-adds for 16 outputs.
///
/// Group g (rows 16g .. 16g + 15; rows past the tensor's end are zero) lies
/// at data + g x group_stride:
///   scales: [blocks][16] f16, the Q8_0 scale of each row's block of 32;
///   quants, from quant_offset: [blocks][8][16][4] uint8: for block b,
///     column quad j (columns 32b + 4j .. + 3), row r, the 4 weights of
///     that row stored unsigned (w + 128, i.e. w ^ 0x80).
/// A block-aligned column range of the tensor is a contiguous range of
/// blocks in each group, so every MatView that starts on a block of 32
/// (every TP split of a model whose widths are multiples of 32) reads the
/// same packed copy, whatever its gear.
struct PackedQ8 {
  static constexpr int kGroup = 16;  ///< rows per group: the lanes of a zmm of int32
  std::int64_t rows = 0, cols = 0;   ///< of the tensor
  std::int64_t groups = 0;           ///< ceil(rows / 16)
  std::int64_t blocks = 0;           ///< cols / 32
  std::size_t quant_offset = 0;      ///< bytes from a group's start to its quants (64-aligned)
  std::size_t group_stride = 0;      ///< bytes per group (64-aligned)
  const std::uint8_t* data = nullptr;

  const std::uint16_t* scales(std::int64_t g) const noexcept {
    return reinterpret_cast<const std::uint16_t*>(data + static_cast<std::size_t>(g) * group_stride);
  }
  const std::uint8_t* quants(std::int64_t g) const noexcept {
    return data + static_cast<std::size_t>(g) * group_stride + quant_offset;
  }
};

/// The CPU backend's own copies of a WeightStore's matrices (the seven of
/// every layer and the classifier), made once per process by the store's
/// one-time preparation (WeightStore::packed_for_cpu) and then read by
/// every domain of every gear: like the CUDA backend's device weights, an
/// engine-internal copy in the backend's layout; MatView stays the view
/// type and still names the mapped tensor (the CUDA backend, the portable
/// kernels and release mode read that). Two kinds:
///
/// - Q8_0 matrices packed for the AVX-512 VNNI kernel (PackedQ8, find),
///   where wanted();
/// - the other block-quantized matrices (Q4_0 .. Q6_K) byte for byte, in
///   one anonymous region on transparent huge pages (copy_of), where
///   copies_wanted(). The kernels stream every matrix once per decode step,
///   and from the mapped file's 4 KiB pages a plain two-thread read of a
///   Q4_K_M step's matrices reached 0.71 of the STREAM triad where the same
///   read of a huge-page copy reached 1.03 (docs/benchmarks.md,
///   2026-12-06): the page walks, not the memory, bound the mapped file.
///   The kernels and their sums are the same, so are the outputs.
///
/// Copying goes tensor by tensor and gives each copied tensor's source
/// pages back to the system (madvise MADV_DONTNEED on the whole pages inside
/// its span, only where the weights are a file mapping: they come back from
/// the file on the next touch), so the copy does not double the resident
/// memory: the peak is the copies plus one tensor.
class PackedWeights {
 public:
  /// Packs the Q8_0 matrices of `m` whose width is a multiple of 32 (where
  /// wanted()) and copies its other block-quantized matrices (where
  /// copies_wanted()).
  explicit PackedWeights(const model::Model& m);
  ~PackedWeights();
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;

  /// The packed copy of tensor `t` (a view of the store's model), or null.
  const PackedQ8* find(const model::TensorView* t) const noexcept;
  /// The huge-page copy of tensor `t` (a view of the store's model): the
  /// same name, type, shape and bytes, its data in the copy; or null.
  const model::TensorView* copy_of(const model::TensorView* t) const noexcept;
  /// Bytes of the packed copies and the huge-page copies (allocated once,
  /// anonymous memory).
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Bytes of the mapped file advised away after packing or copying.
  std::uint64_t released_bytes() const noexcept { return released_; }
  /// Tensors packed (Q8_0) and copied (the other block types).
  std::size_t tensors() const noexcept { return packed_.size() + copies_.size(); }
  std::size_t copied_tensors() const noexcept { return copies_.size(); }

  /// Whether this process packs at all: the CPU has AVX-512 (F/BW/VL/VNNI),
  /// ops::matmul_kernels() is `best`, and FTP_Q8_PACK is not "0" (A/B runs
  /// of engine-bench). Read once per call.
  static bool wanted();
  /// Whether this process copies the other block-quantized matrices: the
  /// kernel offers transparent huge pages (not "[never]" in
  /// /sys/kernel/mm/transparent_hugepage/enabled) and FTP_HUGE_COPY is not
  /// "0" (A/B runs of engine-bench). Read once per call.
  static bool copies_wanted();

  /// Packs one Q8_0 tensor (cols % 32 == 0) into `out` (at least
  /// packed_size(t) bytes, 64-aligned); fills `p` (p.data = out). For tests.
  static std::size_t packed_size(const model::TensorView& t);
  static void pack(const model::TensorView& t, std::uint8_t* out, PackedQ8& p);

 private:
  struct Region {
    void* addr = nullptr;
    std::size_t len = 0;
  };
  /// Gives the whole pages inside t's span of the mapped file back.
  void release_source(const model::Model& m, const model::TensorView& t);
  void copy_quantized(const model::Model& m, const std::vector<const model::TensorView*>& todo);

  std::unordered_map<const model::TensorView*, PackedQ8> packed_;
  std::unordered_map<const model::TensorView*, model::TensorView> copies_;
  std::vector<Region> regions_;
  std::uint64_t bytes_ = 0, released_ = 0;
};

}  // namespace ftp::engine
