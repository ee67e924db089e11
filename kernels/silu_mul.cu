// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "silu_mul.cuh"

namespace ftp::kernels {
namespace {

__global__ void silu_mul_kernel(float* g, const float* __restrict__ u, std::size_t n) {
  detail::pdl_begin();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = g[i];
    g[i] = x / (1.0f + expf(-x)) * u[i];
  }
}

}  // namespace

cudaError_t silu_mul_f32(float* g, const float* u, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  detail::launch(silu_mul_kernel, detail::grid_for(n, 256, 65535), 256, 0, stream, g, u, n);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
