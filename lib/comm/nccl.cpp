// SPDX-License-Identifier: Apache-2.0
// NCCL all-reduce measurement (built only with CUDA).
#include "comm/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <string>

#include "core/error.hpp"

namespace ftp::comm {
namespace {

void cuda_check(cudaError_t e, const char* call, int device) {
  if (e != cudaSuccess)
    throw BackendError(std::string("nccl all-reduce: ") + call + " on cuda:" + std::to_string(device) + ": " +
                       cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) throw BackendError(std::string("nccl all-reduce: ") + call + ": " + ncclGetErrorString(r));
}

/// Everything created for one measurement, released in every exit path.
struct Resources {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<float*> buffers;
  ~Resources() {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      cudaSetDevice(devices[i]);
      if (i < buffers.size() && buffers[i]) cudaFree(buffers[i]);
      if (i < streams.size() && streams[i]) cudaStreamDestroy(streams[i]);
    }
    for (auto c : comms)
      if (c) ncclCommDestroy(c);
  }
};

}  // namespace

bool nccl_available() noexcept { return true; }

AllReduceMeasurement measure_nccl_allreduce(const std::vector<int>& devices, std::size_t bytes, bool quick) {
  if (devices.empty()) throw InputError("nccl all-reduce: no device given");
  const std::size_t count = bytes / sizeof(float);
  if (count == 0) throw InputError("nccl all-reduce: bytes must be >= 4, got " + std::to_string(bytes));
  const int n = static_cast<int>(devices.size());
  Resources res;
  res.devices = devices;
  res.streams.assign(n, nullptr);
  res.buffers.assign(n, nullptr);
  for (int i = 0; i < n; ++i) {
    cuda_check(cudaSetDevice(devices[i]), "cudaSetDevice", devices[i]);
    cuda_check(cudaStreamCreateWithFlags(&res.streams[i], cudaStreamNonBlocking), "cudaStreamCreate", devices[i]);
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&res.buffers[i]), count * sizeof(float)), "cudaMalloc",
               devices[i]);
    // Zeros: sums stay finite however many iterations run.
    cuda_check(cudaMemset(res.buffers[i], 0, count * sizeof(float)), "cudaMemset", devices[i]);
  }
  std::vector<ncclComm_t> comms(n, nullptr);
  nccl_check(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  res.comms = comms;

  auto run = [&](int iters) {
    for (int it = 0; it < iters; ++it) {
      nccl_check(ncclGroupStart(), "ncclGroupStart");
      for (int i = 0; i < n; ++i)
        nccl_check(ncclAllReduce(res.buffers[i], res.buffers[i], count, ncclFloat, ncclSum, res.comms[i],
                                 res.streams[i]),
                   "ncclAllReduce");
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    }
    for (int i = 0; i < n; ++i) {
      cuda_check(cudaSetDevice(devices[i]), "cudaSetDevice", devices[i]);
      cuda_check(cudaStreamSynchronize(res.streams[i]), "cudaStreamSynchronize", devices[i]);
    }
  };
  run(5);
  AllReduceMeasurement m;
  m.n_ranks = n;
  m.bytes = count * sizeof(float);
  m.iterations = quick ? 20 : 100;
  m.method = "nccl float32 sum, single process, ncclCommInitAll";
  auto t0 = std::chrono::steady_clock::now();
  run(m.iterations);
  finish_allreduce_measurement(m, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return m;
}

}  // namespace ftp::comm
