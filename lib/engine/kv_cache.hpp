// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "model/model.hpp"

namespace ftp::engine {

/// The element type of the KV pages. `automatic` is 16 bits in the model's
/// compute type: BF16 where the model's matrices are BF16, F16 otherwise
/// (F32, F16 and block-quantized models; as llama.cpp's default F16 cache).
/// F32 is the option that doubles the pages' bytes for the last bits.
enum class KvDtype { automatic, f16, bf16, f32 };

/// "auto" | "f16" | "bf16" | "f32" (the --kv-cache-dtype values).
std::string_view to_string(KvDtype t) noexcept;
/// The inverse of to_string; an InputError naming `what` and the value otherwise.
KvDtype kv_dtype_from_string(std::string_view s, std::string_view what = "KV cache dtype");

/// Bytes of one K or V element: 4 for f32, 2 for the others (`automatic`
/// is always 16 bits, so sizing needs no model).
std::size_t kv_element_bytes(KvDtype t) noexcept;

/// `t` with `automatic` resolved for a model whose matrices are `weights`.
KvDtype resolve_kv_dtype(KvDtype t, model::DType weights) noexcept;

/// float to BF16 bits, round to nearest even (NaN stays NaN).
std::uint16_t f32_to_bf16(float f) noexcept;
/// BF16 bits to float, exact.
inline float bf16_to_f32(std::uint16_t b) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

/// Hands out KV-cache blocks (pages of `block_tokens` positions) of one
/// domain. One allocator serves every rank and stage of the domain: a
/// sequence's block table indexes the same blocks in each rank's storage.
class BlockAllocator {
 public:
  explicit BlockAllocator(int n_blocks);
  /// A free block, or -1 when none is left. It has one holder.
  int allocate();
  /// One more holder of an allocated block: sequences that share a prompt's
  /// full pages (GenerationRequest::n) each hold them.
  void share(int block);
  /// One holder less; the block is free when none is left.
  void free(int block);
  /// Up to `n` free blocks appended to `out`, each as allocate() gives it,
  /// under one lock (a prefill takes dozens of pages at once); returns how
  /// many (fewer than `n`: none is left).
  int allocate(int n, std::vector<int>& out);
  /// free() of each of `blocks` in order, under one lock.
  void free(const std::vector<int>& blocks);
  int free_blocks() const;
  int total_blocks() const noexcept { return n_; }

 private:
  void free_locked(int block);  // free() under mu_
  int take_locked();            // allocate() under mu_
  int n_;
  mutable std::mutex mu_;
  std::vector<int> free_;
  std::vector<int> holders_;  // per block; 0: free
};

/// The KV storage of one rank of one pipeline stage: for each of the
/// stage's layers, K and V pages [block][kv_head] of slot x head_dim
/// elements of dtype() each: the CPU backend keeps K transposed in its
/// page, [head_dim][slot], and V as [slot][head_dim] (ops::attention_head).
/// k() and v() point at a page's first element (float for f32, the 16-bit
/// pattern for f16 and bf16).
class KvStore {
 public:
  /// `dtype` resolved (not `automatic`).
  KvStore(int n_layers, int n_blocks, int block_tokens, int kv_heads, int head_dim, KvDtype dtype = KvDtype::f32);

  void* k(int layer, int block, int head) noexcept { return at(k_.get(), layer, block, head); }
  void* v(int layer, int block, int head) noexcept { return at(v_.get(), layer, block, head); }
  KvDtype dtype() const noexcept { return dtype_; }
  int block_tokens() const noexcept { return bt_; }
  std::uint64_t bytes() const noexcept { return 2 * n_ * es_; }

 private:
  void* at(std::byte* s, int layer, int block, int head) noexcept {
    return s + ((static_cast<std::size_t>(layer) * nb_ + static_cast<std::size_t>(block)) * kvh_ +
                static_cast<std::size_t>(head)) * static_cast<std::size_t>(bt_) * hd_ * es_;
  }
  int nb_, bt_, kvh_, hd_;
  KvDtype dtype_;
  std::size_t es_;
  // Not zeroed: a position is always written before it is read, and the
  // pages are committed as they are first used, not when a domain is built.
  std::size_t n_ = 0;  // elements of K (and of V)
  std::unique_ptr<std::byte[]> k_, v_;
};

}  // namespace ftp::engine
