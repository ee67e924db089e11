// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "doc/control.hpp"

/// GPU signals from NVML (the driver's libnvml.so.1, opened with dlopen:
/// no link-time dependency, so builds and CI without a driver are
/// unaffected): per-GPU utilization and memory, what other processes hold
/// and compute on it, ECC and lost-GPU events (issue 17).
namespace ftp::hardware::nvml {

/// The part of NVML's C ABI used here, as nvml.h declares it (nvml.h is
/// not in the CUDA toolkit of every machine that builds this).
using Device = struct DeviceOpaque*;  ///< nvmlDevice_t
enum Return : int {                   ///< nvmlReturn_t values read here
  success = 0,
  not_supported = 3,
  insufficient_size = 7,
  not_found = 6,
  gpu_is_lost = 15,
};
struct Utilization {  ///< nvmlUtilization_t
  unsigned int gpu;     ///< percent
  unsigned int memory;  ///< percent
};
struct Memory {  ///< nvmlMemory_t
  unsigned long long total, free, used;  ///< bytes
};
struct ProcessInfo {  ///< nvmlProcessInfo_t (v2, what ..._v3 fills)
  unsigned int pid;
  unsigned long long used_gpu_memory;  ///< bytes; kValueNotAvailable when unknown
  unsigned int gpu_instance_id, compute_instance_id;
};
struct ProcessUtilizationSample {  ///< nvmlProcessUtilizationSample_t
  unsigned int pid;
  unsigned long long time_stamp;  ///< microseconds
  unsigned int sm_util, mem_util, enc_util, dec_util;  ///< percent
};
constexpr unsigned long long kValueNotAvailable = ~0ull;  ///< NVML_VALUE_NOT_AVAILABLE

/// The entry points, as a table: open() fills it from libnvml.so.1, tests
/// from a fake NVML.
struct Api {
  int (*init)() = nullptr;                                   ///< nvmlInit_v2
  int (*shutdown)() = nullptr;                               ///< nvmlShutdown
  const char* (*error_string)(int) = nullptr;                ///< nvmlErrorString
  int (*device_count)(unsigned int*) = nullptr;              ///< nvmlDeviceGetCount_v2
  int (*handle_by_index)(unsigned int, Device*) = nullptr;   ///< nvmlDeviceGetHandleByIndex_v2
  int (*uuid)(Device, char*, unsigned int) = nullptr;        ///< nvmlDeviceGetUUID
  int (*utilization)(Device, Utilization*) = nullptr;        ///< nvmlDeviceGetUtilizationRates
  int (*memory)(Device, Memory*) = nullptr;                  ///< nvmlDeviceGetMemoryInfo
  int (*compute_processes)(Device, unsigned int*, ProcessInfo*) = nullptr;  ///< nvmlDeviceGetComputeRunningProcesses_v3
  int (*process_utilization)(Device, ProcessUtilizationSample*, unsigned int*,
                             unsigned long long) = nullptr;  ///< nvmlDeviceGetProcessUtilization
  /// nvmlDeviceGetTotalEccErrors(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0, &count)
  int (*total_ecc_errors)(Device, int, int, unsigned long long*) = nullptr;
};

/// Samples every GPU NVML sees. Thread-safe.
class GpuSignals {
 public:
  /// Opens libnvml.so.1 (dlopen) and initializes NVML. Never throws: where
  /// that fails, unavailable() says why and sample() returns nothing.
  static std::unique_ptr<GpuSignals> open();
  /// Over `api` (tests: a fake); `self_pid`: this process, whose memory
  /// and compute are not "other". Calls api.init.
  GpuSignals(const Api& api, unsigned int self_pid, void* library = nullptr);
  ~GpuSignals();
  GpuSignals(const GpuSignals&) = delete;
  GpuSignals& operator=(const GpuSignals&) = delete;

  /// "" when NVML answers; else why not ("dlopen libnvml.so.1: ...",
  /// "nvmlInit: Driver Not Loaded").
  std::string unavailable() const;

  /// One sample of every GPU: `ids` maps a GPU's uuid to the device pool's
  /// id (a GPU not in it gets "nvml<index>"). A GPU whose calls say it is
  /// lost, or that has uncorrected ECC errors, comes back with available
  /// false and why. A signal NVML does not support on a GPU is 0. Other
  /// processes' compute is their SM share of the samples since the last
  /// call (the first call: NVML's own recent window).
  std::vector<doc::GpuLoad> sample(const std::map<std::string, std::string>& ids);

 private:
  Api api_;
  unsigned int self_pid_;
  void* library_;  // dlopen handle, or null
  std::string unavailable_;
  mutable std::mutex mu_;
  std::map<unsigned int, unsigned long long> last_seen_;  // NVML index -> last process sample time, us
};

}  // namespace ftp::hardware::nvml
