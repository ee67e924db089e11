// SPDX-License-Identifier: Apache-2.0
#include "engine/kv_cache.hpp"

#include <cstring>
#include <string>

#include "core/error.hpp"

namespace ftp::engine {

std::string_view to_string(KvDtype t) noexcept {
  switch (t) {
    case KvDtype::automatic: return "auto";
    case KvDtype::f16: return "f16";
    case KvDtype::bf16: return "bf16";
    case KvDtype::f32: return "f32";
  }
  return "auto";
}

KvDtype kv_dtype_from_string(std::string_view s, std::string_view what) {
  for (KvDtype t : {KvDtype::automatic, KvDtype::f16, KvDtype::bf16, KvDtype::f32})
    if (s == to_string(t)) return t;
  throw InputError(std::string(what) + ": \"" + std::string(s) + "\" is not one of auto, f16, bf16, f32");
}

std::size_t kv_element_bytes(KvDtype t) noexcept { return t == KvDtype::f32 ? 4 : 2; }

KvDtype resolve_kv_dtype(KvDtype t, model::DType weights) noexcept {
  if (t != KvDtype::automatic) return t;
  return weights == model::DType::bf16 ? KvDtype::bf16 : KvDtype::f16;
}

std::uint16_t f32_to_bf16(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

BlockAllocator::BlockAllocator(int n_blocks) : n_(n_blocks) {
  if (n_blocks < 1) throw InputError("KV cache: needs at least one block, got " + std::to_string(n_blocks));
  free_.reserve(static_cast<std::size_t>(n_blocks));
  // Pop from the back: hand out low block ids first.
  for (int b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  holders_.assign(static_cast<std::size_t>(n_blocks), 0);
}

int BlockAllocator::allocate() {
  std::lock_guard lk(mu_);
  return take_locked();
}

int BlockAllocator::take_locked() {
  if (free_.empty()) return -1;
  const int b = free_.back();
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
  free_locked(block);
}

void BlockAllocator::free_locked(int block) {
  if (block < 0 || block >= n_ || holders_[static_cast<std::size_t>(block)] == 0)
    throw Error("KV cache: free of block " + std::to_string(block) + ", which is not allocated");
  if (--holders_[static_cast<std::size_t>(block)] == 0) free_.push_back(block);
}

int BlockAllocator::allocate(int n, std::vector<int>& out) {
  std::lock_guard lk(mu_);
  int k = 0;
  for (; k < n && !free_.empty(); ++k) out.push_back(take_locked());
  return k;
}

void BlockAllocator::free(const std::vector<int>& blocks) {
  std::lock_guard lk(mu_);
  for (int b : blocks) free_locked(b);
}

int BlockAllocator::free_blocks() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(free_.size());
}

KvStore::KvStore(int n_layers, int n_blocks, int block_tokens, int kv_heads, int head_dim, KvDtype dtype)
    : nb_(n_blocks), bt_(block_tokens), kvh_(kv_heads), hd_(head_dim), dtype_(dtype), es_(kv_element_bytes(dtype)) {
  if (dtype == KvDtype::automatic) throw InputError("KV cache: the dtype must be resolved before the pages are made");
  n_ = static_cast<std::size_t>(n_layers) * n_blocks * kv_heads * block_tokens * head_dim;
  k_.reset(new std::byte[n_ * es_]);
  v_.reset(new std::byte[n_ * es_]);
}

}  // namespace ftp::engine
