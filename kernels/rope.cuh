// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

namespace ftp::kernels {

/// Rotary embedding of each of n_heads heads of head_dim, for the first
/// n_rot dimensions, in t rows of `ld` floats (heads start at h x
/// head_dim): pair i turned by angle = pos[r] x theta^(-2i / n_rot) /
/// freq_factors[i] (freq_factors null: 1), the pairs (v[2i], v[2i+1]), or
/// (v[i], v[i + n_rot/2]) with `neox`, as engine::ops::rope. `pos` holds
/// each row's position; `pos` and `freq_factors` ([n_rot/2]) are device
/// memory. Returns the launch status; does not synchronise.
cudaError_t rope_f32(float* v, int ld, int t, int n_heads, int head_dim, int n_rot, const int* pos, float theta,
                     bool neox, const float* freq_factors, cudaStream_t stream);

}  // namespace ftp::kernels
