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
/// pool"): a root communicator over exactly the GPUs the gear table uses
/// (ncclCommInitAll over them, timed; span()), so that NCCL's CUDA contexts
/// and buffers live on those devices only, and for each device set a gear's
/// stage uses, sub-communicators split from it (ncclCommSplit, all root
/// communicators taking part from one thread in one group), made ahead with
/// prepare() or on first request, and reused. A stage holds its set from
/// group() to release(). Communicators are opaque here (ncclComm_t as void*)
/// so that this header needs no NCCL. Thread-safe. Builds without CUDA
/// throw ftp::BackendError.
class NcclPool {
 public:
  /// The process's pool, created on first use and kept until the process
  /// ends. Creating it makes no communicator and no CUDA context.
  static NcclPool& instance();
  ~NcclPool();
  NcclPool(const NcclPool&) = delete;
  NcclPool& operator=(const NcclPool&) = delete;

  /// GPUs of the root communicator now (0 before the first span or group).
  int n_devices() const;
  /// The root communicator's GPUs (CUDA ordinals, ascending).
  std::vector<int> devices() const;
  /// Milliseconds ncclCommInitAll took to make the root communicators now
  /// in use (0 before the first).
  double create_ms() const;
  /// Makes the root communicator span exactly `devices` (distinct CUDA
  /// ordinals, any order; the union of the gear table's GPUs): nothing when
  /// it does already; else the root on other devices is destroyed and one
  /// made over these. The device sets split before that lie inside
  /// `devices` stay (a split communicator outlives its parent); the others
  /// are destroyed once no stage holds them. Empty: no root (and no
  /// communicator on any GPU once their stages are gone). Returns the
  /// milliseconds it took. Throws ftp::InputError for an ordinal that is
  /// not visible, ftp::BackendError for NCCL failures.
  double span(const std::vector<int>& devices);
  /// Communicators of `devices` (distinct CUDA ordinals, rank order): element
  /// r is rank r's, on devices[r]; the caller holds them until release().
  /// A set with a GPU outside the root widens the root first (the root then
  /// spans both). Throws ftp::InputError for repeated or unknown ordinals,
  /// ftp::BackendError for NCCL failures.
  std::vector<void*> group(const std::vector<int>& devices);
  /// Lets go of a hold that group() gave.
  void release(const std::vector<int>& devices) noexcept;
  /// Makes the sub-communicators of these device sets now (a gear table's
  /// stages), so that a shift never waits on communicator creation.
  /// Returns the milliseconds the splits took.
  double prepare(const std::vector<std::vector<int>>& sets);
  /// Communicators made so far (every root and every split), and the wall
  /// time spent making them, ms.
  std::uint64_t communicators_made() const;
  double made_ms() const;
  /// Aborts and forgets the communicators of a device set (after a failure
  /// inside a collective); the next group() makes new ones.
  void drop(const std::vector<int>& devices) noexcept;

 private:
  NcclPool();
  /// A device set's communicators and how many stages hold them.
  struct Group {
    std::vector<void*> comms;
    int holders = 0;
  };
  std::vector<void*> split_locked(const std::vector<int>& devices);
  double span_locked(const std::vector<int>& devices);
  mutable std::mutex mu_;
  int visible_ = 0;                 // cudaGetDeviceCount
  std::vector<int> devices_;        // the root's, ascending
  std::vector<void*> roots_;
  std::map<std::vector<int>, Group> groups_;
  double create_ms_ = 0;            // the root in use
  std::uint64_t made_ = 0;          // every root and split communicator
  double made_ms_ = 0;
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
/// takes them into `staging` (rows x (sum(widths) - widths[0]) floats on
/// its device, rank r's at offset rows x (its first column - widths[0]))
/// and places them in `full`
/// with cudaMemcpy2DAsync; at rows == 1 a slice is contiguous in `full`
/// and received in place (`staging` may then be null). Asynchronous, as
/// ncclAllReduce; its own slice rank 0 places too. The ranks' widths must
/// agree (NCCL cannot check: a disagreement hangs or corrupts, as with
/// ncclAllReduce counts). Throws ftp::BackendError naming the device.
void nccl_gather_columns(void* comm, int rank, const float* slice, std::size_t rows,
                         std::span<const std::size_t> widths, float* full, float* staging, void* stream, int device);

}  // namespace ftp::comm
