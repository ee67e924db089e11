// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "comm/bus_bandwidth.hpp"

namespace ftp::comm {

/// True when this build has NCCL (built with CUDA).
bool nccl_available() noexcept;

/// Measures NCCL all-reduce (float32 sum, in place) of `bytes` per GPU over
/// the CUDA devices `devices`, from one thread of this process:
/// ncclCommInitAll, one stream per device, each iteration one
/// ncclGroupStart/End over all devices. 5 warm-up iterations, then 20
/// (quick) or 100 timed ones, wall time from the launch of the first to the
/// end of the last on every stream. See AllReduceMeasurement for busbw.
/// Throws ftp::BackendError naming the failed CUDA/NCCL call (also when
/// built without CUDA), ftp::InputError for an empty device list.
AllReduceMeasurement measure_nccl_allreduce(const std::vector<int>& devices, std::size_t bytes, bool quick);

/// The NCCL communicator pool of this process (ARCHITECTURE.md, "Resource
/// pool"): one communicator per local GPU over all of them, made once
/// (ncclCommInitAll over every visible device, timed), and for each device
/// set a gear's stage uses, sub-communicators split from it
/// (ncclCommSplit, all root communicators taking part from one thread in
/// one group), made on first request or ahead with prepare(), and reused.
/// Communicators are opaque here (ncclComm_t as void*) so that this header
/// needs no NCCL. Thread-safe. Builds without CUDA throw ftp::BackendError.
class NcclPool {
 public:
  /// The process's pool, created on first use and kept until the process ends.
  static NcclPool& instance();
  ~NcclPool();
  NcclPool(const NcclPool&) = delete;
  NcclPool& operator=(const NcclPool&) = delete;

  /// Devices of the root communicator (all visible GPUs).
  int n_devices() const noexcept { return static_cast<int>(roots_.size()); }
  /// Milliseconds ncclCommInitAll took to make the root communicators.
  double create_ms() const noexcept { return create_ms_; }
  /// Communicators of `devices` (distinct CUDA ordinals, rank order): element
  /// r is rank r's, on devices[r]. The root ones when the set is every device
  /// in order. Throws ftp::InputError for repeated or unknown ordinals,
  /// ftp::BackendError for NCCL failures.
  std::vector<void*> group(const std::vector<int>& devices);
  /// Makes the sub-communicators of these device sets now (a gear table's
  /// stages), so that a shift never waits on communicator creation.
  /// Returns the milliseconds the splits took.
  double prepare(const std::vector<std::vector<int>>& sets);
  /// Communicators made so far (the root ones and every split), and the
  /// wall time spent making them, ms.
  std::uint64_t communicators_made() const;
  double made_ms() const;
  /// Aborts and forgets the communicators of a device set (after a failure
  /// inside a collective); the next group() makes new ones.
  void drop(const std::vector<int>& devices) noexcept;

 private:
  NcclPool();
  std::vector<void*> split_locked(const std::vector<int>& devices);
  mutable std::mutex mu_;
  std::vector<int> devices_;
  std::vector<void*> roots_;
  std::map<std::vector<int>, std::vector<void*>> groups_;
  double create_ms_ = 0;
  std::uint64_t splits_ = 0;  // communicators made by ncclCommSplit
  double split_ms_ = 0;
};

/// In-place float32 sum over a communicator of the pool, on a CUDA stream
/// (cudaStream_t as void*); asynchronous, as ncclAllReduce. Throws
/// ftp::BackendError naming the device.
void nccl_all_reduce_sum(void* comm, float* data, std::size_t count, void* stream, int device);

/// Collective::gather_columns on a CUDA stream over a communicator of the
/// pool (`rank` its rank, widths.size() ranks): ranks > 0 ncclSend their
/// rows, rank 0 ncclRecv's each peer's in one group (point-to-point: rank 0
/// receives (n - 1)/n of the rows, as rows x sum(widths) x 4 x (n - 1)/n
/// bytes, and nothing else moves; an all-gather would move n - 1 padded
/// slices to every rank). A peer's rows are received contiguous, so rank 0
/// takes them into `staging` (rows x sum(widths) floats on its device,
/// rank r's at offset rows x its first column) and places them in `full`
/// with cudaMemcpy2DAsync; at rows == 1 a slice is contiguous in `full`
/// and received in place (`staging` may then be null). Asynchronous, as
/// ncclAllReduce; its own slice rank 0 places too. The ranks' widths must
/// agree (NCCL cannot check: a disagreement hangs or corrupts, as with
/// ncclAllReduce counts). Throws ftp::BackendError naming the device.
void nccl_gather_columns(void* comm, int rank, const float* slice, std::size_t rows,
                         std::span<const std::size_t> widths, float* full, float* staging, void* stream, int device);

}  // namespace ftp::comm
