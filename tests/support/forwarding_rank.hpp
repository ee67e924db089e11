// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "engine/rank_backend.hpp"

namespace ftp::testing {

/// A RankBackend that forwards every call to another (a CPU rank): tests
/// derive from it and override the calls they watch or break.
struct ForwardingRank : engine::RankBackend {
  using Buf = engine::Buf;
  explicit ForwardingRank(std::unique_ptr<engine::RankBackend> b) : b_(std::move(b)) {}
  void bind_thread() override { b_->bind_thread(); }
  std::uint64_t kv_bytes() const override { return b_->kv_bytes(); }
  float* buffer(Buf id, std::size_t n) override { return b_->buffer(id, n); }
  void set_batch(const engine::BatchLayout& l) override { b_->set_batch(l); }
  void upload(const float* h, float* d, std::size_t n) override { b_->upload(h, d, n); }
  void download(const float* d, float* h, std::size_t n) override { b_->download(d, h, n); }
  void embed(float* x) override { b_->embed(x); }
  void gather_columns(const float* s, std::size_t r, std::span<const std::size_t> w, float* f) override {
    b_->gather_columns(s, r, w, f);
  }
  void rmsnorm(const float* x, const float* w, float* o, int r) override { b_->rmsnorm(x, w, o, r); }
  void matmul(const float* x, const engine::MatView& w, float* o, int r) override { b_->matmul(x, w, o, r); }
  void add_bias(float* x, const engine::VecView& b) override { b_->add_bias(x, b); }
  void head_rmsnorm(float* v, const float* w, int n) override { b_->head_rmsnorm(v, w, n); }
  void rope(float* v, int n) override { b_->rope(v, n); }
  void kv_write(int l, const float* k, const float* v) override { b_->kv_write(l, k, v); }
  void attention(int l, const float* q, float* o, int n, int q0, int k0) override { b_->attention(l, q, o, n, q0, k0); }
  void silu_mul(float* g, const float* u, std::size_t n) override { b_->silu_mul(g, u, n); }
  void zero(float* x, std::size_t n) override { b_->zero(x, n); }
  void add(float* x, const float* y, std::size_t n) override { b_->add(x, y, n); }
  void all_reduce(float* x, std::size_t n) override { b_->all_reduce(x, n); }
  void gather_logit_rows(const float* x, float* o) override { b_->gather_logit_rows(x, o); }
  void abort() noexcept override { b_->abort(); }
  bool recover() noexcept override { return b_->recover(); }
  void run(int k, const std::function<void()>& ops) override { b_->run(k, ops); }
  void sync() override { b_->sync(); }

 protected:
  std::unique_ptr<engine::RankBackend> b_;
};

}  // namespace ftp::testing
