// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include "attention_args.cuh"

namespace ftp::kernels {

/// KV-cache write of one layer: row r's K and V (kv_heads x head_dim floats
/// each, rows of `ld` floats) go to slot slots[r] of the paged cache, whose
/// layout is engine::KvStore's: pages [block][kv_head][slot][head_dim], so
/// physical slot s = block x block_tokens + position-in-block lands at
/// ((block x kv_heads + h) x block_tokens + slot) x head_dim. `k_pages` and
/// `v_pages` point at this layer's pages. Device pointers. Returns the
/// launch status; does not synchronise.
/// The same for pages of any KvElem: each value rounded to nearest even
/// into f16 or bf16, or copied (f32).
cudaError_t kv_write(void* k_pages, void* v_pages, KvElem elem, const float* k, const float* v, int ld, int t,
                     int kv_heads, int head_dim, int block_tokens, const int* slots, cudaStream_t stream);
/// kv_write on float32 pages.
cudaError_t kv_write_f32(float* k_pages, float* v_pages, const float* k, const float* v, int ld, int t, int kv_heads,
                         int head_dim, int block_tokens, const int* slots, cudaStream_t stream);

}  // namespace ftp::kernels
