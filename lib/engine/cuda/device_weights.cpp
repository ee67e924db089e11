// SPDX-License-Identifier: Apache-2.0
#include "engine/cuda/device_weights.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <unordered_set>

#include "core/error.hpp"
#include "engine/cuda/cuda_check.hpp"

namespace ftp::engine::cuda {
namespace {

std::mutex g_registry_mu;
std::map<std::pair<const WeightStore*, int>, std::weak_ptr<DeviceWeights>> g_registry;

bool kernel_dtype_of(model::DType d, kernels::WeightDType& out) {
  switch (d) {
    case model::DType::f32: out = kernels::WeightDType::f32; return true;
    case model::DType::f16: out = kernels::WeightDType::f16; return true;
    case model::DType::bf16: out = kernels::WeightDType::bf16; return true;
    case model::DType::q8_0: out = kernels::WeightDType::q8_0; return true;
    case model::DType::q4_0: out = kernels::WeightDType::q4_0; return true;
    case model::DType::q4_1: out = kernels::WeightDType::q4_1; return true;
    case model::DType::q5_0: out = kernels::WeightDType::q5_0; return true;
    case model::DType::q5_1: out = kernels::WeightDType::q5_1; return true;
    case model::DType::q2_k: out = kernels::WeightDType::q2_k; return true;
    case model::DType::q3_k: out = kernels::WeightDType::q3_k; return true;
    case model::DType::q4_k: out = kernels::WeightDType::q4_k; return true;
    case model::DType::q5_k: out = kernels::WeightDType::q5_k; return true;
    case model::DType::q6_k: out = kernels::WeightDType::q6_k; return true;
    default: return false;  // a type added to the loader but not to the kernels: refused
  }
}

[[noreturn]] void refuse(const model::TensorView& t) {
  throw InputError("cuda backend: tensor '" + t.name + "' is " + model::dtype_name(t.dtype) +
                   ", which the CUDA kernels do not run (they run F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and "
                   "Q2_K..Q6_K; the CPU backend, --backend cpu, runs every type of the file)");
}

kernels::WeightDType kernel_dtype(const model::TensorView& t) {
  kernels::WeightDType d{};
  if (!kernel_dtype_of(t.dtype, d)) refuse(t);
  return d;
}

}  // namespace

void check_kernel_dtypes(const WeightStore& w) {
  const model::Weights& mw = w.model().weights;
  kernels::WeightDType d{};
  auto check = [&](const model::TensorView& t) {
    if (!t.empty() && !kernel_dtype_of(t.dtype, d)) refuse(t);
  };
  check(mw.tok_embd);
  check(mw.output);
  for (const auto& l : mw.layers)
    for (const model::TensorView* t : l.tensors()) check(*t);
}

std::shared_ptr<DeviceWeights> DeviceWeights::get(const WeightStore& w, int device) {
  std::lock_guard lk(g_registry_mu);
  auto& slot = g_registry[{&w, device}];
  if (auto sp = slot.lock()) return sp;
  std::shared_ptr<DeviceWeights> sp(new DeviceWeights(w, device));
  slot = sp;
  return sp;
}

DeviceWeights::DeviceWeights(const WeightStore& w, int device) : w_(w), device_(device) {}

DeviceWeights::~DeviceWeights() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  for (auto& s : segments_) cudaFree(s.dev);
  for (auto& [host, dev] : vecs_) cudaFree(dev);
  if (prev >= 0) cudaSetDevice(prev);
  std::lock_guard lk(g_registry_mu);
  auto it = g_registry.find({&w_, device_});
  if (it != g_registry.end() && it->second.expired()) g_registry.erase(it);
}

bool DeviceWeights::held(const ShardSegment& g) const {
  const MatView m{g.from, g.r0, g.rows, g.c0, g.cols};
  return std::any_of(segments_.begin(), segments_.end(), [&](const Segment& s) { return s.at.holds(m); });
}

void DeviceWeights::upload(const ShardSegment& g) {
  if (held(g)) return;
  const model::TensorView& t = *g.from;
  const std::string where = "cuda:" + std::to_string(device_) + " weights";
  void* d = nullptr;
  cudaError_t e = cudaMalloc(&d, g.bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw BackendError(where + ": cudaMalloc of tensor " + t.name + " rows [" + std::to_string(g.r0) + ", " +
                       std::to_string(g.r0 + g.rows) + ") columns [" + std::to_string(g.c0) + ", " +
                       std::to_string(g.c0 + g.cols) + ") (" + std::to_string(g.bytes) + " bytes, " +
                       std::to_string(free_b) + " free): " + cudaGetErrorName(e));
  }
  const auto* src = static_cast<const unsigned char*>(t.data);
  if (g.cols == t.cols) {
    e = cudaMemcpy(d, src + model::dtype_bytes(t.dtype, g.r0 * t.cols), g.bytes, cudaMemcpyHostToDevice);
  } else {
    // A column range of every row: one pitched copy.
    const std::size_t row = model::dtype_bytes(t.dtype, g.cols);
    e = cudaMemcpy2D(d, row, src + model::dtype_bytes(t.dtype, g.c0), model::dtype_bytes(t.dtype, t.cols), row,
                     static_cast<std::size_t>(g.rows), cudaMemcpyHostToDevice);
  }
  if (e != cudaSuccess) {
    cudaFree(d);
    check(e, "cudaMemcpy", where + " tensor " + t.name);
  }
  segments_.push_back(Segment{g, d});
  bytes_ += g.bytes;
}

