// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include "attention_args.cuh"

namespace ftp::kernels {

/// Tiled FlashAttention-style attention for prefill chunks: one block per
/// (tile of 16 consecutive query rows, query head). For each run of rows of
/// one sequence in the tile, K and V tiles of 32 positions are staged in
/// shared memory once and used by all those rows (causal: row r uses
/// positions <= row_pos[r]), with an online softmax per row; scores never
/// reach global memory. Rows of a chunk must be consecutive (as the
/// executor lays out a micro-batch). Returns the launch status
/// (cudaErrorInvalidValue for head_dim > kMaxHeadDim); does not synchronise.
cudaError_t attention_prefill(const AttentionArgs& a, cudaStream_t stream);

}  // namespace ftp::kernels
