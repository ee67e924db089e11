// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include "weight_view.cuh"

namespace ftp::kernels {

/// Embedding gather: out[i][0..table.cols) = row tokens[i] - first_token
/// of the table view (rows r0 + tokens[i] - first_token), converted to
/// float32, for i < t; zeros where that row lies outside [0, table.rows)
/// (a vocabulary-parallel rank's rows: tokens of other ranks embed as
/// zeros). `tokens` and `out` are device pointers; ids are not checked
/// against the vocabulary here (the caller does). Q8_0 tables need c0 and
/// ld to be multiples of 32; tables of the block types (Q4_0 .. Q6_K:
/// weights bit for bit as ggml dequantizes them) views of whole blocks.
/// Returns the launch status; does not synchronise.
cudaError_t embed_rows(const WeightView& table, const int* tokens, int t, float* out, cudaStream_t stream,
                       int first_token = 0);

}  // namespace ftp::kernels
