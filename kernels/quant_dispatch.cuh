// SPDX-License-Identifier: Apache-2.0
// WeightDType -> the block decoders of quant_blocks.cuh (included by .cu
// files only).
#pragma once

#include <cstdint>
#include <type_traits>

#include "quant_blocks.cuh"
#include "weight_view.cuh"

namespace ftp::kernels::detail {

template <qb::QType Q>
using QTag = std::integral_constant<qb::QType, Q>;

/// Calls f(QTag<Q>{}) with the block type of d and returns true; false
/// (f not called) where d is not a block type (F32, F16, BF16, Q8_0).
template <class F>
bool visit_block_quant(WeightDType d, F&& f) {
  switch (d) {
    case WeightDType::q4_0: f(QTag<qb::QType::q4_0>{}); return true;
    case WeightDType::q4_1: f(QTag<qb::QType::q4_1>{}); return true;
    case WeightDType::q5_0: f(QTag<qb::QType::q5_0>{}); return true;
    case WeightDType::q5_1: f(QTag<qb::QType::q5_1>{}); return true;
    case WeightDType::q2_k: f(QTag<qb::QType::q2_k>{}); return true;
    case WeightDType::q3_k: f(QTag<qb::QType::q3_k>{}); return true;
    case WeightDType::q4_k: f(QTag<qb::QType::q4_k>{}); return true;
    case WeightDType::q5_k: f(QTag<qb::QType::q5_k>{}); return true;
    case WeightDType::q6_k: f(QTag<qb::QType::q6_k>{}); return true;
    case WeightDType::f32:
    case WeightDType::f16:
    case WeightDType::bf16:
    case WeightDType::q8_0: break;
  }
  return false;
}

/// Whether a view of a block type holds whole blocks (its start, width and
/// row length multiples of the block) with its data 16-byte aligned: what
/// the block kernels need (the CUDA backend's views always are; the loader
/// and WeightStore refuse rows and splits inside a block).
inline bool whole_blocks(const WeightView& w) {
  const int b = block_elems(w.dtype);
  return w.c0 % b == 0 && w.cols % b == 0 && w.ld % b == 0 && (reinterpret_cast<std::uintptr_t>(w.data) & 15) == 0;
}

/// Bytes of one tensor row of a view of block type Q, and the address of
/// the view's first block in row i (tensor row r0 + i).
template <qb::QType Q>
__host__ __device__ __forceinline__ const std::uint8_t* block_row(const WeightView& w, std::int64_t i) {
  using B = qb::Block<Q>;
  const std::int64_t row_bytes = w.ld / B::kElems * B::kBytes;
  return static_cast<const std::uint8_t*>(w.data) + (w.r0 + i) * row_bytes + w.c0 / B::kElems * B::kBytes;
}

}  // namespace ftp::kernels::detail
