// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <vector>

#include "comm/bus_bandwidth.hpp"

namespace ftp::comm {

/// True when this build has NCCL (built with CUDA).
bool nccl_available() noexcept;

/// Measures NCCL all-reduce (float32 sum, in place) of `bytes` per GPU over
/// the CUDA devices `devices`, from one thread of this process:
/// ncclCommInitAll, one stream per device, each iteration one
/// ncclGroupStart/End over all devices. 5 warm-up iterations, then 20
/// (quick) or 100 timed ones, wall time from the launch of the first to the
/// end of the last on every stream. See AllReduceMeasurement for busbw.
/// Throws ftp::BackendError naming the failed CUDA/NCCL call (also when
/// built without CUDA), ftp::InputError for an empty device list.
AllReduceMeasurement measure_nccl_allreduce(const std::vector<int>& devices, std::size_t bytes, bool quick);

}  // namespace ftp::comm
