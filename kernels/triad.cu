// SPDX-License-Identifier: Apache-2.0
#include "triad.cuh"

#include <algorithm>
#include <cstdint>

namespace ftp::kernels {
namespace {

// float4 body and a scalar tail; grid-stride so any n fits any grid.
__global__ void triad_kernel(float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                             float scalar, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b) |
                         reinterpret_cast<std::uintptr_t>(c)) & 15) == 0;
  std::size_t done = 0;
  if (aligned) {
    const std::size_t n4 = n / 4;
    auto* a4 = reinterpret_cast<float4*>(a);
    const auto* b4 = reinterpret_cast<const float4*>(b);
    const auto* c4 = reinterpret_cast<const float4*>(c);
    for (std::size_t i = tid; i < n4; i += stride) {
      float4 x = b4[i], y = c4[i];
      a4[i] = make_float4(x.x + scalar * y.x, x.y + scalar * y.y, x.z + scalar * y.z, x.w + scalar * y.w);
    }
    done = n4 * 4;
  }
  for (std::size_t i = done + tid; i < n; i += stride) a[i] = b[i] + scalar * c[i];
}

}  // namespace

cudaError_t triad_f32(float* a, const float* b, const float* c, float scalar, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int threads = 256;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  // A few waves of blocks per SM saturate memory; more only adds scheduling.
  const std::size_t needed = (n / 4 + threads - 1) / threads + 1;
  const int blocks = static_cast<int>(std::min<std::size_t>(needed, static_cast<std::size_t>(sms) * 8));
  triad_kernel<<<std::max(blocks, 1), threads, 0, stream>>>(a, b, c, scalar, n);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
