// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "weight_view.cuh"

namespace ftp::kernels {

/// Dequantises rows [row0, row0 + n_rows) of a weight view (Q8_0, or any
/// other weight dtype) into a dense row-major tile out[n_rows][w.cols] of f16
/// or bf16, for the cuBLAS GEMM of large batches. Q8_0 values d x q are
/// rounded once to the tile's type. Device pointers. Returns the launch
/// status; does not synchronise.
cudaError_t dequant_tile(const WeightView& w, std::int64_t row0, std::int64_t n_rows, void* out, HalfType to,
                         cudaStream_t stream);

}  // namespace ftp::kernels
