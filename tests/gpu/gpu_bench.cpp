// SPDX-License-Identifier: Apache-2.0
// gpu-bench: the engine on the CUDA backend, on a synthetic Llama model
// (tests/support), by default Llama-3-8B's shape (~8.0 B parameters) in
// BF16 (--dtype q4_k_m: llama.cpp's Q4_K_M recipe, Q4_K with Q6_K for
// output and some attn_v and ffn_down, as engine-bench writes it; --dtype
// q4_0), on cuda:0, measuring in one run:
//   the device's triad bandwidth (kernels/triad.cu, ftp-probe's measurement),
//   NCCL communicator pool creation time (ncclCommInitAll over every GPU),
//   the first domain's build time (weights uploaded) and the build time of
//   a domain of another gear (TP 2 with both ranks on cuda:0) beside it,
//   decode at batch 1, 8 and 64 (--batches): tokens/s of the engine's
//   forward with the greedy tokens chosen on the device (forward_choose,
//   the domain's path; the same steps with the logits sent to the host are
//   timed too), and the weight bandwidth = bytes of
//   the layer matrices and the classifier read per step x steps/s, as a
//   fraction of the triad bandwidth (goal >= 0.8 at batch 1), and each
//   step split by CUDA events (CudaBackendOptions::step_timing) into
//   embedding + layers, head (final norm, classifier), the logits'
//   download, and the rest (host work and waits).
// KV reads are not counted in the bandwidth (a few hundred positions).
// --gemv-sweep (on by default) first times one layer's matrix products
// alone, on device buffers of the model's layer shapes in the --dtype
// (q4_k_m: every matrix Q4_K): the GEMV kernels in every configuration
// built for it (kernels::MatvecConfig) and, for BF16, cuBLAS (bf16
// activations, as the engine's path above FTP_GEMV_MAX_ROWS) at each batch,
// as bandwidth against the triad; and the logits' download per step into
// fresh pageable memory (what the engine's forward returns) and into pinned
// memory. These say where a decode step's time goes.
// Output: lines on stdout, then one JSON document (kind ftp.gpu-bench/v1).
// --memory-check (issue 17) adds, before the decode runs: the KV pages
// that fit the room in BF16 allocated and as many F32 pages refused (exit
// 7 otherwise), and the memory a TP 1, 2 and 4 domain of ranks on cuda:0
// adds against weights / TP a rank (reported: sharded uploads pending).
// --min-bw-fraction F exits 6 when batch 1 stays below F. Exit 77 without
// a GPU (a skip for meson).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "hardware/gpu.hpp"
#include "comm/nccl.hpp"
#include "core/error.hpp"
#include "engine/cuda/cuda_backend.hpp"
#include "engine/cuda/cuda_check.hpp"
#include "engine/domain.hpp"
#include "engine/executor.hpp"
#include "engine/rank_backend.hpp"
#include "engine/sampler.hpp"
#include "engine/weight_store.hpp"
#include "kernels/convert.cuh"
#include "kernels/matvec.cuh"
#include "model/model.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  std::string shape = "8b";
  std::string dtype = "bf16";  ///< bf16, q4_k_m or q4_0
  std::vector<int> batches = {1, 8, 64};
  int steps = 32;
  int warmup = 3;
  int prompt = 32;
  std::string dir;
  double min_bw_fraction = 0;
  bool gemv_sweep = true;
  std::vector<int> sweep_batches = {1, 2, 4, 8, 16, 64};
  bool memory_check = false;  ///< --memory-check: KV pages BF16 against F32, rank weights at TP 1/2/4
};

