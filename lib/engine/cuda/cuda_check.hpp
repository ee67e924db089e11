// SPDX-License-Identifier: Apache-2.0
// Status checks of the CUDA backend: every failure becomes ftp::BackendError.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace ftp::engine::cuda {

/// Throws ftp::BackendError "<where>: <call>: <error name> (<text>)" unless e is cudaSuccess.
void check(cudaError_t e, const char* call, const std::string& where);
/// Throws ftp::BackendError "<where>: <call>: <status name> (<n>)" unless s is CUBLAS_STATUS_SUCCESS.
void check(cublasStatus_t s, const char* call, const std::string& where);

/// Makes `device` current on this thread for its lifetime, restoring the
/// previous one after.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& where);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace ftp::engine::cuda
