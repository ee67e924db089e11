// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "weight_view.cuh"

namespace ftp::kernels {

/// Dequantises rows [row0, row0 + n_rows) of a weight view (Q8_0, the
/// block types Q4_0 .. Q6_K, or any other weight dtype) into a dense
/// row-major tile out[n_rows][w.cols] of f16 or bf16, for the cuBLAS GEMM of
/// large batches. Each weight as ggml dequantizes it (Q8_0: d x q; the
/// block types: quant_blocks.cuh, bit-exact with model::quant::dequantize)
/// is rounded once to the tile's type. Views of the block types hold whole
/// blocks (cudaErrorInvalidValue otherwise). Device pointers. Returns the
/// launch status; does not synchronise.
cudaError_t dequant_tile(const WeightView& w, std::int64_t row0, std::int64_t n_rows, void* out, HalfType to,
                         cudaStream_t stream);

}  // namespace ftp::kernels