testing::SyntheticShape shape_of(const std::string& name, const std::string& dtype) {
  testing::SyntheticShape s;
  if (dtype == "bf16") s.dtype = model::DType::bf16;
  else if (dtype == "q4_k_m") s.dtype = model::DType::q4_k, s.q4_k_m = true;
  else if (dtype == "q4_0") s.dtype = model::DType::q4_0;
  else throw InputError("--dtype: expected bf16, q4_k_m or q4_0, got '" + dtype + "'");
  s.seed = 3;
  if (name == "8b") {  // Llama-3-8B
    s.n_layer = 32;
    s.n_embd = 4096;
    s.n_ff = 14336;
    s.n_head = 32;
    s.n_head_kv = 8;
    s.n_vocab = 128256;
    s.n_ctx = 8192;
  } else if (name == "tiny") {
    s.n_layer = 2;
    s.n_embd = 256;
    s.n_ff = 512;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_vocab = 1000;
    s.n_ctx = 512;
  } else {
    throw InputError("--shape: expected 8b or tiny, got '" + name + "'");
  }
  return s;
}

/// Bytes a decode step reads from the weights: every layer matrix and the
/// classifier (the embedding table only for the batch's rows: not counted).
double step_weight_bytes(const model::Model& m) {
  double b = 0;
  for (const auto& L : m.weights.layers)
    for (const model::TensorView* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      b += static_cast<double>(t->bytes);
  return b + static_cast<double>(m.weights.output.bytes);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');) out.push_back(std::stoi(p));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(a + ": expected a value");
      return argv[++i];
    };
    if (a == "--shape") o.shape = value();
    else if (a == "--dtype") o.dtype = value();
    else if (a == "--batches") o.batches = parse_list(value());
    else if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--prompt") o.prompt = std::stoi(value());
    else if (a == "--dir") o.dir = value();
    else if (a == "--min-bw-fraction") o.min_bw_fraction = std::stod(value());
    else if (a == "--gemv-sweep") o.gemv_sweep = true;
    else if (a == "--no-gemv-sweep") o.gemv_sweep = false;
    else if (a == "--sweep-batches") o.sweep_batches = parse_list(value());
    else if (a == "--memory-check") o.memory_check = true;
    else if (a == "--help") {
      std::printf("usage: gpu-bench [--shape 8b|tiny] [--dtype bf16|q4_k_m|q4_0] [--batches 1,8,64] [--steps N] [--warmup N] [--prompt N] [--dir D] [--min-bw-fraction F]\n"
                  "                 [--gemv-sweep|--no-gemv-sweep] [--sweep-batches 1,2,4,8,16,64] [--memory-check]\n");
      std::exit(0);
    } else {
      throw InputError("unknown option " + a);
    }
  }
  if (o.steps < 1 || o.prompt < 1 || o.batches.empty()) throw InputError("--steps, --prompt and --batches must be positive");
  shape_of(o.shape, o.dtype);  // refuses a bad --shape or --dtype here (exit 2)
  return o;
}

engine::StageLayout stage(int n_layer, std::vector<int> gpus) {
  engine::StageLayout l;
  l.n_layers = n_layer;
  l.tp = static_cast<int>(gpus.size());
  l.gpus = std::move(gpus);
  return l;
}

