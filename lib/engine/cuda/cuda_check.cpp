// SPDX-License-Identifier: Apache-2.0
#include "engine/cuda/cuda_check.hpp"

#include "core/error.hpp"

namespace ftp::engine::cuda {

void check(cudaError_t e, const char* call, const std::string& where) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that the domain can be torn down
  throw BackendError(where + ": " + call + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void check(cublasStatus_t s, const char* call, const std::string& where) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw BackendError(where + ": " + call + ": " + cublasGetStatusName(s) + " (" + std::to_string(static_cast<int>(s)) +
                     ")");
}

DeviceGuard::DeviceGuard(int device, const std::string& where) {
  check(cudaGetDevice(&prev_), "cudaGetDevice", where);
  if (prev_ != device) check(cudaSetDevice(device), "cudaSetDevice", where);
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

}  // namespace ftp::engine::cuda
