// SPDX-License-Identifier: Apache-2.0
// GPU entry points of a build without CUDA: no devices, and measurements
// that say why they cannot run.
#include "hardware/gpu.hpp"

#include "core/error.hpp"

namespace ftp::hardware {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw BackendError(std::string(what) + ": flextp was built without CUDA (meson -Dcuda=disabled or no toolkit found)");
}

}  // namespace

bool cuda_built() noexcept { return false; }
std::vector<GpuInfo> discover_gpus() { return {}; }
std::string gpu_runtime_status() { return "built without CUDA"; }
std::vector<std::vector<bool>> gpu_p2p_matrix(const std::vector<int>&) { return {}; }
Measurement measure_gpu_gemm_tflops(int, bool) { no_cuda("gpu gemm"); }
Measurement measure_gpu_triad_gbs(int, bool) { no_cuda("gpu triad"); }
void gpu_triad(int, float*, const float*, const float*, float, std::size_t) { no_cuda("gpu triad"); }

}  // namespace ftp::hardware
