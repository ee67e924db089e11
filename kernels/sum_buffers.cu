// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "sum_buffers.cuh"

namespace ftp::kernels {
namespace {

struct Buffers {
  float* p[kMaxSumBuffers];
};

__global__ void sum_kernel(const __grid_constant__ Buffers b, int n_bufs, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float s = b.p[0][i];
    for (int j = 1; j < n_bufs; ++j) s += b.p[j][i];
    for (int j = 0; j < n_bufs; ++j) b.p[j][i] = s;
  }
}

}  // namespace

cudaError_t sum_buffers_f32(float* const* bufs, int n_bufs, std::size_t n, cudaStream_t stream) {
  if (n_bufs < 1 || n_bufs > kMaxSumBuffers) return cudaErrorInvalidValue;
  if (n == 0 || n_bufs == 1) return cudaSuccess;
  Buffers b{};
  for (int j = 0; j < n_bufs; ++j) b.p[j] = bufs[j];
  sum_kernel<<<detail::grid_for(n, 256, 65535), 256, 0, stream>>>(b, n_bufs, n);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
