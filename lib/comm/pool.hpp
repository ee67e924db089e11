// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/collective.hpp"

namespace ftp::comm {

/// The communicator pool of in-process ranks (ARCHITECTURE.md, resource
/// pool: device set -> communicator, created ahead so that a shift never
/// waits on one): InprocCommunicators made for each device set of a gear
/// table at start (prepare) and leased to the stages that run on that set
/// (acquire). A lease goes back to the pool when its last holder lets go
/// (reset first if it was aborted; dropped if it cannot be). Two domains on
/// one device set at once (a shift's old domain and its shadow) each lease
/// their own. The NCCL pool (comm::NcclPool) is the GPUs' counterpart.
/// Thread-safe.
class InprocPool {
 public:
  /// The ranks' devices of one stage, in rank order (their names; "" where a
  /// rank has none): its size is the communicator's.
  using Key = std::vector<std::string>;

  InprocPool();
  ~InprocPool();
  InprocPool(const InprocPool&) = delete;
  InprocPool& operator=(const InprocPool&) = delete;

  /// The devices of the gear table in force (names, any order): from now
  /// on the pool keeps communicators of device sets inside them only. An
  /// idle one of a set with another device is dropped now, a leased one
  /// when it is given back; sets inside stay. Until the first call every
  /// set is kept.
  void span(const std::vector<std::string>& devices);
  /// span()'s devices, sorted (empty before the first call).
  std::vector<std::string> devices() const;
  /// Makes communicators of `key` now until `count` exist (leased or idle).
  void prepare(const Key& key, int count);
  /// A communicator of `key`: an idle one of the pool, else one made now
  /// (counted in created()). Throws ftp::InputError for an empty key.
  std::shared_ptr<Collective> acquire(const Key& key);
  /// Communicators made so far (by prepare or acquire) and the wall time
  /// spent making them, ms.
  std::uint64_t created() const;
  double create_ms() const;
  /// Idle communicators of `key` now.
  std::size_t idle(const Key& key) const;

 private:
  struct State;
  std::shared_ptr<State> s_;
};

}  // namespace ftp::comm