void DeviceWeights::upload_vec(const float* host, std::size_t n, const char* what) {
  if (!host || vecs_.count(host)) return;
  const std::string where = "cuda:" + std::to_string(device_) + " weights " + what;
  void* d = nullptr;
  check(cudaMalloc(&d, n * sizeof(float)), "cudaMalloc", where);
  cudaError_t e = cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(d);
    check(e, "cudaMemcpy", where);
  }
  vecs_[host] = d;
  bytes_ += n * sizeof(float);
}

std::uint64_t DeviceWeights::make_resident(const std::vector<RankShard>& shards) {
  const ShardUnion u = w_.shard_union(shards);
  std::lock_guard lk(mu_);
  DeviceGuard guard(device_, "cuda:" + std::to_string(device_) + " weights");
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t before = bytes_;
  for (const ShardSegment& g : u.segments) upload(g);
  for (int L : u.layers)
    for (const auto& [host, n] : w_.layer_vectors(L)) upload_vec(host, n, "layer vector");
  if (!u.layers.empty() && w_.rope_freqs())
    upload_vec(w_.rope_freqs(), static_cast<std::size_t>(w_.hparams().n_rot / 2), "rope_freqs");
  if (u.head) upload_vec(w_.output_norm(), static_cast<std::size_t>(w_.hparams().n_embd), "output_norm");
  upload_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return bytes_ - before;
}

std::uint64_t DeviceWeights::missing_bytes(const std::vector<RankShard>& shards) const {
  const ShardUnion u = w_.shard_union(shards);
  std::lock_guard lk(mu_);
  std::uint64_t bytes = 0;
  for (const ShardSegment& g : u.segments)
    if (!held(g)) bytes += g.bytes;
  std::unordered_set<const void*> counted;
  auto vec = [&](const float* host, std::size_t n) {
    if (host && !vecs_.count(host) && counted.insert(host).second) bytes += n * sizeof(float);
  };
  for (int L : u.layers)
    for (const auto& [host, n] : w_.layer_vectors(L)) vec(host, n);
  if (!u.layers.empty() && w_.rope_freqs()) vec(w_.rope_freqs(), static_cast<std::size_t>(w_.hparams().n_rot / 2));
  if (u.head) vec(w_.output_norm(), static_cast<std::size_t>(w_.hparams().n_embd));
  return bytes;
}

std::uint64_t DeviceWeights::release() {
  std::lock_guard lk(mu_);
  DeviceGuard guard(device_, "cuda:" + std::to_string(device_) + " weights release");
  for (auto& s : segments_) cudaFree(s.dev);
  for (auto& [host, dev] : vecs_) cudaFree(dev);
  segments_.clear();
  vecs_.clear();
  const std::uint64_t freed = bytes_;
  bytes_ = 0;
  return freed;
}

const float* DeviceWeights::vec(const float* host) const {
  std::lock_guard lk(mu_);
  auto it = vecs_.find(host);
  return it == vecs_.end() ? nullptr : static_cast<const float*>(it->second);
}

bool DeviceWeights::view(const MatView& m, kernels::WeightView& v) const {
  std::lock_guard lk(mu_);
  for (const Segment& s : segments_)
    if (s.at.holds(m)) {
      v.data = s.dev;
      v.dtype = kernel_dtype(*m.t);
      v.ld = s.at.cols;
      v.r0 = m.r0 - s.at.r0;
      v.rows = m.rows;
      v.c0 = m.c0 - s.at.c0;
      v.cols = m.cols;
      return true;
    }
  return false;
}

std::uint64_t DeviceWeights::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

double DeviceWeights::upload_s() const {
  std::lock_guard lk(mu_);
  return upload_s_;
}

std::size_t DeviceWeights::segments() const {
  std::lock_guard lk(mu_);
  return segments_.size();
}

kernels::WeightView device_view(const DeviceWeights& dw, const MatView& m) {
  kernels::WeightView v;
  if (!dw.view(m, v))
    throw BackendError("cuda backend: tensor " + (m.t ? m.t->name : std::string("?")) + " rows [" +
                       std::to_string(m.r0) + ", " + std::to_string(m.r0 + m.rows) + ") columns [" +
                       std::to_string(m.c0) + ", " + std::to_string(m.c0 + m.cols) + ") is not resident on the device");
  return v;
}

}  // namespace ftp::engine::cuda
