// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "dequant.cuh"

namespace ftp::kernels {
namespace {

template <class H>
__global__ void dequant_kernel(WeightView w, std::int64_t row0, H* __restrict__ out) {
  const std::int64_t i = blockIdx.x;  // row of the tile
  const std::int64_t first = (w.r0 + row0 + i) * w.ld + w.c0;
  H* o = out + i * w.cols;
  for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x)
    o[j] = detail::to_half<H>(detail::load_weight(w.data, w.dtype, first + j));
}

}  // namespace

cudaError_t dequant_tile(const WeightView& w, std::int64_t row0, std::int64_t n_rows, void* out, HalfType to,
                         cudaStream_t stream) {
  if (n_rows <= 0 || w.cols <= 0) return cudaSuccess;
  if (n_rows > 0x7fffffff || row0 < 0 || row0 + n_rows > w.rows) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(n_rows);
  if (to == HalfType::f16) dequant_kernel<<<grid, 256, 0, stream>>>(w, row0, static_cast<__half*>(out));
  else dequant_kernel<<<grid, 256, 0, stream>>>(w, row0, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace ftp::kernels
