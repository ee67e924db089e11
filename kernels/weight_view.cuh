// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

namespace ftp::kernels {

/// Element types of weights in device memory, as stored in the model file.
/// Q8_0: blocks of 32 elements, 34 bytes each (f16 scale d, then 32 int8 q;
/// value = d x q). Q4_0 .. Q6_K: ggml's other block types
/// (kernels/quant_blocks.cuh decodes them), whose views hold whole blocks.
enum class WeightDType : int {
  f32 = 0,
  f16 = 1,
  bf16 = 2,
  q8_0 = 3,
  q4_0 = 4,
  q4_1 = 5,
  q5_0 = 6,
  q5_1 = 7,
  q2_k = 8,
  q3_k = 9,
  q4_k = 10,
  q5_k = 11,
  q6_k = 12,
};

/// Whether d is one of the block types of quant_blocks.cuh (Q4_0 .. Q6_K;
/// not Q8_0, which has its own paths).
constexpr bool is_block_quant(WeightDType d) { return static_cast<int>(d) >= static_cast<int>(WeightDType::q4_0); }

/// Weights per block of a block type: 32 for Q8_0 and the legacy types,
/// 256 for the K-quants; 1 for F32, F16, BF16.
constexpr int block_elems(WeightDType d) {
  return d == WeightDType::q8_0 || (is_block_quant(d) && static_cast<int>(d) <= static_cast<int>(WeightDType::q5_1))
             ? 32
             : is_block_quant(d) ? 256 : 1;
}

/// How the activations are quantized before a product with weights of a
/// type, as the CPU backend (engine::ops::quantize_activations) and
/// llama.cpp do: Q8_0 values in blocks of 32 for the legacy types, Q8_K in
/// blocks of 256 for the K-quants; none for F32, F16, BF16 and Q8_0 (float
/// activations, as the CPU's reference path).
enum class ActQuant : int { none = 0, q8_0 = 1, q8_k = 2 };
constexpr ActQuant act_quant_of(WeightDType d) {
  return !is_block_quant(d) ? ActQuant::none : block_elems(d) == 32 ? ActQuant::q8_0 : ActQuant::q8_k;
}

/// A sub-matrix of a row-major weight tensor in device memory, in its
/// stored dtype (the device twin of engine::MatView): element (i, j) of the
/// view is element (r0 + i) * ld + c0 + j of the tensor, where ld is the
/// tensor's row length in elements. Row-parallel views of tensor-parallel
/// ranks are column ranges (c0 > 0, cols < ld); nothing is copied.
struct WeightView {
  const void* data = nullptr;  ///< device pointer to the whole tensor
  WeightDType dtype = WeightDType::f32;
  std::int64_t ld = 0;         ///< elements per row of the tensor
  std::int64_t r0 = 0, rows = 0;
  std::int64_t c0 = 0, cols = 0;
};

/// Element types of dense activation or dequantised tiles (cuBLAS inputs).
enum class HalfType : int { f16 = 0, bf16 = 1 };

}  // namespace ftp::kernels
