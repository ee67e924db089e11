// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "doc/gear_table.hpp"
#include "engine/rank_backend.hpp"
#include "engine/weight_store.hpp"
#include "serve/device_pool.hpp"

namespace ftp::serve {

/// What release weight mode moved back onto devices before a gear's domains
/// were built (the shift record's reserve fields).
struct WeightCopy {
  std::uint64_t bytes = 0;  ///< bytes copied (CPU device-memory mode), uploaded (GPU) or prefetched (mapped pages)
  double ms = 0;            ///< wall time of the copy, ms
  bool freed_before = false;  ///< whether any of it had been freed (false: mapped prefetch or nothing)
};

/// Release weight mode across the backends (ARCHITECTURE.md, weight store):
/// when a release-mode gear retires, the devices that no remaining domain
/// uses free their weights; when a gear that needs them is reserved, they
/// come back before its domains are built. One interface for the three
/// places weights live:
/// - CPU virtual devices in device-memory mode: the device's copy of its
///   shard union (engine::WeightStore::release_device, copy_to_device);
/// - GPUs: the device's resident weights (engine::Backend::release_device,
///   make_resident; compile-only until a device session runs it);
/// - the mapped file otherwise: its pages (madvise: release_rank, prefetch_rank).
/// The copy back runs on a thread of its own, so it overlaps the rest of
/// the reservation. Thread-safe.
class WeightResidency {
 public:
  /// The shards a device holds once its weights are back, for a shift to
  /// `gear`: a CPU virtual device's union over the table in force, a GPU's
  /// union over the resident gears and `gear`.
  using ShardsOf = std::function<std::vector<engine::RankShard>(const DeviceBinding& device, const doc::Gear& gear)>;

  /// All must outlive it; `backend` may be null (no device backend).
  WeightResidency(engine::WeightStore& store, engine::Backend* backend, const DevicePool& pool, ShardsOf shards_of);

  /// Frees the weights of `from`'s devices that `in_use` (the devices of the
  /// remaining domains) does not name, when `from` is in release mode;
  /// returns the bytes freed (0 for a resident gear).
  std::uint64_t release(const doc::Gear& from, const std::vector<std::string>& in_use);
  /// Starts bringing back what `to`'s devices lack (freed by release()); for
  /// a release-mode gear on the mapped file, prefetches its pages. The
  /// future gives the bytes and the time once done, or throws the copy's
  /// error (hardware::OutOfDeviceMemory naming the device).
  std::future<WeightCopy> restore(const doc::Gear& to);

  /// Bytes copied onto CPU virtual devices since start (the store's).
  std::uint64_t copied_bytes() const { return store_.copied_bytes(); }
  /// Whether CPU virtual devices hold copies (device-memory mode).
  bool device_memory() const { return store_.device_memory(); }

 private:
  bool gpus() const;
  engine::WeightStore& store_;
  engine::Backend* backend_;
  const DevicePool& pool_;
  ShardsOf shards_of_;
  std::mutex mu_;
  std::set<int> released_gpus_;  // GPUs whose weights release() freed
};

}  // namespace ftp::serve
