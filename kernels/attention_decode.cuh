// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include "attention_args.cuh"

namespace ftp::kernels {

/// Paged attention for decode: one block per (row, query head), its warps
/// splitting the row's positions 0..pos in tiles of 32 (a lane per
/// position), an online softmax per warp, the warps' partial results
/// merged at the end. Any rows (each attends to its own positions), but
/// meant for one query row per sequence; see attention_prefill for chunks.
/// Returns the launch status (cudaErrorInvalidValue for head_dim >
/// kMaxHeadDim); does not synchronise.
cudaError_t attention_decode(const AttentionArgs& a, cudaStream_t stream);

}  // namespace ftp::kernels
