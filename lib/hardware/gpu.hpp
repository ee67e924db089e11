// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hardware/measurement.hpp"

namespace ftp::hardware {

/// One CUDA device as the CUDA runtime exposes it: a whole GPU or a MIG
/// slice. The runtime only shows MIG slices named in CUDA_VISIBLE_DEVICES
/// (MIG-<uuid>), and at most one slice per process unless that lists more.
struct GpuInfo {
  int index = 0;                  ///< CUDA device ordinal in this process
  std::string name;               ///< e.g. "NVIDIA H100 80GB HBM3"
  std::string uuid;               ///< "GPU-xxxxxxxx-..." (the MIG slice's own uuid when is_mig)
  std::string pci_bus_id;         ///< "0000:17:00.0"
  std::uint64_t memory_bytes = 0; ///< total device memory, bytes
  std::uint64_t free_bytes = 0;   ///< free at discovery (cudaMemGetInfo), bytes; 0 if unknown
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  bool is_mig = false;            ///< the name carries " MIG " (no NVML: heuristic)
  /// The physical GPU's uuid of a MIG slice. Empty: the CUDA runtime does not
  /// tell it without NVML; slices of one GPU share pci_bus_id instead.
  std::string parent_uuid;
};

/// True when this build has the CUDA backend.
bool cuda_built() noexcept;

/// CUDA devices of this process; empty when built without CUDA or when the
/// runtime finds none (no driver, no device, CUDA_VISIBLE_DEVICES empty).
/// Never throws for "no GPU"; throws ftp::BackendError if a device that the
/// runtime counted cannot be queried.
std::vector<GpuInfo> discover_gpus();

/// Why discover_gpus() found what it found, for reports and skip messages:
/// "built without CUDA", "cudaGetDeviceCount: no CUDA-capable device is
/// detected", or "2 CUDA devices".
std::string gpu_runtime_status();

/// p2p[i][j]: device devices[i] can access devices[j]'s memory directly
/// (cudaDeviceCanAccessPeer); the diagonal is true. Empty when built without CUDA.
std::vector<std::vector<bool>> gpu_p2p_matrix(const std::vector<int>& devices);

/// cuBLAS GEMM rate of one device: BF16 inputs and output with FP32
/// accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), square m = n = k (4096
/// with `quick`, 8192 otherwise), 2 m n k flops, timed with CUDA events;
/// 3 warm-ups, then 10 (quick) or 50 repetitions. Throws ftp::BackendError.
Measurement measure_gpu_gemm_tflops(int device, bool quick);

/// Triad a[i] = b[i] + s * c[i] over floats with kernels/triad.cu, arrays of
/// 256 MiB (quick) or 1 GiB each, smaller when the device has less than four
/// times that free. Bytes counted 3 x 4 x N per pass; best of 10 (quick) or
/// 30 passes after warm-up, timed with CUDA events. Throws ftp::BackendError.
Measurement measure_gpu_triad_gbs(int device, bool quick);

/// Runs the triad kernel on `device` over host arrays of n floats (copied
/// in and out): a = b + scalar * c. For tests of the kernel against the CPU.
void gpu_triad(int device, float* a, const float* b, const float* c, float scalar, std::size_t n);

}  // namespace ftp::hardware
