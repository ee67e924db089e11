// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace ftp::hardware {

/// A reservation that does not fit a device's memory budget. Exit code 1:
/// it is a capacity error of the plan, not a failure of the backend.
class OutOfDeviceMemory : public Error {
 public:
  explicit OutOfDeviceMemory(std::string message) : Error(std::move(message), Exit::failure) {}
};

/// A CPU virtual device: a share of the CPU's threads standing in for a GPU,
/// with its own memory budget and accounting, so that every parallel path
/// (TP ranks, PP stages, replicas) runs and is tested without a GPU.
/// Accounting is thread-safe; the device does not allocate memory itself:
/// code that allocates on behalf of the device reserves first and releases
/// after freeing.
class VirtualDevice {
 public:
  /// `oversubscribed`: the CPUs are shared with other devices.
  VirtualDevice(int id, int threads, std::vector<int> cpus, std::uint64_t memory_budget_bytes,
                bool oversubscribed = false);
  VirtualDevice(const VirtualDevice&) = delete;
  VirtualDevice& operator=(const VirtualDevice&) = delete;

  int id() const noexcept { return id_; }
  /// "cpu:<id>", the device name used in topology documents.
  std::string name() const { return "cpu:" + std::to_string(id_); }
  /// Worker threads of this device (>= 1).
  int threads() const noexcept { return threads_; }
  /// CPU ids the threads should run on; shared with other devices when the
  /// CPU is oversubscribed (more devices than usable CPUs).
  const std::vector<int>& cpus() const noexcept { return cpus_; }
  bool oversubscribed() const noexcept { return oversubscribed_; }

  std::uint64_t memory_budget() const noexcept { return budget_; }  ///< bytes
  std::uint64_t memory_used() const;                                ///< bytes
  std::uint64_t memory_peak() const;                                ///< bytes, highest used so far
  std::uint64_t memory_available() const;                           ///< budget - used, bytes

  /// Accounts `bytes` more; throws OutOfDeviceMemory naming the device,
  /// the request, what is used and the budget when it would not fit.
  void reserve(std::uint64_t bytes, const std::string& what = "allocation");
  /// Returns `bytes`; releasing more than is used is a logic error that
  /// throws ftp::Error (and leaves the accounting unchanged).
  void release(std::uint64_t bytes);
  /// Of memory_used, the bytes of model weights held here (a private copy
  /// of the device's weight shards: ftp-serve --device-memory).
  std::uint64_t memory_weights() const;
  /// reserve and release of weight bytes (counted in memory_weights too).
  void reserve_weights(std::uint64_t bytes, const std::string& what);
  void release_weights(std::uint64_t bytes);

  /// Pins the calling thread to this device's CPUs (sched_setaffinity).
  /// Returns false where the process may not change its affinity (some
  /// containers); the thread then runs unpinned, which is correct but slower.
  bool bind_current_thread() const;

 private:
  int id_;
  int threads_;
  std::vector<int> cpus_;
  bool oversubscribed_;
  std::uint64_t budget_;
  mutable std::mutex mu_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t weights_ = 0;
};

/// Splits the CPUs `cpu_ids` into `n` virtual devices. Threads are divided
/// as evenly as possible (counts differ by at most one), each device getting
/// a contiguous block of CPU ids; memory is divided evenly (the remainder of
/// the division is left unassigned). With n > cpu_ids.size() every device gets one
/// thread and CPUs are shared round-robin (oversubscribed: correct, slower,
/// meant for tests of parallel paths). Throws ftp::InputError if n < 1 or
/// cpu_ids is empty.
std::vector<std::unique_ptr<VirtualDevice>> split_cpu(int n, std::uint64_t total_memory_bytes,
                                                      const std::vector<int>& cpu_ids);

/// split_cpu over this process's usable CPUs and `total_memory_bytes`.
std::vector<std::unique_ptr<VirtualDevice>> split_cpu(int n, std::uint64_t total_memory_bytes);

/// Raises the calling thread's nice value by `delta` (Linux: a thread's
/// own scheduling priority; lower priority, never higher, so no privilege
/// is needed). Returns false where it cannot; the thread then runs as before.
bool lower_current_thread_priority(int delta);

}  // namespace ftp::hardware
