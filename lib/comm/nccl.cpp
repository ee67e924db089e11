// SPDX-License-Identifier: Apache-2.0
// NCCL all-reduce measurement (built only with CUDA).
#include "comm/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
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

namespace {

std::string set_name(const std::vector<int>& devices) {
  std::string s = "[";
  for (std::size_t i = 0; i < devices.size(); ++i) s += (i ? "," : "") + std::to_string(devices[i]);
  return s + "]";
}

void pool_check(ncclResult_t r, const char* call, const std::string& where) {
  if (r != ncclSuccess)
    throw BackendError("nccl pool: " + std::string(call) + " for devices " + where + ": " + ncclGetErrorString(r));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

NcclPool& NcclPool::instance() {
  // Never destroyed: at process exit the CUDA runtime may already be torn
  // down, and destroying communicators then can crash or hang.
  static NcclPool* pool = new NcclPool();
  return *pool;
}

NcclPool::NcclPool() {
  // Counting devices makes no context; the root waits for span() or group().
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    cudaGetLastError();
    throw BackendError("nccl pool: no CUDA device visible");
  }
  visible_ = count;
}

namespace {

void destroy_all(std::vector<void*>& comms) noexcept {
  for (void* c : comms)
    if (c) ncclCommDestroy(static_cast<ncclComm_t>(c));
  comms.clear();
}

/// Checks a device set: distinct ordinals of visible GPUs.
void check_set(const std::vector<int>& devices, int visible, const char* what) {
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw InputError("nccl pool: " + std::string(what) + " " + set_name(devices) +
                     " repeat a GPU (ranks on one GPU use the same-GPU communicator)");
  for (int d : devices)
    if (d < 0 || d >= visible)
      throw InputError("nccl pool: device " + std::to_string(d) + " of " + what + " " + set_name(devices) +
                       " is not one of the " + std::to_string(visible) + " visible GPUs");
}

}  // namespace

NcclPool::~NcclPool() {
  // At process exit: the driver may already be gone; errors are ignored.
  for (auto& [set, g] : groups_) destroy_all(g.comms);
  destroy_all(roots_);
}

int NcclPool::n_devices() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(devices_.size());
}

std::vector<int> NcclPool::devices() const {
  std::lock_guard lk(mu_);
  return devices_;
}

double NcclPool::create_ms() const {
  std::lock_guard lk(mu_);
  return create_ms_;
}

double NcclPool::span(const std::vector<int>& devices) {
  std::lock_guard lk(mu_);
  return span_locked(devices);
}

double NcclPool::span_locked(const std::vector<int>& want) {
  check_set(want, visible_, "the root's devices");
  std::vector<int> set = want;
  std::sort(set.begin(), set.end());
  if (set == devices_) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ncclComm_t> comms(set.size(), nullptr);
  if (!set.empty()) pool_check(ncclCommInitAll(comms.data(), static_cast<int>(set.size()), set.data()), "ncclCommInitAll", set_name(set));
  // The new root is there: the old one goes (its splits do not need it).
  destroy_all(roots_);
  for (auto c : comms) roots_.push_back(c);
  devices_ = set;
  create_ms_ = ms_since(t0);
  made_ += set.size();
  made_ms_ += create_ms_;
  // Sets outside the new root that no stage holds go now; held ones when let go.
  auto inside = [this](const std::vector<int>& s) {
    return std::all_of(s.begin(), s.end(), [this](int d) { return std::binary_search(devices_.begin(), devices_.end(), d); });
  };
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.holders == 0 && !inside(it->first)) {
      destroy_all(it->second.comms);
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
  return create_ms_;
}

std::vector<void*> NcclPool::split_locked(const std::vector<int>& devices) {
  if (auto it = groups_.find(devices); it != groups_.end()) return it->second.comms;
  check_set(devices, visible_, "devices");
  // A set outside the root (a stage built without prepare): the root widens.
  std::vector<int> want = devices_;
  for (int d : devices)
    if (!std::binary_search(devices_.begin(), devices_.end(), d)) want.push_back(d);
  if (want.size() != devices_.size()) span_locked(want);
  // Every root communicator takes part; those outside the set get no
  // communicator (NCCL_SPLIT_NOCOLOR). Key = rank in the set.
  std::vector<ncclComm_t> out(roots_.size(), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  pool_check(ncclGroupStart(), "ncclGroupStart", set_name(devices));
  for (std::size_t i = 0; i < roots_.size(); ++i) {
    auto pos = std::find(devices.begin(), devices.end(), devices_[i]);
    const bool in = pos != devices.end();
    ncclResult_t r = ncclCommSplit(static_cast<ncclComm_t>(roots_[i]), in ? 0 : NCCL_SPLIT_NOCOLOR,
                                   in ? static_cast<int>(pos - devices.begin()) : 0, &out[i], nullptr);
    if (r != ncclSuccess) {
      ncclGroupEnd();
      pool_check(r, "ncclCommSplit", set_name(devices));
    }
  }
  pool_check(ncclGroupEnd(), "ncclGroupEnd (ncclCommSplit)", set_name(devices));
  std::vector<void*> comms(devices.size(), nullptr);
  for (std::size_t i = 0; i < roots_.size(); ++i) {
    auto pos = std::find(devices.begin(), devices.end(), devices_[i]);
    if (pos != devices.end()) comms[static_cast<std::size_t>(pos - devices.begin())] = out[i];
  }
  groups_[devices].comms = comms;
  made_ += devices.size();
  made_ms_ += ms_since(t0);
  return comms;
}

std::uint64_t NcclPool::communicators_made() const {
  std::lock_guard lk(mu_);
  return made_;
}

double NcclPool::made_ms() const {
  std::lock_guard lk(mu_);
  return made_ms_;
}

std::vector<void*> NcclPool::group(const std::vector<int>& devices) {
  if (devices.empty()) throw InputError("nccl pool: an empty device set");
  std::lock_guard lk(mu_);
  std::vector<void*> comms = split_locked(devices);
  ++groups_[devices].holders;
  return comms;
}

void NcclPool::release(const std::vector<int>& devices) noexcept {
  std::lock_guard lk(mu_);
  auto it = groups_.find(devices);
  if (it == groups_.end() || --it->second.holders > 0) return;
  // Let go by its last stage: kept while the root spans it, for the next one.
  const bool inside = std::all_of(devices.begin(), devices.end(), [this](int d) {
    return std::binary_search(devices_.begin(), devices_.end(), d);
  });
  if (inside) return;
  destroy_all(it->second.comms);
  groups_.erase(it);
}

double NcclPool::prepare(const std::vector<std::vector<int>>& sets) {
  std::lock_guard lk(mu_);
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : sets)
    if (s.size() > 1) split_locked(s);
  return ms_since(t0);
}

