// SPDX-License-Identifier: Apache-2.0
#include "engine/intra_op.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "hardware/cpu/virtual_device.hpp"
#include "engine/ops.hpp"

namespace ftp::engine {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

constexpr std::uint64_t pack(std::uint32_t gen, int parts, int next) {
  return (static_cast<std::uint64_t>(gen) << 32) | (static_cast<std::uint64_t>(parts) << 16) |
         static_cast<std::uint64_t>(next);
}
constexpr std::uint32_t gen_of(std::uint64_t c) { return static_cast<std::uint32_t>(c >> 32); }
constexpr int parts_of(std::uint64_t c) { return static_cast<int>((c >> 16) & 0xffff); }
constexpr int next_of(std::uint64_t c) { return static_cast<int>(c & 0xffff); }

}  // namespace

IntraOpPool::IntraOpPool(int threads, const hardware::VirtualDevice* device) {
  for (int i = 1; i < std::max(1, threads); ++i) helpers_.emplace_back([this, device] { helper_loop(device); });
}

IntraOpPool::~IntraOpPool() {
  stop_.store(true, std::memory_order_seq_cst);
  gen_.fetch_add(1, std::memory_order_seq_cst);
  gen_.notify_all();
  for (auto& h : helpers_) h.join();
}

void IntraOpPool::run_parts(int parts, PartFn fn, void* ctx) {
  if (parts <= 0) return;
  if (helpers_.empty() || parts == 1) {
    parts_run_.fetch_add(static_cast<std::uint64_t>(parts), std::memory_order_relaxed);
    for (int p = 0; p < parts; ++p) fn(ctx, p);
    return;
  }
  parts = std::min(parts, 0xffff);
  fn_.store(fn, std::memory_order_relaxed);
  ctx_.store(ctx, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const std::uint32_t gen = gen_of(claim_.load(std::memory_order_relaxed)) + 1;
  claim_.store(pack(gen, parts, 0), std::memory_order_release);
  // Wake the helpers: a sleeping one registered in sleeping_ before it
  // checked gen_, so either it sees the new generation or we see it asleep.
  gen_.store(gen, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst) > 0) gen_.notify_all();
  work(gen, false);
  // The parts the helpers claimed: they are computing, so spin, then sleep.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; done_.load(std::memory_order_acquire) < parts; ++i) {
    cpu_relax();
    if ((i & 255) == 255 && std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(kSpinNs)) {
      caller_waits_.store(true, std::memory_order_seq_cst);
      for (int d; (d = done_.load(std::memory_order_seq_cst)) < parts;) done_.wait(d, std::memory_order_seq_cst);
      caller_waits_.store(false, std::memory_order_relaxed);
      break;
    }
  }
  std::exception_ptr err;
  {
    std::lock_guard lk(error_mu_);
    err = std::exchange(error_, nullptr);
  }
  if (err) std::rethrow_exception(err);
}

void IntraOpPool::work(std::uint32_t gen, bool helper) {
  std::uint64_t c = claim_.load(std::memory_order_acquire);
  while (gen_of(c) == gen && next_of(c) < parts_of(c)) {
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Part next_of(c) of job `gen` is ours: the job cannot end (nor its
    // function change) before we count it done.
    const int parts = parts_of(c);
    parts_run_.fetch_add(1, std::memory_order_relaxed);
    if (helper) helper_parts_.fetch_add(1, std::memory_order_relaxed);
    try {
      fn_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), next_of(c));
    } catch (...) {
      std::lock_guard lk(error_mu_);
      if (!error_) error_ = std::current_exception();
      // The parts not yet claimed are skipped: claim them all.
      std::uint64_t rest = claim_.load(std::memory_order_acquire);
      while (gen_of(rest) == gen && next_of(rest) < parts_of(rest) &&
             !claim_.compare_exchange_weak(rest, pack(gen, parts_of(rest), parts_of(rest)), std::memory_order_acq_rel))
        ;
      if (gen_of(rest) == gen) done_.fetch_add(parts_of(rest) - next_of(rest), std::memory_order_acq_rel);
    }
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 >= parts && caller_waits_.load(std::memory_order_seq_cst))
      done_.notify_all();
    c = claim_.load(std::memory_order_acquire);
  }
}

void IntraOpPool::helper_loop(const hardware::VirtualDevice* device) {
  if (device) device->bind_current_thread();
  int niced = 0;
  std::uint32_t seen = gen_.load(std::memory_order_acquire);
  for (;;) {
    // Spin a while for the next job, then sleep until it comes.
    const auto t0 = std::chrono::steady_clock::now();
    // stop_ is set before the destructor's last bump of gen_: a helper that
    // started after that bump (seen is the last value) sees stop_ here.
    for (int i = 0; gen_.load(std::memory_order_seq_cst) == seen && !stop_.load(std::memory_order_seq_cst); ++i) {
      cpu_relax();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(kSpinNs)) {
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        while (gen_.load(std::memory_order_seq_cst) == seen && !stop_.load(std::memory_order_seq_cst))
          gen_.wait(seen, std::memory_order_seq_cst);
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
        break;
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen_.load(std::memory_order_acquire);
    if (const int d = nice_delta_.load(std::memory_order_relaxed); d > niced) {
      hardware::lower_current_thread_priority(d - niced);  // best effort
      niced = d;
    }
    work(seen, true);
  }
}

std::vector<std::int64_t> row_parts(const MatView& w, int parts) {
  std::vector<std::int64_t> b = {0};
  const std::int64_t units = (w.rows + kSplitRows - 1) / kSplitRows;
  const std::int64_t m = std::clamp<std::int64_t>(units, 1, std::max(1, parts));
  for (std::int64_t j = 1; j < m; ++j) b.push_back(units * j / m * kSplitRows);
  b.push_back(w.rows);
  return b;
}

void split_matmul(IntraOpPool& pool, const float* x, const MatView& w, const PackedQ8* packed, float* out, int t) {
  auto product = [packed](const float* xs, const MatView& v, float* o, int tt) {
    if (packed) return ops::matmul_packed(xs, *packed, v, o, tt);
    ops::matmul(xs, v, o, tt);
  };
  if (pool.threads() == 1 || t == 0 || w.rows <= kSplitRows || w.t->dtype == model::DType::f32)
    return product(x, w, out, t);
  const std::vector<std::int64_t> b = row_parts(w, pool.threads());
  pool.run(static_cast<int>(b.size()) - 1, [&](int p) {
    MatView part = w;
    part.r0 = w.r0 + b[static_cast<std::size_t>(p)];
    part.rows = b[static_cast<std::size_t>(p) + 1] - b[static_cast<std::size_t>(p)];
    if (t == 1) return product(x, part, out + b[static_cast<std::size_t>(p)], 1);
    // Rows of t tokens: the part's outputs [t][part.rows], then into out's columns.
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(part.rows));
    product(x, part, scratch.data(), t);
    for (int u = 0; u < t; ++u)
      std::memcpy(out + static_cast<std::ptrdiff_t>(u) * w.rows + b[static_cast<std::size_t>(p)],
                  scratch.data() + static_cast<std::ptrdiff_t>(u) * part.rows,
                  static_cast<std::size_t>(part.rows) * sizeof(float));
  });
}

}  // namespace ftp::engine
