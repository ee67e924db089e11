// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/bus_bandwidth.hpp"
#include "comm/collective.hpp"
#include "comm/rendezvous.hpp"

namespace ftp::comm {

/// Where a Gloo group's TCP transport listens and how long its operations
/// may wait. A peer that died is seen at once (its socket closes); one that
/// hangs is seen after `timeout`.
struct GlooOptions {
  std::string hostname = "127.0.0.1";   ///< the address this process's pairs bind (the operator's)
  std::chrono::milliseconds timeout{10000};
};

/// One Gloo context (libgloo, TCP transport): `size` ranks, this object
/// being rank `rank`, connected in a full mesh through a rendezvous store
/// under `prefix`. The constructor returns once every rank has connected
/// (or throws ftp::Error after the timeout). Not thread-safe: one thread
/// calls it at a time, ranks call collectives in the same order.
class GlooGroup {
 public:
  GlooGroup(RendezvousStore& store, const std::string& prefix, int rank, int size, const GlooOptions& options = {});
  ~GlooGroup();
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// Sum of every rank's `count` floats into every rank's `data`, added in
  /// rank order for each element ((x0 + x1) + x2 ..., as InprocCommunicator):
  /// gloo::allgather, then the sum here. Throws ftp::Error when a peer is
  /// gone or the timeout passes.
  void all_reduce_sum(float* data, std::size_t count);
  /// Collective::gather_columns over the group (rank 0 gathers): each other
  /// rank sends a header (its rows and width) and then its rows; rank 0
  /// takes each header first and receives the rows the header announces,
  /// so a peer that disagrees is an ftp::Error on rank 0 that leaves the
  /// group in step (Gloo ends the process when a message is longer than
  /// the buffer posted for it). Point-to-point, so rank 0 receives
  /// (size - 1)/size of the rows and nothing else moves. abort() wakes
  /// rank 0's receives and the others' sends.
  void gather_columns(const float* slice, std::size_t rows, std::span<const std::size_t> widths, float* full);
  /// `bytes` bytes of the root's `data` into every rank's (gloo::broadcast).
  void broadcast(int root, void* data, std::size_t bytes);
  /// Point-to-point (gloo's unbound buffers): `tag` pairs a send with its
  /// recv. A recv waits up to `timeout` (0: the group's); past it Gloo
  /// fails the whole group (it cannot be used again). abort() ends the wait.
  void send(int dst, const void* data, std::size_t bytes, std::uint32_t tag);
  void recv(int src, void* data, std::size_t bytes, std::uint32_t tag,
            std::chrono::milliseconds timeout = std::chrono::milliseconds{0});
  /// send without waiting: `data` is kept until wait_sends(). Sends posted
  /// before the peers' receives cannot deadlock two processes that send to
  /// each other in one pipeline tick.
  void post_send(int dst, std::vector<char> data, std::uint32_t tag);
  /// Waits for every posted send (up to the timeout).
  void wait_sends();
  /// Wakes a pending recv with an error; every later call throws.
  void abort() noexcept;
  bool aborted() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_, size_;
};

/// The Collective of a stage's ranks that live in this process when the
/// stage's other ranks live in other processes: one GlooGroup per local
/// rank (the stage's tp ranks meet under `prefix`), each used by its rank's
/// thread only. Its all-reduce adds in rank order, so it gives the same
/// bits as InprocCommunicator. After an abort it cannot be reset (the
/// groups' operations are out of step): the domain is rebuilt.
class GlooCommunicator final : public Collective {
 public:
  /// Connects `local_ranks` (ranks of the stage held here) among `tp` ranks.
  GlooCommunicator(RendezvousStore& store, const std::string& prefix, int tp, const std::vector<int>& local_ranks,
                   const GlooOptions& options = {});
  ~GlooCommunicator() override;
  int size() const noexcept override { return tp_; }
  void all_reduce_sum(int rank, float* data, std::size_t count) override;
  void gather_columns(int rank, const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                      float* full) override;
  void abort() noexcept override;
  bool reset() noexcept override { return false; }

 private:
  int tp_;
  std::map<int, std::unique_ptr<GlooGroup>> groups_;
};

/// Measures all-reduce (float32 sum, rank order) of `bytes` per rank over
/// n_ranks Gloo ranks that are threads of this process on loopback TCP:
/// warm-up, then iterations sized to ~0.1 s (quick) or 0.5 s.
AllReduceMeasurement measure_gloo_allreduce(int n_ranks, std::size_t bytes, bool quick);

}  // namespace ftp::comm
