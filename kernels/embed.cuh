// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include "weight_view.cuh"

namespace ftp::kernels {

/// Embedding gather: out[i][0..table.cols) = row tokens[i] of the table
/// view (rows r0 + tokens[i]), converted to float32, for i < t. `tokens`
/// and `out` are device pointers; ids are not checked here (the caller
/// validates them against the vocabulary). Q8_0 tables need c0 and ld to
/// be multiples of 32. Returns the launch status; does not synchronise.
cudaError_t embed_rows(const WeightView& table, const int* tokens, int t, float* out, cudaStream_t stream);

}  // namespace ftp::kernels
