// SPDX-License-Identifier: Apache-2.0
// gpu-bench: the engine on the CUDA backend, on a synthetic Llama model
// (tests/support), by default Llama-3-8B's shape (~8.0 B parameters) in
// BF16, on cuda:0, measuring in one run:
//   the device's triad bandwidth (kernels/triad.cu, ftp-probe's measurement),
//   NCCL communicator pool creation time (ncclCommInitAll over every GPU),
//   the first domain's build time (weights uploaded) and the build time of
//   a domain of another gear (TP 2 with both ranks on cuda:0) beside it,
//   decode at batch 1, 8 and 64 (--batches): tokens/s of the engine's
//   forward (host argmax excluded), and the weight bandwidth = bytes of
//   the layer matrices and the classifier read per step x steps/s, as a
//   fraction of the triad bandwidth (goal >= 0.8 at batch 1).
// KV reads are not counted in the bandwidth (a few hundred positions).
// Output: lines on stdout, then one JSON document (kind ftp.gpu-bench/v1).
// --min-bw-fraction F exits 6 when batch 1 stays below F. Exit 77 without
// a GPU (a skip for meson).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/gpu.hpp"
#include "comm/nccl.hpp"
#include "core/error.hpp"
#include "engine/cuda/cuda_backend.hpp"
#include "engine/executor.hpp"
#include "engine/sampler.hpp"
#include "engine/weight_store.hpp"
#include "model/model.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  std::string shape = "8b";
  std::vector<int> batches = {1, 8, 64};
  int steps = 32;
  int warmup = 3;
  int prompt = 32;
  std::string dir;
  double min_bw_fraction = 0;
};

testing::SyntheticShape shape_of(const std::string& name) {
  testing::SyntheticShape s;
  s.dtype = model::DType::bf16;
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
    else if (a == "--batches") o.batches = parse_list(value());
    else if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--prompt") o.prompt = std::stoi(value());
    else if (a == "--dir") o.dir = value();
    else if (a == "--min-bw-fraction") o.min_bw_fraction = std::stod(value());
    else if (a == "--help") {
      std::printf("usage: gpu-bench [--shape 8b|tiny] [--batches 1,8,64] [--steps N] [--warmup N] [--prompt N] [--dir D] [--min-bw-fraction F]\n");
      std::exit(0);
    } else {
      throw InputError("unknown option " + a);
    }
  }
  if (o.steps < 1 || o.prompt < 1 || o.batches.empty()) throw InputError("--steps, --prompt and --batches must be positive");
  return o;
}

engine::StageLayout stage(int n_layer, std::vector<int> gpus) {
  engine::StageLayout l;
  l.n_layers = n_layer;
  l.tp = static_cast<int>(gpus.size());
  l.gpus = std::move(gpus);
  return l;
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
  std::vector<backend::GpuInfo> gpus;
  try {
    gpus = backend::discover_gpus();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu-bench: error: %s\n", e.what());
    return 5;
  }
  if (gpus.empty()) {
    std::printf("SKIP: no GPU found (%s)\n", backend::gpu_runtime_status().c_str());
    return 77;
  }
  nlohmann::json doc = {{"kind", "ftp.gpu-bench/v1"}, {"gpu", gpus[0].name}, {"shape", o.shape}, {"dtype", "BF16"}};
  const std::filesystem::path dir =
      o.dir.empty() ? std::filesystem::temp_directory_path() / ("ftp-gpu-bench-" + std::to_string(::getpid())) : std::filesystem::path(o.dir);
  int rc = 0;
  try {
    std::filesystem::create_directories(dir);
    const backend::Measurement triad = backend::measure_gpu_triad_gbs(0, o.shape != "8b");
    std::printf("cuda:0 %s: triad %.0f GB/s (%s)\n", gpus[0].name.c_str(), triad.value, triad.method.c_str());
    doc["triad_gb_s"] = triad.value;

    auto t0 = Clock::now();
    try {
      comm::NcclPool& pool = comm::NcclPool::instance();
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

    const testing::SyntheticShape shape = shape_of(o.shape);
    const std::string file = (dir / ("synthetic-" + o.shape + "-bf16.gguf")).string();
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

    engine::Backend& cuda = engine::cuda_backend();
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    const int B = 16;
    const int per_seq = (o.prompt + o.warmup + o.steps + B) / B + 1;
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
      auto advance = [&](const std::vector<std::vector<float>>& logits) {
        for (std::size_t i = 0; i < chunks.size(); ++i) {
          chunks[i].start_pos += static_cast<int>(chunks[i].tokens.size());
          chunks[i].tokens = {engine::argmax(logits[i])};
        }
      };
      t0 = Clock::now();
      advance(ex.forward(chunks, 1));
      const double prefill_s = since(t0);
      for (int i = 0; i < o.warmup; ++i) advance(ex.forward(chunks, 1));  // graphs captured here
      double fwd_s = 0;
      for (int i = 0; i < o.steps; ++i) {
        t0 = Clock::now();
        auto logits = ex.forward(chunks, 1);
        fwd_s += since(t0);
        advance(logits);
      }
      const double step_s = fwd_s / o.steps;
      const double tps = batch / step_s;
      const double bw = bytes / step_s / 1e9;
      if (batch == 1) bw1 = bw / triad.value;
      std::printf("decode batch %2d: %8.1f tokens/s, step %.2f ms, weights %.0f GB/s = %.2f of triad (prefill %d x %d: %.1f ms)\n",
                  batch, tps, step_s * 1e3, bw, bw / triad.value, batch, o.prompt, prefill_s * 1e3);
      runs.push_back({{"batch", batch}, {"tokens_per_s", tps}, {"step_ms", step_s * 1e3}, {"weight_gb_s", bw},
                      {"fraction_of_triad", bw / triad.value}, {"prefill_ms", prefill_s * 1e3}});
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
