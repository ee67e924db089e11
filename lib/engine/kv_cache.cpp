// SPDX-License-Identifier: Apache-2.0
#include "engine/kv_cache.hpp"

#include "core/error.hpp"

namespace ftp::engine {

BlockAllocator::BlockAllocator(int n_blocks) : n_(n_blocks) {
  if (n_blocks < 1) throw InputError("KV cache: needs at least one block, got " + std::to_string(n_blocks));
  free_.reserve(static_cast<std::size_t>(n_blocks));
  // Pop from the back: hand out low block ids first.
  for (int b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  holders_.assign(static_cast<std::size_t>(n_blocks), 0);
}

int BlockAllocator::allocate() {
  std::lock_guard lk(mu_);
  if (free_.empty()) return -1;
  int b = free_.back();
  free_.pop_back();
  holders_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void BlockAllocator::share(int block) {
  std::lock_guard lk(mu_);
  if (block < 0 || block >= n_ || holders_[static_cast<std::size_t>(block)] == 0)
    throw Error("KV cache: share of block " + std::to_string(block) + ", which is not allocated");
  ++holders_[static_cast<std::size_t>(block)];
}

void BlockAllocator::free(int block) {
  std::lock_guard lk(mu_);
  if (block < 0 || block >= n_ || holders_[static_cast<std::size_t>(block)] == 0)
    throw Error("KV cache: free of block " + std::to_string(block) + ", which is not allocated");
  if (--holders_[static_cast<std::size_t>(block)] == 0) free_.push_back(block);
}

int BlockAllocator::free_blocks() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(free_.size());
}

KvStore::KvStore(int n_layers, int n_blocks, int block_tokens, int kv_heads, int head_dim)
    : nb_(n_blocks), bt_(block_tokens), kvh_(kv_heads), hd_(head_dim) {
  n_ = static_cast<std::size_t>(n_layers) * n_blocks * kv_heads * block_tokens * head_dim;
  k_.reset(new float[n_]);
  v_.reset(new float[n_]);
}

}  // namespace ftp::engine
