// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "embed.cuh"

namespace ftp::kernels {
namespace {

__global__ void embed_kernel(WeightView w, const int* __restrict__ tokens, float* __restrict__ out, int first_token) {
  detail::pdl_begin();
  const int i = blockIdx.x;
  const std::int64_t local = static_cast<std::int64_t>(tokens[i]) - first_token;
  float* o = out + static_cast<std::int64_t>(i) * w.cols;
  if (local < 0 || local >= w.rows) {
    for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x) o[j] = 0.0f;
    return;
  }
  const std::int64_t first = (w.r0 + local) * w.ld + w.c0;
  for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x) o[j] = detail::load_weight(w.data, w.dtype, first + j);
}

}  // namespace

cudaError_t embed_rows(const WeightView& table, const int* tokens, int t, float* out, cudaStream_t stream,
                       int first_token) {
  if (t <= 0 || table.cols <= 0) return cudaSuccess;
  if (table.dtype == WeightDType::q8_0 && (table.c0 % 32 != 0 || table.ld % 32 != 0)) return cudaErrorInvalidValue;
  detail::launch(embed_kernel, t, 256, 0, stream, table, tokens, out, first_token);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
