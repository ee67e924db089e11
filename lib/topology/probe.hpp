// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "doc/topology.hpp"

namespace ftp::topology {

/// What ftp-probe measures on this machine.
struct ProbeOptions {
  /// Split the CPU into this many virtual devices (0: one "cpu0" device).
  int virtual_devices = 0;
  /// Short measurements (smaller GEMMs and arrays, fewer repetitions).
  bool quick = false;
  /// Include CUDA devices when the build has CUDA and the runtime finds some.
  bool gpus = true;
  /// Called with a line of progress for people (ftp-probe shows it on a TTY).
  std::function<void(std::string_view)> progress;
};

/// Discovers this machine's devices (the CPU, or N CPU virtual devices, and
/// every CUDA device), measures each one (GEMM TFLOP/s, triad GB/s), groups
/// them into islands and measures each island's all-reduce (inproc for
/// virtual devices, NCCL for GPUs). Returns a validated topology
/// (source "probe"). Throws ftp::BackendError when a measurement fails.
doc::Topology probe_local(const ProbeOptions& options);

/// Reads a cluster spec file (ftp.cluster/v1, "-" for stdin) and turns it into
/// a topology; errors name the file and the JSON path (exit code 2).
doc::Topology topology_from_cluster_file(const std::string& path);

}  // namespace ftp::topology
