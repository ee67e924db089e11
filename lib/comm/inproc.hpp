// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/bus_bandwidth.hpp"
#include "comm/collective.hpp"

namespace ftp::comm {

/// In-process communicator: n ranks are n threads of one process sharing
/// memory (CPU virtual devices, or ranks of a test). Every collective is
/// called by all n ranks concurrently, each with its own rank id and the
/// same arguments (count, root); each rank's call returns when the
/// collective is complete for that rank. Calls must come in the same order
/// on every rank, like NCCL's.
///
/// Results are deterministic: all_reduce_sum adds in rank order
/// ((x0 + x1) + x2) + ... for every element, whatever the thread timing, so
/// that outputs are bit-identical across runs and equal to a serial sum.
///
/// A rank that fails can call abort(): ranks waiting inside a collective
/// (now or later) throw ftp::Error("inproc communicator aborted") instead of
/// hanging. An aborted communicator stays aborted until reset().
class InprocCommunicator final : public Collective {
 public:
  /// Throws ftp::InputError if n_ranks < 1.
  explicit InprocCommunicator(int n_ranks);
  ~InprocCommunicator() override;
  InprocCommunicator(const InprocCommunicator&) = delete;
  InprocCommunicator& operator=(const InprocCommunicator&) = delete;

  int size() const noexcept override { return n_; }

  /// Sums `count` floats of every rank's `data`, element-wise, into every
  /// rank's `data` (in place). Buffers must not overlap between ranks.
  /// All ranks must pass the same count, else every rank throws ftp::Error.
  void all_reduce_sum(int rank, float* data, std::size_t count) override;

  /// Collective::gather_columns: each rank copies its own slice into rank
  /// 0's full rows (the copies run in parallel and never overlap). Ranks
  /// that disagree on rows or widths, or widths of other than size()
  /// entries, make every rank throw ftp::Error.
  void gather_columns(int rank, const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                      float* full) override;

  /// Copies `count` floats from the root's `data` into every other rank's.
  void broadcast(int rank, int root, float* data, std::size_t count);

  /// Returns when all ranks have called barrier.
  void barrier(int rank);

  /// Wakes every waiting rank with an error; later collectives throw too.
  void abort() noexcept override;
  /// Makes an aborted communicator usable again. Only while no rank is
  /// inside a collective (e.g. after every rank's step has returned).
  bool reset() noexcept override;
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

 private:
  void check_rank(int rank, const char* op) const;
  void wait_all();
  /// Checks that every rank posted the same count; throws on all ranks if not.
  void check_counts(const char* op);

  int n_;
  // A waiting rank spins a little before it sleeps, unless the ranks of the
  // running steps (comm::running_ranks) outnumber the CPUs: a spinning rank
  // would then take the CPU that a late rank (of this stage or of another
  // domain) needs.
  // Barrier state: arrivals of the current phase and its generation.
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> aborted_{false};
  // What each rank posted for the current collective.
  std::vector<float*> buffers_;
  std::vector<std::size_t> counts_;
  // gather_columns: each rank's slice and widths (full rows in buffers_[0]).
  std::vector<const float*> slices_;
  std::vector<std::span<const std::size_t>> widths_;
};

/// Measures all-reduce of `bytes` per rank (float32 sum) over n_ranks
/// threads with an InprocCommunicator: 2 warm-up iterations, then
/// iterations sized to take about 0.1 s (quick) or 0.5 s, at least 3 and
/// at most 1000. See AllReduceMeasurement for algbw and busbw.
/// Throws ftp::InputError if n_ranks < 1 or bytes < 4.
AllReduceMeasurement measure_inproc_allreduce(int n_ranks, std::size_t bytes, bool quick);

}  // namespace ftp::comm
