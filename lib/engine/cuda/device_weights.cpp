// SPDX-License-Identifier: Apache-2.0
#include "engine/cuda/device_weights.hpp"

#include <cuda_runtime.h>

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
    default: return false;
  }
}

[[noreturn]] void refuse(const model::TensorView& t) {
  throw InputError("cuda backend: tensor '" + t.name + "' is " + model::dtype_name(t.dtype) +
                   ", which the CUDA kernels do not run yet (they run F32, F16, BF16 and Q8_0; the CPU backend, "
                   "--backend cpu, runs every type of the file)");
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
  for (auto& [host, dev] : dev_) cudaFree(dev);
  if (prev >= 0) cudaSetDevice(prev);
  std::lock_guard lk(g_registry_mu);
  auto it = g_registry.find({&w_, device_});
  if (it != g_registry.end() && it->second.expired()) g_registry.erase(it);
}

void DeviceWeights::upload(const model::TensorView* t) {
  if (!t || t->empty() || dev_.count(t)) return;
  const std::string where = "cuda:" + std::to_string(device_) + " weights";
  void* d = nullptr;
  cudaError_t e = cudaMalloc(&d, t->bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw BackendError(where + ": cudaMalloc of tensor " + t->name + " (" + std::to_string(t->bytes) + " bytes, " +
                       std::to_string(free_b) + " free): " + cudaGetErrorName(e));
  }
  e = cudaMemcpy(d, t->data, t->bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(d);
    check(e, "cudaMemcpy", where + " tensor " + t->name);
  }
  dev_[t] = d;
  bytes_ += t->bytes;
}

void DeviceWeights::upload_vec(const float* host, std::size_t n, const char* what) {
  if (!host || dev_.count(host)) return;
  const std::string where = "cuda:" + std::to_string(device_) + " weights " + what;
  void* d = nullptr;
  check(cudaMalloc(&d, n * sizeof(float)), "cudaMalloc", where);
  cudaError_t e = cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(d);
    check(e, "cudaMemcpy", where);
  }
  dev_[host] = d;
  bytes_ += n * sizeof(float);
}

template <class Tensor, class Vec>
void DeviceWeights::for_each_needed(const Span& sp, Tensor&& tensor, Vec&& vec) const {
  const model::Model& m = w_.model();
  const auto E = static_cast<std::size_t>(w_.hparams().n_embd);
  for (int L = sp.first; L < sp.first + sp.n; ++L) {
    const auto& layer = m.weights.layers[static_cast<std::size_t>(L)];
    for (const model::TensorView* t : layer.matrices()) tensor(t);
    // The vectors as the store converted them to float32 (tp 1: whole; every
    // rank's VecView is a range of the same vector).
    const RankLayerView v = w_.layer(L, 1, 0);
    const auto hd = static_cast<std::size_t>(w_.hparams().head_dim);
    vec(v.attn_norm, E, "attn_norm");
    vec(v.ffn_norm, E, "ffn_norm");
    for (const VecView* b : {&v.bq, &v.bk, &v.bv}) vec(b->base, static_cast<std::size_t>(b->n), "attention bias");
    vec(v.q_norm, hd, "attn_q_norm");
    vec(v.k_norm, hd, "attn_k_norm");
  }
  if (sp.n > 0) vec(w_.rope_freqs(), static_cast<std::size_t>(w_.hparams().n_rot / 2), "rope_freqs");
  if (sp.embedding) tensor(&m.weights.tok_embd);
  if (sp.output) {
    tensor(w_.output().t);
    vec(w_.output_norm(), E, "output_norm");
  }
}

void DeviceWeights::ensure(int first, int n, bool embedding, bool output) {
  std::lock_guard lk(mu_);
  DeviceGuard guard(device_, "cuda:" + std::to_string(device_) + " weights");
  auto t0 = std::chrono::steady_clock::now();
  for_each_needed(
      Span{first, n, embedding, output}, [&](const model::TensorView* t) { upload(t); },
      [&](const float* host, std::size_t len, const char* what) { upload_vec(host, len, what); });
  upload_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::uint64_t DeviceWeights::missing_bytes(const std::vector<Span>& spans) const {
  std::lock_guard lk(mu_);
  std::unordered_set<const void*> counted;
  std::uint64_t bytes = 0;
  for (const Span& sp : spans)
    for_each_needed(
        sp,
        [&](const model::TensorView* t) {
          if (t && !t->empty() && !dev_.count(t) && counted.insert(t).second) bytes += t->bytes;
        },
        [&](const float* host, std::size_t len, const char*) {
          if (host && !dev_.count(host) && counted.insert(host).second) bytes += len * sizeof(float);
        });
  return bytes;
}

const void* DeviceWeights::tensor(const model::TensorView* t) const {
  std::lock_guard lk(mu_);
  auto it = dev_.find(t);
  return it == dev_.end() ? nullptr : it->second;
}

const float* DeviceWeights::vec(const float* host) const {
  std::lock_guard lk(mu_);
  auto it = dev_.find(host);
  return it == dev_.end() ? nullptr : static_cast<const float*>(it->second);
}

std::uint64_t DeviceWeights::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

double DeviceWeights::upload_s() const {
  std::lock_guard lk(mu_);
  return upload_s_;
}

kernels::WeightView device_view(const DeviceWeights& dw, const MatView& m) {
  const void* d = dw.tensor(m.t);
  if (!d) throw BackendError("cuda backend: tensor " + (m.t ? m.t->name : std::string("?")) + " is not resident on the device");
  kernels::WeightView v;
  v.data = d;
  v.dtype = kernel_dtype(*m.t);
  v.ld = m.t->cols;
  v.r0 = m.r0;
  v.rows = m.rows;
  v.c0 = m.c0;
  v.cols = m.cols;
  return v;
}

}  // namespace ftp::engine::cuda
