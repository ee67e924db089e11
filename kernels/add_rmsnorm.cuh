// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

namespace ftp::kernels {

/// Residual add and RMSNorm in one pass: for each of t rows of n floats,
/// x[r] += y[r], then out[r] = rmsnorm(x[r]) * w (kernels::add_f32 then
/// kernels::rmsnorm_f32, the same arithmetic, one launch instead of two).
/// Device pointers; out must not alias x or y. Returns the launch status;
/// does not synchronise.
cudaError_t add_rmsnorm_f32(float* x, const float* y, const float* w, float* out, int t, int n, float eps,
                            cudaStream_t stream);

}  // namespace ftp::kernels
