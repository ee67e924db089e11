// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ftp::hardware {

/// What this machine's CPU offers to this process.
struct CpuInfo {
  std::string model;                  ///< "model name" of /proc/cpuinfo ("unknown" if absent)
  int sockets = 1;                    ///< distinct physical ids (1 if unknown)
  int physical_cores = 1;             ///< distinct (physical id, core id) pairs; logical_cpus if unknown
  int logical_cpus = 1;               ///< online logical CPUs of the machine (sysconf)
  int usable_cpus = 1;                ///< CPUs this process may run on (sched_getaffinity)
  std::vector<int> usable_cpu_ids;    ///< their ids, ascending
  int numa_nodes = 1;                 ///< nodes under /sys/devices/system/node (1 if none)
  std::uint64_t memory_bytes = 0;     ///< MemTotal of /proc/meminfo, bytes
  std::uint64_t available_bytes = 0;  ///< MemAvailable of /proc/meminfo, bytes
  /// MemTotal of each NUMA node, bytes; one entry holding memory_bytes when
  /// the node files are absent (containers without /sys).
  std::vector<std::uint64_t> numa_memory_bytes;
  std::string hostname;
};

/// Reads /proc/cpuinfo, /proc/meminfo, /sys/devices/system/node, sysconf and
/// sched_getaffinity. Files missing in a container fall back to sysconf values
/// and a single NUMA node; it never throws for missing files. Throws
/// ftp::BackendError only if no CPU count at all can be found.
CpuInfo discover_cpu();

/// CPU ids this process may run on (sched_getaffinity), ascending; falls back
/// to 0..n-1 with n from sysconf if the call fails.
std::vector<int> usable_cpu_ids();

}  // namespace ftp::hardware
