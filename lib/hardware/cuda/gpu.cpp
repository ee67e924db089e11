// SPDX-License-Identifier: Apache-2.0
// GPU discovery and measurement with the CUDA runtime and cuBLAS.
#include "hardware/gpu.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "core/error.hpp"
#include "kernels/triad.cuh"


namespace ftp::hardware {
namespace {

void cuda_check(cudaError_t e, const char* call, const char* what, int device) {
  if (e != cudaSuccess)
    throw BackendError(std::string(what) + ": " + call + " on cuda:" + std::to_string(device) + ": " +
                       cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cublas status";
  }
}

void cublas_check(cublasStatus_t s, const char* call, int device) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw BackendError(std::string("gpu gemm: ") + call + " on cuda:" + std::to_string(device) + ": " +
                       cublas_status_name(s) + " (" + std::to_string(static_cast<int>(s)) + ")");
}

/// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t bytes, const char* what, int device) {
    cuda_check(cudaMalloc(&p_, bytes), "cudaMalloc", what, device);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

/// Two CUDA events, destroyed on scope exit.
struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events(const char* what, int device) {
    cuda_check(cudaEventCreate(&start), "cudaEventCreate", what, device);
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate", what, device);
  }
  ~Events() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

/// Times `reps` runs of `body` with CUDA events: the best and mean rate of
/// `work` units per run, divided by `scale` (1e12: TFLOP/s, 1e9: GB/s).
Measurement time_reps(int device, const char* what, int reps, double work, double scale, std::string unit,
                      std::string method, const std::function<void()>& body) {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", what, device);
  Events ev(what, device);
  double best = 0, total = 0;
  for (int r = 0; r < reps; ++r) {
    cuda_check(cudaEventRecord(ev.start), "cudaEventRecord", what, device);
    body();
    cuda_check(cudaEventRecord(ev.stop), "cudaEventRecord", what, device);
    cuda_check(cudaEventSynchronize(ev.stop), "cudaEventSynchronize", what, device);
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime", what, device);
    total += ms / 1e3;
    best = std::max(best, work / (ms / 1e3) / scale);
  }
  Measurement m;
  m.unit = std::move(unit);
  m.value = best;
  m.mean = work * reps / total / scale;
  m.seconds = total;
  m.repetitions = reps;
  m.method = std::move(method);
  return m;
}

std::string format_uuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[64];
  std::snprintf(s, sizeof(s), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

void select(int device, const char* what) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();  // clear the sticky-free error of a failed count
    throw BackendError(std::string(what) + ": no CUDA device " + std::to_string(device) + " (" +
                       std::to_string(count) + " visible)");
  }
  cuda_check(cudaSetDevice(device), "cudaSetDevice", what, device);
}

}  // namespace

bool cuda_built() noexcept { return true; }

std::string gpu_runtime_status() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  return std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s");
}

std::vector<GpuInfo> discover_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver, no device, or a driver older than the runtime: no GPU.
    cudaGetLastError();
    return {};
  }
  std::vector<GpuInfo> gpus;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties", "gpu discovery", d);
    GpuInfo g;
    g.index = d;
    g.name = prop.name;
    g.uuid = format_uuid(prop.uuid);
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), d) == cudaSuccess) g.pci_bus_id = bus;
    g.memory_bytes = prop.totalGlobalMem;
    g.sm_count = prop.multiProcessorCount;
    g.cc_major = prop.major;
    g.cc_minor = prop.minor;
    g.is_mig = g.name.find(" MIG ") != std::string::npos;
    if (g.is_mig) g.uuid.replace(0, 3, "MIG");
    std::size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(d) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) g.free_bytes = free_b;
    cudaGetLastError();
    gpus.push_back(std::move(g));
  }
  return gpus;
}

std::vector<std::vector<bool>> gpu_p2p_matrix(const std::vector<int>& devices) {
  const std::size_t n = devices.size();
  std::vector<std::vector<bool>> p2p(n, std::vector<bool>(n, false));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) {
        p2p[i][j] = true;
        continue;
      }
      int can = 0;
      cuda_check(cudaDeviceCanAccessPeer(&can, devices[i], devices[j]), "cudaDeviceCanAccessPeer", "gpu p2p",
                 devices[i]);
      p2p[i][j] = can != 0;
    }
  }
  return p2p;
}

