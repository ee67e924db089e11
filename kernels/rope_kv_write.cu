// SPDX-License-Identifier: Apache-2.0
#include <type_traits>

#include "kv_elem.cuh"
#include "rope_kv_write.cuh"

namespace ftp::kernels {
namespace {

template <class T>
__global__ void rope_kv_kernel(float* q, int nq, float* k, const float* __restrict__ v, int nkv, int hd, int n_rot,
                               const int* __restrict__ pos, float theta, bool neox,
                               const float* __restrict__ freq_factors, T* k_pages, T* v_pages, int block_tokens,
                               const int* __restrict__ slots) {
  detail::pdl_begin();
  const int r = blockIdx.x, pairs = n_rot / 2;
  const float p = static_cast<float>(pos[r]);
  const int s = slots[r], blk = s / block_tokens, slot = s % block_tokens;
  auto page = [&](int h, int d) {
    return ((static_cast<std::int64_t>(blk) * nkv + h) * block_tokens + slot) * hd + d;
  };
  float* qr = q + static_cast<std::int64_t>(r) * nq * hd;
  float* kr = k + static_cast<std::int64_t>(r) * nkv * hd;
  const float* vr = v + static_cast<std::int64_t>(r) * nkv * hd;
  for (int e = threadIdx.x; e < nq * pairs; e += blockDim.x) {
    float* x = qr + (e / pairs) * hd;
    const detail::RopePair rp = detail::rope_pair(p, e % pairs, n_rot, theta, neox, freq_factors);
    detail::rope_rotate(x, rp, &x[rp.d0], &x[rp.d1]);
  }
  for (int e = threadIdx.x; e < nkv * pairs; e += blockDim.x) {
    const int h = e / pairs;
    float* x = kr + h * hd;
    const detail::RopePair rp = detail::rope_pair(p, e % pairs, n_rot, theta, neox, freq_factors);
    float a, b;
    detail::rope_rotate(x, rp, &a, &b);
    x[rp.d0] = a, x[rp.d1] = b;
    k_pages[page(h, rp.d0)] = detail::kv_from_f32<T>(a);
    k_pages[page(h, rp.d1)] = detail::kv_from_f32<T>(b);
  }
  // Dimensions past the rotated pairs, and all of v.
  const int rest = hd - 2 * pairs;
  for (int e = threadIdx.x; e < nkv * rest; e += blockDim.x) {
    const int h = e / rest, d = 2 * pairs + e % rest;
    k_pages[page(h, d)] = detail::kv_from_f32<T>(kr[h * hd + d]);
  }
  for (int e = threadIdx.x; e < nkv * hd; e += blockDim.x) v_pages[page(e / hd, e % hd)] = detail::kv_from_f32<T>(vr[e]);
}

}  // namespace

cudaError_t rope_kv_write(float* q, int n_q_heads, float* k, const float* v, int kv_heads, int t, int head_dim, int n_rot,
                          const int* pos, float theta, bool neox, const float* freq_factors, void* k_pages, void* v_pages,
                          KvElem elem, int block_tokens, const int* slots, cudaStream_t stream) {
  if (t <= 0) return cudaSuccess;
  if (n_rot > head_dim || block_tokens <= 0 || head_dim <= 0) return cudaErrorInvalidValue;
  const int rot = n_rot < 0 ? 0 : n_rot;
  auto go = [&](auto* kp, auto* vp) {
    using T = std::remove_pointer_t<decltype(kp)>;
    detail::launch(rope_kv_kernel<T>, t, 256, 0, stream, q, n_q_heads, k, v, kv_heads, head_dim, rot, pos, theta, neox,
                   freq_factors, kp, vp, block_tokens, slots);
  };
  switch (elem) {
    case KvElem::f16: go(static_cast<__half*>(k_pages), static_cast<__half*>(v_pages)); break;
    case KvElem::bf16: go(static_cast<__nv_bfloat16*>(k_pages), static_cast<__nv_bfloat16*>(v_pages)); break;
    default: go(static_cast<float*>(k_pages), static_cast<float*>(v_pages)); break;
  }
  return cudaGetLastError();
}

cudaError_t rope_kv_write_f32(float* q, int n_q_heads, float* k, const float* v, int kv_heads, int t, int head_dim,
                              int n_rot, const int* pos, float theta, bool neox, const float* freq_factors,
                              float* k_pages, float* v_pages, int block_tokens, const int* slots, cudaStream_t stream) {
  return rope_kv_write(q, n_q_heads, k, v, kv_heads, t, head_dim, n_rot, pos, theta, neox, freq_factors, k_pages, v_pages,
                       KvElem::f32, block_tokens, slots, stream);
}

}  // namespace ftp::kernels
