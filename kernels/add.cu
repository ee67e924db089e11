// SPDX-License-Identifier: Apache-2.0
#include "add.cuh"
#include "common.cuh"

namespace ftp::kernels {
namespace {

__global__ void add_kernel(float* x, const float* __restrict__ y, std::size_t n) {
  detail::pdl_begin();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] += y[i];
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ b, std::size_t total, int n) {
  detail::pdl_begin();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    x[i] += b[i % static_cast<std::size_t>(n)];
}

}  // namespace

cudaError_t add_bias_f32(float* x, const float* b, int t, int n, cudaStream_t stream) {
  if (t <= 0 || n <= 0) return cudaSuccess;
  const std::size_t total = static_cast<std::size_t>(t) * static_cast<std::size_t>(n);
  detail::launch(add_bias_kernel, detail::grid_for(total, 256, 65535), 256, 0, stream, x, b, total, n);
  return cudaGetLastError();
}

cudaError_t add_f32(float* x, const float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  detail::launch(add_kernel, detail::grid_for(n, 256, 65535), 256, 0, stream, x, y, n);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
