// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

namespace ftp::kernels {

/// RMSNorm of t rows of n floats: out[r][i] = w[i] * x[r][i] / sqrt(mean(x[r]^2) + eps)
/// (engine::ops::rmsnorm per row). Device pointers; out may equal x.
/// Returns the launch status; does not synchronise.
cudaError_t rmsnorm_f32(const float* x, const float* w, float* out, int t, int n, float eps, cudaStream_t stream);

}  // namespace ftp::kernels