Measurement measure_gpu_gemm_tflops(int device, bool quick) {
  const char* what = "gpu gemm";
  select(device, what);
  const int n = quick ? 4096 : 8192;
  const int warmups = 3, reps = quick ? 10 : 50;
  const std::size_t elems = static_cast<std::size_t>(n) * n;
  DeviceBuffer a(elems * 2, what, device), b(elems * 2, what, device), c(elems * 2, what, device);
  // Non-zero inputs: all-zero matrices draw less power and flatter the clock.
  std::vector<__nv_bfloat16> host(elems);
  for (std::size_t i = 0; i < elems; ++i) host[i] = __float2bfloat16(static_cast<float>((i * 7 + 3) % 17) * 0.0625f - 0.5f);
  cuda_check(cudaMemcpy(a.as<void>(), host.data(), elems * 2, cudaMemcpyHostToDevice), "cudaMemcpy", what, device);
  cuda_check(cudaMemcpy(b.as<void>(), host.data(), elems * 2, cudaMemcpyHostToDevice), "cudaMemcpy", what, device);
  host.clear();
  host.shrink_to_fit();

  cublasHandle_t handle = nullptr;
  cublas_check(cublasCreate(&handle), "cublasCreate", device);
  struct HandleGuard {
    cublasHandle_t h;
    ~HandleGuard() { cublasDestroy(h); }
  } guard{handle};
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    cublas_check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.as<void>(), CUDA_R_16BF, n,
                              b.as<void>(), CUDA_R_16BF, n, &beta, c.as<void>(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx", device);
  };
  for (int i = 0; i < warmups; ++i) gemm();
  return time_reps(device, what, reps, 2.0 * n * static_cast<double>(n) * n, 1e12, "TFLOP/s",
                   "cublasGemmEx bf16 in/out fp32 accumulate m=n=k=" + std::to_string(n), gemm);
}

Measurement measure_gpu_triad_gbs(int device, bool quick) {
  const char* what = "gpu triad";
  select(device, what);
  std::size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", what, device);
  std::size_t bytes_each = quick ? (std::size_t{256} << 20) : (std::size_t{1} << 30);
  // Leave a quarter of free memory to others (MIG slices, shared GPUs).
  bytes_each = std::min(bytes_each, free_b / 4 / 4096 * 4096);
  const std::size_t n = bytes_each / sizeof(float);
  if (n < (std::size_t{1} << 20))
    throw BackendError("gpu triad: cuda:" + std::to_string(device) + " has only " + std::to_string(free_b) +
                       " bytes free");
  DeviceBuffer a(n * 4, what, device), b(n * 4, what, device), c(n * 4, what, device);
  cuda_check(cudaMemset(a.as<void>(), 0, n * 4), "cudaMemset", what, device);
  cuda_check(cudaMemset(b.as<void>(), 0, n * 4), "cudaMemset", what, device);
  cuda_check(cudaMemset(c.as<void>(), 0, n * 4), "cudaMemset", what, device);
  const int reps = quick ? 10 : 30;
  auto pass = [&] {
    cuda_check(kernels::triad_f32(a.as<float>(), b.as<float>(), c.as<float>(), 3.0f, n, nullptr), "triad_f32",
               what, device);
  };
  for (int i = 0; i < 2; ++i) pass();
  return time_reps(device, what, reps, 3.0 * 4.0 * static_cast<double>(n), 1e9, "GB/s",
                   "triad fp32 kernels/triad.cu 3x" + std::to_string(n * 4 >> 20) + " MiB bytes=3*4*N", pass);
}

void gpu_triad(int device, float* a, const float* b, const float* c, float scalar, std::size_t n) {
  const char* what = "gpu triad";
  select(device, what);
  if (n == 0) return;
  DeviceBuffer da(n * 4, what, device), db(n * 4, what, device), dc(n * 4, what, device);
  cuda_check(cudaMemcpy(db.as<void>(), b, n * 4, cudaMemcpyHostToDevice), "cudaMemcpy", what, device);
  cuda_check(cudaMemcpy(dc.as<void>(), c, n * 4, cudaMemcpyHostToDevice), "cudaMemcpy", what, device);
  cuda_check(kernels::triad_f32(da.as<float>(), db.as<float>(), dc.as<float>(), scalar, n, nullptr), "triad_f32",
             what, device);
  cuda_check(cudaMemcpy(a, da.as<void>(), n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy", what, device);
}

}  // namespace ftp::hardware
