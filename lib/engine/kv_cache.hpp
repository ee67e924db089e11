// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ftp::engine {

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
  int free_blocks() const;
  int total_blocks() const noexcept { return n_; }

 private:
  int n_;
  mutable std::mutex mu_;
  std::vector<int> free_;
  std::vector<int> holders_;  // per block; 0: free
};

/// The KV storage of one rank of one pipeline stage: for each of the
/// stage's layers, K and V pages [block][kv_head] of slot x head_dim floats
/// each: the CPU backend keeps K transposed in its page, [head_dim][slot],
/// and V as [slot][head_dim] (ops::attention_head).
class KvStore {
 public:
  KvStore(int n_layers, int n_blocks, int block_tokens, int kv_heads, int head_dim);

  float* k(int layer, int block, int head) noexcept { return at(k_, layer, block, head); }
  float* v(int layer, int block, int head) noexcept { return at(v_, layer, block, head); }
  int block_tokens() const noexcept { return bt_; }
  std::uint64_t bytes() const noexcept { return 2 * n_ * sizeof(float); }

 private:
  float* at(std::unique_ptr<float[]>& s, int layer, int block, int head) noexcept {
    return s.get() + ((static_cast<std::size_t>(layer) * nb_ + static_cast<std::size_t>(block)) * kvh_ +
                       static_cast<std::size_t>(head)) * static_cast<std::size_t>(bt_) * hd_;
  }
  int nb_, bt_, kvh_, hd_;
  // Not zeroed: a position is always written before it is read, and the
  // pages are committed as they are first used, not when a domain is built.
  std::size_t n_ = 0;
  std::unique_ptr<float[]> k_, v_;
};

}  // namespace ftp::engine
