// SPDX-License-Identifier: Apache-2.0
#include "kv_elem.cuh"
#include "kv_write.cuh"

namespace ftp::kernels {
namespace {

template <class T>
__global__ void kv_write_kernel(T* k_pages, T* v_pages, const float* __restrict__ k,
                                const float* __restrict__ v, int ld, int kv_heads, int head_dim, int block_tokens,
                                const int* __restrict__ slots) {
  detail::pdl_begin();
  const int r = blockIdx.x;
  const int s = slots[r], blk = s / block_tokens, slot = s % block_tokens;
  for (int e = threadIdx.x; e < kv_heads * head_dim; e += blockDim.x) {
    const int h = e / head_dim, d = e % head_dim;
    const std::int64_t dst =
        ((static_cast<std::int64_t>(blk) * kv_heads + h) * block_tokens + slot) * head_dim + d;
    k_pages[dst] = detail::kv_from_f32<T>(k[static_cast<std::int64_t>(r) * ld + e]);
    v_pages[dst] = detail::kv_from_f32<T>(v[static_cast<std::int64_t>(r) * ld + e]);
  }
}

template <class T>
void launch_kv_write(void* k_pages, void* v_pages, const float* k, const float* v, int ld, int t, int kv_heads,
                     int head_dim, int block_tokens, const int* slots, cudaStream_t stream) {
  const int work = kv_heads * head_dim;
  const int threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
  detail::launch(kv_write_kernel<T>, t, threads, 0, stream, static_cast<T*>(k_pages), static_cast<T*>(v_pages), k, v, ld,
                 kv_heads, head_dim, block_tokens, slots);
}

}  // namespace

cudaError_t kv_write(void* k_pages, void* v_pages, KvElem elem, const float* k, const float* v, int ld, int t,
                     int kv_heads, int head_dim, int block_tokens, const int* slots, cudaStream_t stream) {
  if (t <= 0 || kv_heads <= 0 || head_dim <= 0) return cudaSuccess;
  if (block_tokens <= 0) return cudaErrorInvalidValue;
  switch (elem) {
    case KvElem::f16:
      launch_kv_write<__half>(k_pages, v_pages, k, v, ld, t, kv_heads, head_dim, block_tokens, slots, stream);
      break;
    case KvElem::bf16:
      launch_kv_write<__nv_bfloat16>(k_pages, v_pages, k, v, ld, t, kv_heads, head_dim, block_tokens, slots, stream);
      break;
    default: launch_kv_write<float>(k_pages, v_pages, k, v, ld, t, kv_heads, head_dim, block_tokens, slots, stream);
  }
  return cudaGetLastError();
}

cudaError_t kv_write_f32(float* k_pages, float* v_pages, const float* k, const float* v, int ld, int t, int kv_heads,
                         int head_dim, int block_tokens, const int* slots, cudaStream_t stream) {
  return kv_write(k_pages, v_pages, KvElem::f32, k, v, ld, t, kv_heads, head_dim, block_tokens, slots, stream);
}

}  // namespace ftp::kernels
