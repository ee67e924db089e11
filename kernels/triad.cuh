// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace ftp::kernels {

/// a[i] = b[i] + scalar * c[i] for i < n, device pointers, on `stream`.
/// Returns the launch status (cudaSuccess or the launch error); does not
/// synchronise. Memory-bound: used by ftp-probe to measure device bandwidth.
cudaError_t triad_f32(float* a, const float* b, const float* c, float scalar, std::size_t n, cudaStream_t stream);

}  // namespace ftp::kernels
