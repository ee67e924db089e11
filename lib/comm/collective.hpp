// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <span>

namespace ftp::comm {

/// What a CPU rank of a stage needs from its communicator: the all-reduce
/// of the tensor-parallel ranks, the gather of the vocabulary-parallel
/// head's column slices into rank 0, abort and reset. In one process the ranks
/// share an InprocCommunicator (comm/inproc.hpp); across processes each
/// process holds a GlooCommunicator (comm/gloo.hpp) for its own ranks of
/// the stage. Both sum in rank order ((x0 + x1) + x2 ...), so a gear gives
/// the same bits whether its ranks share a process or not.
class Collective {
 public:
  virtual ~Collective() = default;
  /// The stage's tensor-parallel degree (ranks in all processes).
  virtual int size() const noexcept = 0;
  /// Sums `count` floats of every rank's `data` element-wise into every
  /// rank's `data`, in rank order. `rank` is the caller's rank in the stage.
  virtual void all_reduce_sum(int rank, float* data, std::size_t count) = 0;
  /// Gathers column slices into rank 0's full rows: rank r's `slice` holds
  /// `rows` contiguous rows of widths[r] floats; rank 0's `full` (rows of
  /// sum(widths) floats) receives rank r's rows at columns [sum(widths[0,
  /// r)), + widths[r]) of each row, its own included. Every rank passes the
  /// same `rows` and `widths` (one per rank; a rank of width 0 sends no
  /// data); `full` is written on rank 0 only (the others may pass null).
  /// Copies only, so the result is bit-exact. Ranks that disagree on rows
  /// or widths throw ftp::Error (InprocCommunicator: every rank; Gloo:
  /// rank 0, which still takes what each peer sent, so that the group stays
  /// in step). `rank` is the caller's rank in the stage.
  virtual void gather_columns(int rank, const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                              float* full) = 0;
  /// Wakes waiting ranks with an error; later calls throw until reset().
  virtual void abort() noexcept = 0;
  /// Makes an aborted communicator usable again; false where it cannot be.
  virtual bool reset() noexcept = 0;
};

}  // namespace ftp::comm
