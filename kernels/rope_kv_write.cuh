// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include "attention_args.cuh"

namespace ftp::kernels {

/// RoPE of q and k and the KV-cache write of k and v, in one launch
/// (kernels::rope_f32 on q, rope_f32 on k, then kv_write_f32: the same
/// arithmetic). For each of t rows: q (rows of n_q_heads x head_dim) and k
/// (rows of kv_heads x head_dim) are rotated in place on the pairs of their
/// first n_rot dimensions at position pos[r] (adjacent, or halves with
/// `neox`; frequencies divided by freq_factors[n_rot/2] unless it is null:
/// kernels::rope_f32); the rotated k row and
/// the v row (rows of kv_heads x head_dim) are written to slot slots[r] of
/// this layer's pages [block][kv_head][slot][head_dim]. Device pointers.
/// Returns the launch status; does not synchronise.
/// The same for pages of any KvElem (values rounded to nearest even into
/// f16 / bf16; q and k in place stay float32).
cudaError_t rope_kv_write(float* q, int n_q_heads, float* k, const float* v, int kv_heads, int t, int head_dim, int n_rot,
                          const int* pos, float theta, bool neox, const float* freq_factors, void* k_pages, void* v_pages,
                          KvElem elem, int block_tokens, const int* slots, cudaStream_t stream);
/// rope_kv_write on float32 pages.
cudaError_t rope_kv_write_f32(float* q, int n_q_heads, float* k, const float* v, int kv_heads, int t, int head_dim,
                              int n_rot, const int* pos, float theta, bool neox, const float* freq_factors,
                              float* k_pages, float* v_pages, int block_tokens, const int* slots, cudaStream_t stream);

}  // namespace ftp::kernels
