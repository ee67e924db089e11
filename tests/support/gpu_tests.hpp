// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdio>
#include <exception>
#include <vector>

#include "hardware/gpu.hpp"

/// The start of every GPU test program (tests/gpu): plain programs, so that
/// exit 77 is a skip.
namespace ftp::test {

/// Fills `gpus` and returns 0 when at least one GPU is visible. Otherwise
/// prints why and returns the exit code to leave with: 77 (skip) where no
/// GPU is visible, 1 when discovery itself fails.
inline int discover_gpus_or_skip(std::vector<hardware::GpuInfo>& gpus) {
  try {
    gpus = hardware::discover_gpus();
  } catch (const std::exception& e) {
    std::printf("FAIL: discover_gpus: %s\n", e.what());
    return 1;
  }
  if (gpus.empty()) {
    std::printf("SKIP: no GPU found (built with CUDA: %s; %s)\n", hardware::cuda_built() ? "yes" : "no",
                hardware::gpu_runtime_status().c_str());
    return 77;
  }
  return 0;
}

}  // namespace ftp::test
