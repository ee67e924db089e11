// SPDX-License-Identifier: Apache-2.0
// NCCL entry points of a build without CUDA.
#include "comm/nccl.hpp"

#include "core/error.hpp"

namespace ftp::comm {

bool nccl_available() noexcept { return false; }

AllReduceMeasurement measure_nccl_allreduce(const std::vector<int>&, std::size_t, bool) {
  throw BackendError("nccl all-reduce: flextp was built without CUDA (meson -Dcuda=disabled or no toolkit found)");
}

NcclPool& NcclPool::instance() {
  throw BackendError("nccl pool: flextp was built without CUDA (meson -Dcuda=disabled or no toolkit found)");
}
NcclPool::NcclPool() = default;
NcclPool::~NcclPool() = default;
int NcclPool::n_devices() const { return 0; }
std::vector<int> NcclPool::devices() const { return {}; }
double NcclPool::create_ms() const { return 0.0; }
double NcclPool::span(const std::vector<int>&) { return 0.0; }
std::vector<void*> NcclPool::group(const std::vector<int>&) { return {}; }
void NcclPool::release(const std::vector<int>&) noexcept {}
double NcclPool::prepare(const std::vector<std::vector<int>>&) { return 0.0; }
std::uint64_t NcclPool::communicators_made() const { return 0; }
double NcclPool::made_ms() const { return 0.0; }
void NcclPool::drop(const std::vector<int>&) noexcept {}
std::vector<void*> NcclPool::split_locked(const std::vector<int>&) { return {}; }
double NcclPool::span_locked(const std::vector<int>&) { return 0.0; }
void nccl_all_reduce_sum(void*, float*, std::size_t, void*, int) {
  throw BackendError("nccl all-reduce: flextp was built without CUDA");
}

void nccl_gather_columns(void*, int, const float*, std::size_t, std::span<const std::size_t>, float*, float*, void*,
                         int) {
  throw BackendError("nccl gather: flextp was built without CUDA");
}

}  // namespace ftp::comm
