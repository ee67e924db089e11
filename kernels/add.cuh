// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace ftp::kernels {

/// Residual add: x[i] += y[i] for i < n, device pointers. Returns the launch
/// status; does not synchronise.
cudaError_t add_f32(float* x, const float* y, std::size_t n, cudaStream_t stream);

/// Bias add: x[r][i] += b[i] for t rows of n floats, device pointers (the
/// q/k/v biases of qwen2). Returns the launch status; does not synchronise.
cudaError_t add_bias_f32(float* x, const float* b, int t, int n, cudaStream_t stream);

}  // namespace ftp::kernels
