// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "weight_view.cuh"

namespace ftp::kernels {

/// The activations as the CPU backend quantizes them before its products
/// with block-type weights (engine::ops::quantize_activations, llama.cpp's
/// quantize_row_q8_0 / q8_K), given back as floats q x d, bit for bit the
/// CPU's values: `kind` q8_0 -- blocks of 32, d = max|x| / 127 rounded to
/// f16, q = x x 127 / max|x| rounded to nearest even --, or q8_k -- blocks
/// of 256, d = -max / 127 with max the first element of largest magnitude,
/// q = min(127, x / d rounded to nearest even), d in float. t rows of k
/// floats (dense: row u at u x k) into out (the same shape; not x); blocks
/// start at each row's start, a row of k not a multiple of the block ends
/// with a shorter one. A warp per block; the element steps are
/// quant_blocks.cuh's, which tests/engine/test_quant_blocks.cpp checks on
/// the CPU. Optionally also the quants as int8 (`quants`: t rows of k) and
/// each block's scale d (`scales`: t rows of ceil(k / block); 0 for a Q8_K
/// block of zeros), what the integer-dot GEMV reads (matvec's Q8Acts).
/// Device pointers; does not synchronise. kind none: a copy of x.
cudaError_t quantize_activations_f32(const float* x, float* out, int t, int k, ActQuant kind, cudaStream_t stream,
                                     std::int8_t* quants = nullptr, float* scales = nullptr);

}  // namespace ftp::kernels