/// --memory-check (issue 17), on cuda:0 beside the TP 1 domain already
/// built: (1) the KV pool in BF16 holds twice the tokens of float32 -- the
/// pages that fit the KV room in BF16 are allocated, and as many float32
/// pages are refused; (2) what a TP 1, TP 2 and TP 4 domain of ranks on
/// the one GPU add to its memory, against weights / TP per rank: for each
/// TP, a fresh store (its own resident copy) uploads rank 0's shard of the
/// layers only (WeightStore::shard_union; CudaBackend::make_resident), and
/// both the backend's accounting and cudaMemGetInfo's drop are read, then
/// released. Returns 7 when (1) fails or a rank's accounted bytes are not
/// weights / TP within 1 %.
int memory_check(const engine::WeightStore& store, engine::Backend& cuda, int n_layer, int B, nlohmann::json& doc) {
  const auto& hp = store.hparams();
  std::vector<engine::RankSpec> one(1);
  one[0].n_layers = n_layer;
  one[0].first_stage = one[0].last_stage = true;
  one[0].gpu = 0;
  const std::uint64_t room = cuda.kv_room_bytes(store, one).at(0);
  engine::StageLayout bf = stage(n_layer, {0}), f32 = stage(n_layer, {0});
  bf.kv_dtype = engine::KvDtype::bf16;
  f32.kv_dtype = engine::KvDtype::f32;
  const std::uint64_t per_bf = engine::kv_block_bytes_per_rank(hp, bf, B), per_f32 = engine::kv_block_bytes_per_rank(hp, f32, B);
  // 90 % of the room: the pool's own buffers and the driver's granularity.
  const int blocks = static_cast<int>(0.9 * static_cast<double>(room) / static_cast<double>(per_bf));
  bool bf_ok = false, f32_refused = false;
  std::string f32_error;
  try {
    engine::Executor e(store, {bf}, blocks, B, &cuda, 64);
    bf_ok = true;
  } catch (const std::exception& e) {
    std::printf("kv check: %d BF16 pages refused: %s\n", blocks, e.what());
  }
  try {
    engine::Executor e(store, {f32}, blocks, B, &cuda, 64);
  } catch (const std::exception& e) {
    f32_refused = true;
    f32_error = e.what();
  }
  std::printf("kv check: room %.2f GB; a page of %d tokens: BF16 %llu bytes, F32 %llu (ratio %.2f); %d BF16 pages (%lld tokens) "
              "%s, as many F32 pages %s%s\n",
              static_cast<double>(room) / 1e9, B, static_cast<unsigned long long>(per_bf),
              static_cast<unsigned long long>(per_f32), static_cast<double>(per_f32) / static_cast<double>(per_bf), blocks,
              static_cast<long long>(blocks) * B, bf_ok ? "allocated" : "NOT allocated",
              f32_refused ? "refused: " : "ALLOCATED", f32_error.c_str());
  doc["kv_check"] = {{"room_bytes", room},        {"bf16_page_bytes", per_bf}, {"f32_page_bytes", per_f32},
                     {"bf16_pages", blocks},      {"bf16_allocated", bf_ok},   {"f32_refused", f32_refused}};
  // (2) rank weight bytes at TP 1, 2, 4 on the one GPU.
  std::uint64_t weights = 0;
  for (const auto& L : store.model().weights.layers)
    for (const model::TensorView* t : L.tensors()) weights += t->bytes;
  nlohmann::json tps = nlohmann::json::array();
  bool ranks_ok = true;
  for (int tp : {1, 2, 4}) {
    engine::WeightStore fresh(store.model());
    std::size_t free_before = 0, free_after = 0, total = 0;
    cudaMemGetInfo(&free_before, &total);
    cuda.make_resident(fresh, {{0, {engine::RankShard{0, n_layer, tp, 0, false, false}}}});
    cudaMemGetInfo(&free_after, &total);
    const double accounted = static_cast<double>(cuda.resident_bytes(fresh)[0]);
    const double added = static_cast<double>(free_before) - static_cast<double>(free_after);
    const double goal = static_cast<double>(weights) / tp;
    const bool ok = std::abs(accounted - goal) <= 0.01 * goal;
    ranks_ok = ranks_ok && ok;
    std::printf("rank 0 of TP %d on cuda:0: %.3f GB accounted, %.3f GB less free (layer weights %.3f GB / TP = %.3f GB)%s\n",
                tp, accounted / 1e9, added / 1e9, static_cast<double>(weights) / 1e9, goal / 1e9,
                ok ? "" : " NOT within 1 %");
    tps.push_back({{"tp", tp}, {"accounted_bytes", accounted}, {"added_bytes", added},
                   {"weights_per_rank_goal_bytes", goal}, {"within_1_percent", ok}});
    cuda.release_device(fresh, 0);
  }
  doc["rank_weights"] = tps;
  return bf_ok && f32_refused && ranks_ok ? 0 : 7;
}

