// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "kv_write.cuh"

namespace ftp::kernels {
namespace {

__global__ void kv_write_kernel(float* k_pages, float* v_pages, const float* __restrict__ k,
                                const float* __restrict__ v, int ld, int kv_heads, int head_dim, int block_tokens,
                                const int* __restrict__ slots) {
  detail::pdl_begin();
  const int r = blockIdx.x;
  const int s = slots[r], blk = s / block_tokens, slot = s % block_tokens;
  for (int e = threadIdx.x; e < kv_heads * head_dim; e += blockDim.x) {
    const int h = e / head_dim, d = e % head_dim;
    const std::int64_t dst =
        ((static_cast<std::int64_t>(blk) * kv_heads + h) * block_tokens + slot) * head_dim + d;
    k_pages[dst] = k[static_cast<std::int64_t>(r) * ld + e];
    v_pages[dst] = v[static_cast<std::int64_t>(r) * ld + e];
  }
}

}  // namespace

cudaError_t kv_write_f32(float* k_pages, float* v_pages, const float* k, const float* v, int ld, int t, int kv_heads,
                         int head_dim, int block_tokens, const int* slots, cudaStream_t stream) {
  if (t <= 0 || kv_heads <= 0 || head_dim <= 0) return cudaSuccess;
  if (block_tokens <= 0) return cudaErrorInvalidValue;
  const int work = kv_heads * head_dim;
  const int threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
  detail::launch(kv_write_kernel, t, threads, 0, stream, k_pages, v_pages, k, v, ld, kv_heads, head_dim, block_tokens, slots);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
