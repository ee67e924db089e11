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

/// q . k over head_dim (q in shared memory, k in global or shared memory).
__device__ __forceinline__ float dot_head(const float* q, const float* k, int hd) {
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
