// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "convert.cuh"

namespace ftp::kernels {
namespace {

template <class H>
__global__ void convert_kernel(const float* __restrict__ in, H* __restrict__ out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = detail::to_half<H>(in[i]);
}

}  // namespace

cudaError_t convert_f32(const float* in, void* out, HalfType to, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = detail::grid_for(n, 256, 65535);
  if (to == HalfType::f16) convert_kernel<<<grid, 256, 0, stream>>>(in, static_cast<__half*>(out), n);
  else convert_kernel<<<grid, 256, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
