// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace ftp::kernels {

/// The element type of the KV pages (engine::KvDtype once resolved).
enum class KvElem : int { f32, f16, bf16 };

/// Bytes of one KV element.
constexpr int kv_elem_bytes(KvElem e) { return e == KvElem::f32 ? 4 : 2; }

/// Most head_dim the attention kernels take.
constexpr int kMaxHeadDim = 256;

/// The arguments of the attention kernels (decode and prefill): causal
/// attention of t query rows over the paged KV cache of one layer, as the
/// CPU executor computes it. All pointers are device memory.
///
/// Row r belongs to sequence row_seq[r] and sits at position row_pos[r];
/// it attends to positions 0..row_pos[r] of its sequence, whose pages are
/// block_tables[row_seq[r] x bt_ld + p / block_tokens]. Pages are laid out
/// as engine::KvStore's: [block][kv_head][slot][head_dim] (k_pages and
/// v_pages point at this layer's, elements of kv_elem). Query head h (0 <= h < n_q_heads) of this
/// rank is model head q_head0 + h; it reads KV head (q_head0 + h) / group -
/// kv_head0 of the pages (grouped-query attention; kv_head0 is the first
/// KV head this tensor-parallel rank holds).
struct AttentionArgs {
  const float* q = nullptr;  ///< [t][q_ld], head h at h x head_dim
  int q_ld = 0;
  float* out = nullptr;      ///< [t][out_ld], head h at h x head_dim
  int out_ld = 0;
  const void* k_pages = nullptr;     ///< elements of kv_elem
  const void* v_pages = nullptr;
  KvElem kv_elem = KvElem::f32;
  const int* block_tables = nullptr;  ///< [n_seq][bt_ld]
  int bt_ld = 0;
  const int* row_seq = nullptr;       ///< [t]
  const int* row_pos = nullptr;       ///< [t]
  int t = 0;
  int n_q_heads = 0;
  int q_head0 = 0;
  int group = 1;          ///< n_head / n_head_kv of the model
  int kv_head0 = 0;
  int kv_heads = 0;       ///< KV heads in the pages
  int head_dim = 0;       ///< <= kMaxHeadDim
  int block_tokens = 0;
  float scale = 1.0f;     ///< 1 / sqrt(head_dim)
};

}  // namespace ftp::kernels
