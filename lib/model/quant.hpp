// SPDX-License-Identifier: Apache-2.0
#pragma once

// The block-quantized weight types of ggml that the loader accepts besides
// Q8_0: the legacy Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32 weights) and the
// K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (super-blocks of 256 weights).
// Layouts are ggml's (ggml-common.h, block_q4_0 ... block_q6_K); f16 fields
// are IEEE half, little-endian. Dequantization follows ggml's reference
// dequantize_row_* to the bit: the same float operations in the same order
// (every product in them is exact in float, so only the one add or
// subtraction rounds; quant.cpp turns contraction off all the same).
//
//   Q4_0  18 B: d f16 | qs[16]               w[j] = (lo4 - 8) d,    w[j+16] = (hi4 - 8) d
//   Q4_1  20 B: d, m f16 | qs[16]            w = q d + m
//   Q5_0  22 B: d f16 | qh u32 | qs[16]      w = (q | bit << 4) - 16) d; bit j of qh for w[j]
//   Q5_1  24 B: d, m f16 | qh u32 | qs[16]   w = (q | bit << 4) d + m
//   Q2_K  84 B: scales[16] | qs[64] | d, dmin f16
//             16 groups of 16; scale byte = sc (low 4) | min (high 4);
//             w = d sc q - dmin min, q 2 bits
//   Q3_K 110 B: hmask[32] | qs[64] | scales[12] | d f16
//             16 groups of 16; 6-bit signed scales (sc - 32); q 2 bits + high
//             bit, w = d (sc - 32) (q - (high ? 0 : 4))
//   Q4_K 144 B: d, dmin f16 | scales[12] | qs[128]
//             8 groups of 32; 6-bit scale and min per group packed in 12
//             bytes; w = d sc q - dmin min
//   Q5_K 176 B: d, dmin f16 | scales[12] | qh[32] | qs[128]; as Q4_K, q 5 bits
//   Q6_K 210 B: ql[128] | qh[64] | scales[16] int8 | d f16
//             16 groups of 16; w = d sc (q - 32), q 6 bits
//
// Everything here reads only the bytes of the blocks it is given, whatever
// they hold (a NaN or infinite scale gives NaN or infinite weights, as in
// ggml); the fuzz target tests/fuzz/fuzz_quant.cpp runs it on any bytes.

#include <cstddef>
#include <cstdint>

#include "model/model.hpp"

namespace ftp::model::quant {

/// Weights per block and bytes per block of a dtype (1 and the element size
/// for F32, F16 and BF16).
struct BlockShape {
  int elems = 1;
  int bytes = 4;
};
BlockShape block_shape(DType t) noexcept;

/// Whether t is one of the block-quantized types this file dequantizes
/// (Q8_0 included).
bool is_quantized(DType t) noexcept;

/// IEEE half (binary16) bits to float, exact for every value (subnormals,
/// infinities, NaN), as ggml's GGML_FP16_TO_FP32.
float f16_to_f32(std::uint16_t h) noexcept;

/// float to IEEE half bits, round to nearest even (as F16C's vcvtps2ph,
/// which ggml's x86 build uses for GGML_FP32_TO_FP16).
std::uint16_t f32_to_f16(float f) noexcept;

/// Dequantizes `blocks` consecutive blocks of type t starting at `src` into
/// blocks x block_shape(t).elems floats at `out`, bit-exact with ggml's
/// dequantize_row_<t>. t must be quantized (is_quantized).
void dequantize(DType t, const void* src, std::int64_t blocks, float* out);

}  // namespace ftp::model::quant
