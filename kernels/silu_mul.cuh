// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace ftp::kernels {

/// g[i] = silu(g[i]) x u[i] = g[i] / (1 + exp(-g[i])) x u[i] for i < n, device
/// pointers. Returns the launch status; does not synchronise.
cudaError_t silu_mul_f32(float* g, const float* u, std::size_t n, cudaStream_t stream);

}  // namespace ftp::kernels