void NcclPool::drop(const std::vector<int>& devices) noexcept {
  std::lock_guard lk(mu_);
  auto it = groups_.find(devices);
  if (it == groups_.end()) return;  // root communicators stay (they serve every split)
  for (void* c : it->second.comms)
    if (c) ncclCommAbort(static_cast<ncclComm_t>(c));
  groups_.erase(it);
}

void nccl_all_reduce_sum(void* comm, float* data, std::size_t count, void* stream, int device) {
  ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat, ncclSum, static_cast<ncclComm_t>(comm),
                                 static_cast<cudaStream_t>(stream));
  if (r != ncclSuccess)
    throw BackendError("nccl all-reduce on cuda:" + std::to_string(device) + ": ncclAllReduce: " + ncclGetErrorString(r));
}

void nccl_gather_columns(void* comm, int rank, const float* slice, std::size_t rows,
                         std::span<const std::size_t> widths, float* full, float* staging, void* stream, int device) {
  const std::string where = "nccl gather on cuda:" + std::to_string(device) + " rank " + std::to_string(rank);
  const int n = static_cast<int>(widths.size());
  if (rank < 0 || rank >= n)
    throw InputError(where + ": rank out of range for " + std::to_string(n) + " widths");
  auto* c = static_cast<ncclComm_t>(comm);
  auto* s = static_cast<cudaStream_t>(stream);
  auto nccl = [&](ncclResult_t r, const char* call) {
    if (r != ncclSuccess) throw BackendError(where + ": " + call + ": " + ncclGetErrorString(r));
  };
  auto cuda = [&](cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw BackendError(where + ": " + call + ": " + cudaGetErrorString(e));
  };
  std::size_t ld = 0;
  for (std::size_t w : widths) ld += w;
  const std::size_t w = widths[static_cast<std::size_t>(rank)];
  if (rank != 0) {
    if (rows * w > 0) nccl(ncclSend(slice, rows * w, ncclFloat, 0, c, s), "ncclSend");
    return;
  }
  if (rows > 1 && !staging && ld > w) throw InputError(where + ": no staging buffer for " + std::to_string(rows) + " rows");
  // Rank 0's own slice first (ordered before the receives on the stream).
  if (rows * w > 0 && slice != full)
    cuda(cudaMemcpy2DAsync(full, ld * sizeof(float), slice, w * sizeof(float), w * sizeof(float), rows,
                           cudaMemcpyDeviceToDevice, s),
         "cudaMemcpy2DAsync (own slice)");
  if (n == 1) return;
  nccl(ncclGroupStart(), "ncclGroupStart");
  std::size_t c0 = w;
  for (int r = 1; r < n; ++r) {
    const std::size_t wr = widths[static_cast<std::size_t>(r)];
    if (rows * wr > 0) {
      float* dst = rows == 1 ? full + c0 : staging + rows * (c0 - w);
      const ncclResult_t res = ncclRecv(dst, rows * wr, ncclFloat, r, c, s);
      if (res != ncclSuccess) {
        ncclGroupEnd();
        nccl(res, "ncclRecv");
      }
    }
    c0 += wr;
  }
  nccl(ncclGroupEnd(), "ncclGroupEnd");
  if (rows == 1) return;
  c0 = w;
  for (int r = 1; r < n; ++r) {
    const std::size_t wr = widths[static_cast<std::size_t>(r)];
    if (wr > 0)
      cuda(cudaMemcpy2DAsync(full + c0, ld * sizeof(float), staging + rows * (c0 - w), wr * sizeof(float),
                             wr * sizeof(float), rows, cudaMemcpyDeviceToDevice, s),
           "cudaMemcpy2DAsync (peer slice)");
    c0 += wr;
  }
}

}  // namespace ftp::comm
