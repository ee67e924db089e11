// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

namespace ftp::kernels {

/// Temperature and top-p (nucleus) sampling of t rows of n logits (rows of
/// ld floats), one token per row into out[r], with the semantics of
/// engine::Sampler (top_k off) given its uniform draw: probabilities
/// p_i = exp((l_i - max) / temperature); the nucleus is the smallest set of
/// the most probable tokens whose mass reaches top_p of the total (all of
/// them when top_p >= 1); the token is the first, in decreasing probability,
/// at which the nucleus's cumulative mass exceeds uniform x its mass.
/// temperature <= 0 is greedy (argmax, lowest index on ties).
/// temperature, top_p and uniform (in [0, 1)) are per row, in device memory,
/// so a captured graph replays with new values. No sort: the nucleus
/// threshold and the chosen probability are found by bisection over the
/// bit patterns of the probabilities (monotone for positive floats), with
/// block-wide double-precision sums; among exactly equal probabilities the
/// lowest index is taken. Returns the launch status; does not synchronise.
cudaError_t sample_top_p(const float* logits, int ld, int t, int n, const float* temperature, const float* top_p,
                         const float* uniform, int* out, cudaStream_t stream);

}  // namespace ftp::kernels
