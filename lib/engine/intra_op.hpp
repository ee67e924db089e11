// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/packed_weights.hpp"
#include "engine/weight_store.hpp"

namespace ftp::hardware {
class VirtualDevice;
}

/// The threads of one CPU rank's operations (docs/architecture.md,
/// "Threads of a CPU rank"). A rank thread computes its stage's layers in
/// order; where its virtual device has more CPUs than the domain has ranks
/// on it, the rank's matrix products are split by output rows over the
/// rank thread and helper threads of its IntraOpPool. A row's dot product
/// is the same whoever computes it, so the outputs are bit-identical to one
/// thread's.
namespace ftp::engine {

/// The rank thread (the caller) and threads - 1 helper threads, pinned to
/// the rank's virtual device's CPUs where it has one. run() hands out the
/// parts of one operation; the parts are claimed one at a time by whichever
/// thread is free, so a helper that is late (asleep, descheduled) leaves
/// its parts to the caller instead of stalling it. A helper spins for a
/// short while (kSpinNs) after each operation, so the next one of the same
/// step finds it awake, then sleeps on a futex until the next.
class IntraOpPool {
 public:
  /// How long a helper spins for the next operation before it sleeps, ns.
  static constexpr std::int64_t kSpinNs = 100'000;

  /// `threads` >= 1 (1: no helper, run() calls fn inline); `device`: whose
  /// CPUs the helpers pin to (null: unpinned).
  IntraOpPool(int threads, const hardware::VirtualDevice* device);
  ~IntraOpPool();
  IntraOpPool(const IntraOpPool&) = delete;
  IntraOpPool& operator=(const IntraOpPool&) = delete;

  /// The caller and the helpers.
  int threads() const noexcept { return static_cast<int>(helpers_.size()) + 1; }

  /// Runs fn(part) once for each part in [0, parts) on the calling thread
  /// and the helpers; returns when every part has run. The first exception
  /// a part throws is rethrown here, after the parts already started have
  /// ended (the other parts may not run). One caller at a time.
  template <class Fn>
  void run(int parts, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run_parts(parts, [](void* c, int p) { (*static_cast<F*>(c))(p); }, const_cast<void*>(static_cast<const void*>(&fn)));
  }

  /// The helpers raise their nice value by `delta` before their next part
  /// (a draining domain's threads, as its rank threads do).
  void lower_priority(int delta) noexcept { nice_delta_.store(delta, std::memory_order_relaxed); }

  /// Parts run so far, in all and by the helpers: on a machine whose other
  /// CPUs are busy the helpers get few (benchmarks report the share).
  std::uint64_t parts_run() const noexcept { return parts_run_.load(std::memory_order_relaxed); }
  std::uint64_t helper_parts() const noexcept { return helper_parts_.load(std::memory_order_relaxed); }

 private:
  using PartFn = void (*)(void*, int);
  void run_parts(int parts, PartFn fn, void* ctx);
  /// Claims and runs parts of job `gen` until none is left.
  void work(std::uint32_t gen, bool helper);
  void helper_loop(const hardware::VirtualDevice* device);

  // claim_: generation (high 32 bits) | parts (16) | next part (low 16).
  std::atomic<std::uint64_t> claim_{0};
  std::atomic<std::uint32_t> gen_{0};  // the helpers wait on it
  std::atomic<int> sleeping_{0};
  std::atomic<int> done_{0};           // parts of the current job finished
  std::atomic<bool> caller_waits_{false};
  std::atomic<PartFn> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<bool> stop_{false};
  std::atomic<int> nice_delta_{0};
  std::atomic<std::uint64_t> parts_run_{0}, helper_parts_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::vector<std::thread> helpers_;
};

/// Row boundaries of a split of `w`'s rows into at most `parts` parts:
/// b[0] = 0 < b[1] < ... < b[m] = w.rows (m <= parts), each inner boundary
/// a multiple of kSplitRows from the view's first row, so that every
/// kernel's tiles (4 rows, 16-row groups, 64-row tiles) fall as they do
/// for the whole view. A view of at most kSplitRows rows is one part.
inline constexpr std::int64_t kSplitRows = 64;
std::vector<std::int64_t> row_parts(const MatView& w, int parts);

/// The CPU backend's product: out[t][w.rows] = x[t][w.cols] . W^T as
/// ops::matmul (or ops::matmul_packed where `packed` is the tensor's packed
/// copy), split by row_parts over `pool`'s threads. Bit-identical to one
/// thread's ops::matmul / matmul_packed. float32 matrices (BLAS sgemm,
/// whose sums may depend on the matrix's width) are not split.
void split_matmul(IntraOpPool& pool, const float* x, const MatView& w, const PackedQ8* packed, float* out, int t);

}  // namespace ftp::engine
