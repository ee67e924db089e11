// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "rmsnorm.cuh"

namespace ftp::kernels {
namespace {

__global__ void __launch_bounds__(1024) rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* out, int n, float eps) {
  detail::pdl_begin();
  __shared__ float red[32];
  const float* xr = x + static_cast<std::int64_t>(blockIdx.x) * n;
  float* orow = out + static_cast<std::int64_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = detail::block_sum(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w[i] * (scale * xr[i]);
}

}  // namespace

cudaError_t rmsnorm_f32(const float* x, const float* w, float* out, int t, int n, float eps, cudaStream_t stream) {
  if (t <= 0 || n <= 0) return cudaSuccess;
  const int threads = n >= 1024 ? 1024 : (n + 31) / 32 * 32;
  detail::launch(rmsnorm_kernel, t, threads, 0, stream, x, w, out, n, eps);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
