// SPDX-License-Identifier: Apache-2.0
#include "comm/inproc.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "comm/running_ranks.hpp"
#include "core/error.hpp"

namespace ftp::comm {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Work is split between ranks in units of 16 floats (one 64-byte cache
// line) so that two ranks never write the same line.
constexpr std::size_t kUnit = 16;
// Elements summed per block: the block's accumulator stays in L1.
constexpr std::size_t kBlock = 1024;
// Spins before sleeping on the futex: short collectives stay in the
// microseconds, and a rank does not burn a core for long.
constexpr int kSpins = 4000;

// Spinning pays only while every rank that may be waiting can have a CPU:
// the ranks of the steps running now (comm/running_ranks.hpp), or this
// communicator's own when it is used outside a step. Otherwise a spinning rank would take
// the CPU a late rank needs, and a rank that loses its CPU for a time slice
// stalls its whole stage.
const int g_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

}  // namespace

InprocCommunicator::InprocCommunicator(int n_ranks) : n_(n_ranks) {
  if (n_ranks < 1) throw InputError("inproc communicator: n_ranks must be >= 1, got " + std::to_string(n_ranks));
  buffers_.assign(n_, nullptr);
  counts_.assign(n_, 0);
  slices_.assign(n_, nullptr);
  widths_.assign(n_, {});
}

InprocCommunicator::~InprocCommunicator() = default;

void InprocCommunicator::check_rank(int rank, const char* op) const {
  if (rank < 0 || rank >= n_)
    throw InputError(std::string("inproc ") + op + ": rank " + std::to_string(rank) + " out of range [0, " +
                     std::to_string(n_) + ")");
  if (aborted()) throw Error(std::string("inproc ") + op + ": communicator aborted");
}

void InprocCommunicator::wait_all() {
  const std::uint32_t gen = generation_.load(std::memory_order_acquire);
  if (aborted()) throw Error("inproc communicator aborted");
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
    // Last to arrive: reset for the next phase, then release the others.
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    return;
  }
  const int spins = std::max(running_ranks(), n_) <= g_cpus ? kSpins : 0;
  for (int i = 0; i < spins && generation_.load(std::memory_order_acquire) == gen; ++i) cpu_relax();
  while (generation_.load(std::memory_order_acquire) == gen) generation_.wait(gen, std::memory_order_acquire);
  if (aborted()) throw Error("inproc communicator aborted");
}

bool InprocCommunicator::reset() noexcept {
  arrived_.store(0, std::memory_order_relaxed);
  aborted_.store(false, std::memory_order_release);
  return true;
}

void InprocCommunicator::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
}

void InprocCommunicator::check_counts(const char* op) {
  for (int r = 1; r < n_; ++r) {
    if (counts_[r] != counts_[0]) {
      std::string msg = std::string("inproc ") + op + ": ranks disagree on count: rank 0 has " +
                        std::to_string(counts_[0]) + ", rank " + std::to_string(r) + " has " +
                        std::to_string(counts_[r]);
      // Everyone has read the counts before anyone posts again.
      wait_all();
      throw Error(msg);
    }
  }
}

void InprocCommunicator::barrier(int rank) {
  check_rank(rank, "barrier");
  if (n_ > 1) wait_all();
}

void InprocCommunicator::all_reduce_sum(int rank, float* data, std::size_t count) {
  check_rank(rank, "all_reduce_sum");
  if (n_ == 1) return;
  buffers_[rank] = data;
  counts_[rank] = count;
  wait_all();
  check_counts("all_reduce_sum");

  // Rank r reduces its slice of every buffer and writes the sum back to
  // all of them: reduce-scatter and all-gather in one pass. Each element is
  // summed in rank order, so the result does not depend on which thread
  // does the work.
  const std::size_t units = (count + kUnit - 1) / kUnit;
  const std::size_t begin = std::min(count, units * rank / n_ * kUnit);
  const std::size_t end = std::min(count, units * (rank + 1) / n_ * kUnit);
  alignas(64) float acc[kBlock];
  for (std::size_t b = begin; b < end; b += kBlock) {
    const std::size_t len = std::min(kBlock, end - b);
    const float* src0 = buffers_[0] + b;
    for (std::size_t i = 0; i < len; ++i) acc[i] = src0[i];
    for (int j = 1; j < n_; ++j) {
      const float* src = buffers_[j] + b;
      for (std::size_t i = 0; i < len; ++i) acc[i] += src[i];
    }
    for (int j = 0; j < n_; ++j) std::memcpy(buffers_[j] + b, acc, len * sizeof(float));
  }
  // No rank returns (and touches its buffer) before every slice is written.
  wait_all();
}

