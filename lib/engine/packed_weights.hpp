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

/// The CPU backend's packed copies of a WeightStore's Q8_0 matrices (the
/// seven of every layer and the classifier), made once per process by the
/// store's one-time preparation (WeightStore::packed_for_cpu) and then read
/// by every domain of every gear: like the CUDA backend's device weights,
/// an engine-internal copy in the backend's layout; MatView stays the view
/// type and still names the mapped tensor (the CUDA backend, the portable
/// kernels and release mode read that).
///
/// Packing goes tensor by tensor and gives each packed tensor's source
/// pages back to the system (madvise MADV_DONTNEED on the whole pages inside
/// its span, only where the weights are a file mapping: they come back from
/// the file on the next touch), so the copy does not double the resident
/// memory: the peak is the packed copy plus one tensor.
class PackedWeights {
 public:
  /// Packs the Q8_0 matrices of `m` whose width is a multiple of 32.
  explicit PackedWeights(const model::Model& m);
  ~PackedWeights();
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;

  /// The packed copy of tensor `t` (a view of the store's model), or null.
  const PackedQ8* find(const model::TensorView* t) const noexcept;
  /// Bytes of the packed copies (allocated once, anonymous memory).
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// Bytes of the mapped file advised away after packing.
  std::uint64_t released_bytes() const noexcept { return released_; }
  std::size_t tensors() const noexcept { return packed_.size(); }

  /// Whether this process packs at all: the CPU has AVX-512 (F/BW/VL/VNNI),
  /// ops::matmul_kernels() is `best`, and FTP_Q8_PACK is not "0" (A/B runs
  /// of engine-bench). Read once per call.
  static bool wanted();

  /// Packs one Q8_0 tensor (cols % 32 == 0) into `out` (at least
  /// packed_size(t) bytes, 64-aligned); fills `p` (p.data = out). For tests.
  static std::size_t packed_size(const model::TensorView& t);
  static void pack(const model::TensorView& t, std::uint8_t* out, PackedQ8& p);

 private:
  struct Region {
    void* addr = nullptr;
    std::size_t len = 0;
  };
  std::unordered_map<const model::TensorView*, PackedQ8> packed_;
  std::vector<Region> regions_;
  std::uint64_t bytes_ = 0, released_ = 0;
};

}  // namespace ftp::engine