/// One layer's matrix products alone (see the file's head), on `layers`
/// copies of the layer's matrices so that they do not sit in L2.
nlohmann::json gemv_sweep(const testing::SyntheticShape& sh, const std::vector<int>& batches, double triad_gbs) {
  // The matrices in the model's matrix dtype (Q4_K_M's Q6_K ones as Q4_K).
  const model::DType mdt = sh.dtype;
  const kernels::WeightDType kdt = mdt == model::DType::bf16   ? kernels::WeightDType::bf16
                                   : mdt == model::DType::q4_k ? kernels::WeightDType::q4_k
                                                               : kernels::WeightDType::q4_0;
  const bool block = kernels::is_block_quant(kdt);
  // CUDA and cuBLAS statuses as the engine checks them (BackendError).
  auto cuda_ok = [](auto status, const char* what) { engine::cuda::check(status, what, "gpu-bench sweep"); };
  const std::int64_t E = sh.n_embd, F = sh.n_ff, KV = static_cast<std::int64_t>(sh.n_embd / sh.n_head) * sh.n_head_kv;
  struct Mat {
    const char* name;
    std::int64_t rows, cols;
  };
  const Mat mats[] = {{"q", E, E}, {"k", KV, E}, {"v", KV, E}, {"o", E, E}, {"gate", F, E}, {"up", F, E}, {"down", E, F}};
  std::int64_t layer_elems = 0;
  for (const Mat& m : mats) layer_elems += m.rows * m.cols;
  const double layer_bytes = static_cast<double>(model::dtype_bytes(mdt, layer_elems));
  const int layers = static_cast<int>(std::max<double>(1, std::ceil(512e6 / layer_bytes)));
  const int max_t = *std::max_element(batches.begin(), batches.end());
  std::uint8_t* w = nullptr;
  float *x = nullptr, *out = nullptr;
  void* xh = nullptr;
  // 0x3c bytes: BF16 1.17; the block types' f16 scales 0x3c3c = 1.06 (finite).
  const std::size_t all_bytes = static_cast<std::size_t>(layer_bytes) * static_cast<std::size_t>(layers);
  cuda_ok(cudaMalloc(&w, all_bytes), "cudaMalloc (weights)");
  cuda_ok(cudaMemset(w, 0x3c, all_bytes), "cudaMemset");
  cuda_ok(cudaMalloc(&x, static_cast<std::size_t>(max_t) * F * 4), "cudaMalloc (x)");
  cuda_ok(cudaMemset(x, 0, static_cast<std::size_t>(max_t) * F * 4), "cudaMemset");
  cuda_ok(cudaMalloc(&xh, static_cast<std::size_t>(max_t) * F * 2), "cudaMalloc (x bf16)");
  cuda_ok(cudaMalloc(&out, static_cast<std::size_t>(max_t) * 2 * F * 4), "cudaMalloc (out)");
  cublasHandle_t h = nullptr;
  cuda_ok(cublasCreate(&h), "cublasCreate");
  cudaEvent_t e0, e1;
  cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
  auto view = [&](int layer, int m) {
    std::int64_t off = static_cast<std::int64_t>(layer) * layer_elems;
    for (int i = 0; i < m; ++i) off += mats[i].rows * mats[i].cols;
    return kernels::WeightView{w + model::dtype_bytes(mdt, off), kdt, mats[m].cols, 0, mats[m].rows, 0, mats[m].cols};
  };
  // One layer as the engine runs it: q, k, v in one launch; o; gate, up in one; down.
  // The block types with integer dots read int8 activation quants and
  // block scales (zeros here: the timing does not depend on the values),
  // as the engine's path does (FTP_CUDA_INT8_DOTS).
  std::int8_t* xq8 = nullptr;
  float* xd = nullptr;
  const bool int8 = block && kernels::matvec_int_dots(kdt);
  if (int8) {
    cuda_ok(cudaMalloc(&xq8, static_cast<std::size_t>(max_t) * F), "cudaMalloc (x int8)");
    cuda_ok(cudaMemset(xq8, 0, static_cast<std::size_t>(max_t) * F), "cudaMemset");
    cuda_ok(cudaMalloc(&xd, static_cast<std::size_t>(max_t) * F / 32 * 4), "cudaMalloc (x scales)");
    cuda_ok(cudaMemset(xd, 0, static_cast<std::size_t>(max_t) * F / 32 * 4), "cudaMemset");
  }
  auto q8_of = [&](std::int64_t k, kernels::Q8Acts& a) -> const kernels::Q8Acts* {
    if (!int8) return nullptr;
    const int b = kernels::block_elems(kdt);
    a = kernels::Q8Acts{xq8, xd, static_cast<int>(k), static_cast<int>(k / b), kernels::act_quant_of(kdt)};
    return &a;
  };
  auto gemv_layer = [&](int L, int t, kernels::MatvecConfig c) {
    kernels::Q8Acts qe, qf;
    const kernels::Q8Acts* ae = q8_of(E, qe);
    const kernels::Q8Acts* af = q8_of(F, qf);
    const kernels::MatvecTarget qkv[3] = {{view(L, 0), out, static_cast<int>(E)},
                                          {view(L, 1), out + t * E, static_cast<int>(KV)},
                                          {view(L, 2), out + t * (E + KV), static_cast<int>(KV)}};
    cuda_ok(kernels::matvec_multi(x, static_cast<int>(E), qkv, 3, t, nullptr, c, ae), "matvec_multi (qkv)");
    cuda_ok(kernels::matvec(x, static_cast<int>(E), view(L, 3), out, static_cast<int>(E), t, nullptr, c, ae), "matvec (o)");
    const kernels::MatvecTarget gu[2] = {{view(L, 4), out, static_cast<int>(F)}, {view(L, 5), out + t * F, static_cast<int>(F)}};
    cuda_ok(kernels::matvec_multi(x, static_cast<int>(E), gu, 2, t, nullptr, c, ae), "matvec_multi (gate, up)");
    cuda_ok(kernels::matvec(x, static_cast<int>(F), view(L, 6), out, static_cast<int>(E), t, nullptr, c, af), "matvec (down)");
  };
  auto cublas_layer = [&](int L, int t) {
    const float one = 1.0f, zero = 0.0f;
    for (int m = 0; m < 7; ++m) {
      const kernels::WeightView v = view(L, m);
      const int n = static_cast<int>(v.rows), k = static_cast<int>(v.cols);
      cuda_ok(kernels::convert_f32(x, xh, kernels::HalfType::bf16, static_cast<std::size_t>(t) * k, nullptr), "convert_f32");
      cuda_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, t, k, &one, v.data, CUDA_R_16BF, k, xh, CUDA_R_16BF, k, &zero,
                             out, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
    }
  };
  // Milliseconds per layer: one pass over the copies to warm up, then three timed.
  auto time_layer = [&](const std::function<void(int)>& layer) {
    for (int L = 0; L < layers; ++L) layer(L);
    cuda_ok(cudaEventRecord(e0), "cudaEventRecord");
    const int passes = 3;
    for (int p = 0; p < passes; ++p)
      for (int L = 0; L < layers; ++L) layer(L);
    cuda_ok(cudaEventRecord(e1), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    return static_cast<double>(ms) / (passes * layers);
  };
  const kernels::MatvecConfig configs[] = {{0, 0}, {1, 1}, {2, 1}, {1, 4}, {2, 4}, {4, 4}, {8, 4}};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("layer products alone (%.0f MB of %s per layer, %d copies), fraction of triad:\n", layer_bytes / 1e6,
              model::dtype_name(mdt), layers);
  std::printf("  batch  cuBLAS  gemv auto  1x1   2x1   1x4   2x4   4x4   8x4  (rows x warps per row group; - not built)\n");
  for (int t : batches) {
    nlohmann::json row = {{"batch", t}};
    if (block) {
      // The block types reach cuBLAS through dequantised tiles (not timed here).
      std::printf("  %5d       - ", t);
    } else {
      const double ms_cublas = time_layer([&](int L) { cublas_layer(L, t); });
      row["cublas_ms"] = ms_cublas;
      std::printf("  %5d  %6.2f ", t, layer_bytes / (ms_cublas / 1e3) / 1e9 / triad_gbs);
    }
    if (t <= 8) {
      for (const auto& c : configs) {
        if (!kernels::matvec_config_built(c, kdt)) {
          std::printf("     -");
          continue;
        }
        const double ms = time_layer([&](int L) { gemv_layer(L, t, c); });
        const double f = layer_bytes / (ms / 1e3) / 1e9 / triad_gbs;
        row[c.rows_per_warp == 0 ? std::string("gemv_auto_ms")
                                 : "gemv_" + std::to_string(c.rows_per_warp) + "x" + std::to_string(c.warps_per_row) + "_ms"] = ms;
        std::printf(c.rows_per_warp == 0 ? "  %6.2f   " : " %5.2f", f);
      }
    }
    std::printf("\n");
    rows.push_back(row);
  }
  // The logits of a decode step: batch x vocab floats to the host.
  nlohmann::json dl = nlohmann::json::array();
  float* dlog = nullptr;
  float* pinned = nullptr;
  const std::size_t V = static_cast<std::size_t>(sh.n_vocab);
  cuda_ok(cudaMalloc(&dlog, static_cast<std::size_t>(max_t) * V * 4), "cudaMalloc (logits)");
  cuda_ok(cudaMallocHost(&pinned, static_cast<std::size_t>(max_t) * V * 4), "cudaMallocHost");
  for (int t : batches) {
    const std::size_t n = static_cast<std::size_t>(t) * V;
    double pageable_s = 0, pinned_s = 0;
    const int reps = 5;
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      std::vector<float> host(n);
      cuda_ok(cudaMemcpy(host.data(), dlog, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (pageable)");
      pageable_s += since(t0);
      t0 = Clock::now();
      cuda_ok(cudaMemcpy(pinned, dlog, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (pinned)");
      pinned_s += since(t0);
    }
    std::printf("  logits download batch %2d (%.1f MB): fresh pageable %.2f ms, pinned %.2f ms\n", t, n * 4 / 1e6,
                pageable_s / reps * 1e3, pinned_s / reps * 1e3);
    dl.push_back({{"batch", t}, {"mb", n * 4 / 1e6}, {"pageable_ms", pageable_s / reps * 1e3}, {"pinned_ms", pinned_s / reps * 1e3}});
  }
  cudaFreeHost(pinned);
  cudaFree(dlog);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasDestroy(h);
  cudaFree(out);
  cudaFree(xh);
  cudaFree(xq8);
  cudaFree(xd);
  cudaFree(x);
  cudaFree(w);
  return {{"layer_bytes", layer_bytes}, {"layers", rows}, {"logits_download", dl}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu-bench: error: %s\n", e.what());
    return 2;
  }
  std::vector<hardware::GpuInfo> gpus;
  try {
    gpus = hardware::discover_gpus();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu-bench: error: %s\n", e.what());
    return 5;
  }
  if (gpus.empty()) {
    std::printf("SKIP: no GPU found (%s)\n", hardware::gpu_runtime_status().c_str());
    return 77;
  }
  const std::string dtype_name = o.dtype == "q4_k_m" ? "Q4_K_M" : o.dtype == "q4_0" ? "Q4_0" : "BF16";
  nlohmann::json doc = {{"kind", "ftp.gpu-bench/v1"}, {"gpu", gpus[0].name}, {"shape", o.shape}, {"dtype", dtype_name}};
  const std::filesystem::path dir =
      o.dir.empty() ? std::filesystem::temp_directory_path() / ("ftp-gpu-bench-" + std::to_string(::getpid())) : std::filesystem::path(o.dir);
  int rc = 0;
  try {
    std::filesystem::create_directories(dir);
    const hardware::Measurement triad = hardware::measure_gpu_triad_gbs(0, o.shape != "8b");
    std::printf("cuda:0 %s: triad %.0f GB/s (%s)\n", gpus[0].name.c_str(), triad.value, triad.method.c_str());
    doc["triad_gb_s"] = triad.value;

    auto t0 = Clock::now();
    try {
      // The root over every GPU of this host (the daemon's spans its gear table's only).
      comm::NcclPool& pool = comm::NcclPool::instance();
      std::vector<int> all;
      for (const auto& g : gpus) all.push_back(g.index);
      pool.span(all);
      const double pool_total_ms = since(t0) * 1e3;
      std::printf("nccl pool over %d GPU(s): ncclCommInitAll %.1f ms (first use %.1f ms)\n", pool.n_devices(),
                  pool.create_ms(), pool_total_ms);
      doc["nccl_pool_create_ms"] = pool.create_ms();
      doc["nccl_pool_gpus"] = pool.n_devices();
    } catch (const Error& e) {
      // Reported, not fatal: a single-GPU decode needs no communicator.
      std::printf("nccl pool: %s\n", e.what());
      doc["nccl_pool_error"] = e.what();
    }

    const testing::SyntheticShape shape = shape_of(o.shape, o.dtype);
    if (o.gemv_sweep) doc["gemv_sweep"] = gemv_sweep(shape, o.sweep_batches, triad.value);
    const std::string file = (dir / ("synthetic-" + o.shape + "-" + o.dtype + ".gguf")).string();
    t0 = Clock::now();
    if (!std::filesystem::exists(file)) testing::write_synthetic_gguf(file, shape);
    std::printf("model %s: written in %.1f s\n", file.c_str(), since(t0));
    model::Model m = model::load_model(file);
    engine::WeightStore store(m);
    const double bytes = step_weight_bytes(m);
    std::uint64_t params = 0;
    for (const auto& L : m.weights.layers)
      for (const model::TensorView* t : L.tensors()) params += static_cast<std::uint64_t>(t->elements());
    params += static_cast<std::uint64_t>(m.weights.tok_embd.elements());
    if (m.weights.output.data != m.weights.tok_embd.data) params += static_cast<std::uint64_t>(m.weights.output.elements());
    std::printf("model: %.2f B parameters, %.2f GB read per decode step\n", params / 1e9, bytes / 1e9);
    doc["parameters"] = params;
    doc["step_weight_bytes"] = bytes;

    // The environment's options (FTP_GEMV_CONFIG, FTP_CUDA_PDL, ...) with
    // the step timing on: it splits each step below.
    engine::CudaBackendOptions backend_opts = engine::CudaBackendOptions::from_env();
    backend_opts.step_timing = true;
    const std::unique_ptr<engine::Backend> cuda_owner = engine::make_cuda_backend(backend_opts);
    engine::Backend& cuda = *cuda_owner;
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    const int B = 16;
    // Positions: the prompt, then two runs of warm-up + timed steps (tokens
    // chosen on the device, then logits to the host).
    const int per_seq = (o.prompt + 2 * (o.warmup + o.steps) + B) / B + 1;
    const int kv_blocks = per_seq * max_batch;
    t0 = Clock::now();
    engine::Executor ex(store, {stage(shape.n_layer, {0})}, kv_blocks, B, &cuda, std::max(64, max_batch));
    const double first_s = since(t0);
    t0 = Clock::now();
    {
      engine::Executor other(store, {stage(shape.n_layer, {0, 0})}, kv_blocks, B, &cuda, std::max(64, max_batch));
      const double other_s = since(t0);
      std::printf("domain build: first (TP 1, uploads weights) %.2f s; another gear (TP 2 on cuda:0, weights resident) %.1f ms\n",
                  first_s, other_s * 1e3);
      doc["first_domain_build_s"] = first_s;
      doc["another_gear_build_ms"] = other_s * 1e3;
    }

    if (o.memory_check) {
      const int mc = memory_check(store, cuda, shape.n_layer, B, doc);
      if (mc != 0) rc = mc;
    }

    nlohmann::json runs = nlohmann::json::array();
    double bw1 = 0;
    for (int batch : o.batches) {
      std::vector<std::vector<int>> blocks(static_cast<std::size_t>(batch));
      std::vector<engine::SeqChunk> chunks;
      for (int s = 0; s < batch; ++s) {
        for (int i = 0; i < per_seq; ++i) blocks[static_cast<std::size_t>(s)].push_back(s * per_seq + i);
        std::vector<int> prompt;
        for (int i = 0; i < o.prompt; ++i) prompt.push_back(1 + (s * 131 + i * 17) % (shape.n_vocab - 1));
        chunks.push_back({&blocks[static_cast<std::size_t>(s)], 0, prompt, true});
      }
      // The domain's path: greedy tokens chosen on the device (argmax_rows),
      // ids back; and, for comparison, the logits sent to the host.
      const std::vector<engine::TokenChoice> greedy(chunks.size());
      auto step = [&](bool choose) {
        std::vector<int> next;
        if (choose) {
          next = ex.forward_choose(chunks, 1, greedy);
        } else {
          auto logits = ex.forward(chunks, 1);
          for (const auto& l : logits) next.push_back(engine::argmax(l));
          ex.recycle(std::move(logits));  // as the domain does
        }
        for (std::size_t i = 0; i < chunks.size(); ++i) {
          chunks[i].start_pos += static_cast<int>(chunks[i].tokens.size());
          chunks[i].tokens = {next[i]};
        }
      };
      struct Split {
        double step_s = 0, layers_ms = 0, head_ms = 0, download_ms = 0;
      };
      auto measure = [&](bool choose) {
        for (int i = 0; i < o.warmup; ++i) step(choose);  // graphs captured here
        Split r;
        const engine::CudaStepTiming before = engine::cuda_step_timing();
        for (int i = 0; i < o.steps; ++i) {
          t0 = Clock::now();
          step(choose);
          r.step_s += since(t0);
        }
        r.step_s /= o.steps;
        const engine::CudaStepTiming after = engine::cuda_step_timing();
        const double timed = static_cast<double>(after.steps - before.steps);
        if (timed > 0) {
          r.layers_ms = (after.layers_ms - before.layers_ms) / timed;
          r.head_ms = (after.head_ms - before.head_ms) / timed;
          r.download_ms = (after.download_ms - before.download_ms) / timed;
        }
        return r;
      };
      t0 = Clock::now();
      step(true);
      const double prefill_s = since(t0);
      const Split c = measure(true), l = measure(false);
      const double tps = batch / c.step_s;
      const double bw = bytes / c.step_s / 1e9;
      if (batch == 1) bw1 = bw / triad.value;
      std::printf("decode batch %2d: %8.1f tokens/s, step %.2f ms, weights %.0f GB/s = %.2f of triad (prefill %d x %d: %.1f ms)\n",
                  batch, tps, c.step_s * 1e3, bw, bw / triad.value, batch, o.prompt, prefill_s * 1e3);
      std::printf("  step split (device events): embedding + layers %.2f ms, head and choice %.2f ms, ids back %.2f ms; "
                  "host and waits %.2f ms\n",
                  c.layers_ms, c.head_ms, c.download_ms, c.step_s * 1e3 - c.layers_ms - c.head_ms - c.download_ms);
      std::printf("  logits to the host instead: step %.2f ms (download %.2f ms, host and waits %.2f ms)\n", l.step_s * 1e3,
                  l.download_ms, l.step_s * 1e3 - l.layers_ms - l.head_ms - l.download_ms);
      runs.push_back({{"batch", batch}, {"tokens_per_s", tps}, {"step_ms", c.step_s * 1e3}, {"weight_gb_s", bw},
                      {"fraction_of_triad", bw / triad.value}, {"prefill_ms", prefill_s * 1e3},
                      {"layers_ms", c.layers_ms}, {"head_ms", c.head_ms}, {"download_ms", c.download_ms},
                      {"logits_to_host_step_ms", l.step_s * 1e3}});
    }
    doc["decode"] = runs;
    const engine::CudaGraphStats g = engine::cuda_graph_stats();
    std::printf("cuda graphs: %llu captured, %llu captures failed (those ranks ran eagerly)\n",
                static_cast<unsigned long long>(g.captures), static_cast<unsigned long long>(g.failures));
    doc["graph_captures"] = g.captures;
    doc["graph_capture_failures"] = g.failures;
    if (o.min_bw_fraction > 0 && bw1 < o.min_bw_fraction) {
      std::fprintf(stderr, "gpu-bench: batch-1 bandwidth fraction %.2f < --min-bw-fraction %.2f\n", bw1, o.min_bw_fraction);
      rc = 6;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "gpu-bench: error: %s\n", e.what());
    rc = static_cast<int>(e.exit());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu-bench: error: %s\n", e.what());
    rc = 1;
  }
  if (o.dir.empty()) std::filesystem::remove_all(dir);
  std::printf("%s\n", doc.dump().c_str());
  return rc;
}