void InprocCommunicator::gather_columns(int rank, const float* slice, std::size_t rows,
                                        std::span<const std::size_t> widths, float* full) {
  check_rank(rank, "gather_columns");
  auto place = [&](float* dst, std::size_t ld, std::size_t col0, std::size_t w) {
    if (w == 0) return;
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld + col0, slice + r * w, w * sizeof(float));
  };
  if (n_ == 1) {
    if (widths.size() != 1)
      throw Error("inproc gather_columns: " + std::to_string(widths.size()) + " widths for 1 rank");
    if (slice != full) place(full, widths[0], 0, widths[0]);
    return;
  }
  buffers_[rank] = full;
  slices_[rank] = slice;
  counts_[rank] = rows;
  widths_[rank] = widths;
  wait_all();
  std::string msg;
  for (int r = 0; r < n_ && msg.empty(); ++r) {
    const auto& w = widths_[r];
    if (w.size() != static_cast<std::size_t>(n_))
      msg = "rank " + std::to_string(r) + " passes " + std::to_string(w.size()) + " widths for " + std::to_string(n_) +
            " ranks";
    else if (counts_[r] != counts_[0])
      msg = "ranks disagree on rows: rank 0 has " + std::to_string(counts_[0]) + ", rank " + std::to_string(r) +
            " has " + std::to_string(counts_[r]);
    else if (r > 0 && !std::equal(w.begin(), w.end(), widths_[0].begin()))
      msg = "ranks disagree on widths: rank 0 and rank " + std::to_string(r);
  }
  if (!msg.empty()) {
    wait_all();  // everyone has read the arguments before anyone posts again
    throw Error("inproc gather_columns: " + msg);
  }
  std::size_t ld = 0, col0 = 0;
  for (int r = 0; r < n_; ++r) {
    if (r == rank) col0 = ld;
    ld += widths[static_cast<std::size_t>(r)];
  }
  place(buffers_[0], ld, col0, widths[static_cast<std::size_t>(rank)]);
  // Rank 0 does not read its rows, nor a peer reuse its slice, before every
  // copy is done.
  wait_all();
}

void InprocCommunicator::broadcast(int rank, int root, float* data, std::size_t count) {
  check_rank(rank, "broadcast");
  if (root < 0 || root >= n_)
    throw InputError("inproc broadcast: root " + std::to_string(root) + " out of range [0, " + std::to_string(n_) +
                     ")");
  if (n_ == 1) return;
  buffers_[rank] = data;
  counts_[rank] = count;
  wait_all();
  check_counts("broadcast");
  if (rank != root && count > 0 && data != buffers_[root]) std::memcpy(data, buffers_[root], count * sizeof(float));
  wait_all();
}

AllReduceMeasurement measure_inproc_allreduce(int n_ranks, std::size_t bytes, bool quick) {
  if (n_ranks < 1) throw InputError("inproc all-reduce: n_ranks must be >= 1, got " + std::to_string(n_ranks));
  const std::size_t count = bytes / sizeof(float);
  if (count == 0) throw InputError("inproc all-reduce: bytes must be >= 4, got " + std::to_string(bytes));
  using Clock = std::chrono::steady_clock;
  InprocCommunicator comm(n_ranks);
  AllReduceMeasurement m;
  m.n_ranks = n_ranks;
  m.bytes = count * sizeof(float);
  m.method = "inproc float32 sum";
  const double target_s = quick ? 0.1 : 0.5;
  int iterations = 0;        // decided by rank 0 after the warm-up
  double total_seconds = 0;  // written by rank 0
  auto rank_main = [&](int rank) {
    // Zeros keep the sums finite however many iterations run.
    std::vector<float> buf(count, 0.0f);
    try {
      comm.barrier(rank);
      auto t0 = Clock::now();
      for (int i = 0; i < 2; ++i) comm.all_reduce_sum(rank, buf.data(), count);
      comm.barrier(rank);
      if (rank == 0) {
        double warm = std::chrono::duration<double>(Clock::now() - t0).count() / 2;
        iterations = static_cast<int>(std::clamp(target_s / std::max(warm, 1e-9), 3.0, 1000.0));
      }
      comm.barrier(rank);
      const int iters = iterations;
      t0 = Clock::now();
      for (int i = 0; i < iters; ++i) comm.all_reduce_sum(rank, buf.data(), count);
      comm.barrier(rank);
      if (rank == 0) total_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    } catch (...) {
      comm.abort();
      throw;
    }
  };
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex failure_mu;
  for (int r = 1; r < n_ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        rank_main(r);
      } catch (...) {
        std::lock_guard lock(failure_mu);
        if (!failure) failure = std::current_exception();
      }
    });
  try {
    rank_main(0);
  } catch (...) {
    std::lock_guard lock(failure_mu);
    if (!failure) failure = std::current_exception();
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  m.iterations = iterations;
  finish_allreduce_measurement(m, total_seconds);
  return m;
}

}  // namespace ftp::comm
