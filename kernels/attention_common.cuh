// SPDX-License-Identifier: Apache-2.0
// Device helpers of the attention kernels (included by their .cu files only).
#pragma once

#include <cstdint>

#include "attention_args.cuh"
#include "common.cuh"

namespace ftp::kernels::detail {

/// Element offset of position p's head-`kvj` row in a layer's pages.
__device__ __forceinline__ std::int64_t kv_offset(const AttentionArgs& a, const int* table, int p, int kvj) {
  const int page = table[p / a.block_tokens], slot = p % a.block_tokens;
  return ((static_cast<std::int64_t>(page) * a.kv_heads + kvj) * a.block_tokens + slot) * a.head_dim;
}

/// One KV element as float (exact).
__device__ __forceinline__ float kv_f32(float x) { return x; }
__device__ __forceinline__ float kv_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float kv_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

/// Element i of pages of type e, as float.
__device__ __forceinline__ float kv_load(const void* pages, KvElem e, std::int64_t i) {
  switch (e) {
    case KvElem::f16: return kv_f32(static_cast<const __half*>(pages)[i]);
    case KvElem::bf16: return kv_f32(static_cast<const __nv_bfloat16*>(pages)[i]);
    default: return static_cast<const float*>(pages)[i];
  }
}

/// q . k over head_dim for 16-bit pages (q in shared memory).
template <class T>
__device__ __forceinline__ float dot_head(const float* q, const T* k, int hd) {
  float s = 0.0f;
  for (int d = 0; d < hd; ++d) s = fmaf(q[d], kv_f32(k[d]), s);
  return s;
}

/// q . k over head_dim (q in shared memory, k in global or shared memory).
template <>
__device__ __forceinline__ float dot_head<float>(const float* q, const float* k, int hd) {
  float s = 0.0f;
  if ((hd & 3) == 0 && (reinterpret_cast<std::uintptr_t>(k) & 15) == 0) {
    for (int d = 0; d < hd; d += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(k + d);
      s = fmaf(q[d], kv.x, s);
      s = fmaf(q[d + 1], kv.y, s);
      s = fmaf(q[d + 2], kv.z, s);
      s = fmaf(q[d + 3], kv.w, s);
    }
  } else {
    for (int d = 0; d < hd; ++d) s = fmaf(q[d], k[d], s);
  }
  return s;
}

}  // namespace ftp::kernels::detail
