// SPDX-License-Identifier: Apache-2.0
// NCCL entry points of a build without CUDA.
#include "comm/nccl.hpp"

#include "core/error.hpp"

namespace ftp::comm {

bool nccl_available() noexcept { return false; }

AllReduceMeasurement measure_nccl_allreduce(const std::vector<int>&, std::size_t, bool) {
  throw BackendError("nccl all-reduce: flextp was built without CUDA (meson -Dcuda=disabled or no toolkit found)");
}

}  // namespace ftp::comm
