// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "embed.cuh"

namespace ftp::kernels {
namespace {

__global__ void embed_kernel(WeightView w, const int* __restrict__ tokens, float* __restrict__ out) {
  detail::pdl_begin();
  const int i = blockIdx.x;
  const std::int64_t first = (w.r0 + tokens[i]) * w.ld + w.c0;
  float* o = out + static_cast<std::int64_t>(i) * w.cols;
  for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x) o[j] = detail::load_weight(w.data, w.dtype, first + j);
}

}  // namespace

cudaError_t embed_rows(const WeightView& table, const int* tokens, int t, float* out, cudaStream_t stream) {
  if (t <= 0 || table.cols <= 0) return cudaSuccess;
  if (table.dtype == WeightDType::q8_0 && (table.c0 % 32 != 0 || table.ld % 32 != 0)) return cudaErrorInvalidValue;
  detail::launch(embed_kernel, t, 256, 0, stream, table, tokens, out);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
