// SPDX-License-Identifier: Apache-2.0
// The engine on the CUDA backend against the CPU backend and the goldens:
// stories260K greedy tokens at TP 1 and at TP 2 with both ranks on one GPU
// (graphs on and off), logits of synthetic models in F32/F16/BF16/Q8_0/
// Q4_K_M/Q4_0 for a prefill batch (cuBLAS path) and decode batches (GEMV,
// graphs), several sequences at once, a domain of another gear built beside a running one,
// and the arch-refs F32 models against llama.cpp. Plain main: exit 77 (skip) without a GPU or without the data.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <unistd.h>

#include "hardware/gpu.hpp"
#include "comm/nccl.hpp"
#include "engine/cuda/cuda_backend.hpp"
#include "engine/domain.hpp"
#include "engine/executor.hpp"
#include "engine/sampler.hpp"
#include "engine/weight_store.hpp"
#include "kernels/launch.cuh"
#include "model/model.hpp"
#include "llama_refs.hpp"
#include "synthetic_gguf.hpp"
#include "test_data.hpp"
#include "gpu_tests.hpp"

using namespace ftp::engine;
using ftp::model::DType;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

using ftp::test::stories260k_golden_ids;

/// Greedy generation of one sequence through an executor: the prompt as one
/// chunk, then one token per step.
std::vector<int> greedy(Executor& ex, std::vector<int> prompt, int steps) {
  const int B = ex.block_tokens();
  std::vector<int> blocks;
  for (int i = 0; i < (static_cast<int>(prompt.size()) + steps + B - 1) / B; ++i) blocks.push_back(i);
  std::vector<int> out;
  SeqChunk c{&blocks, 0, prompt, true};
  for (int s = 0; s < steps; ++s) {
    auto logits = ex.forward({c}, 1);
    const int t = argmax(logits.at(0));
    out.push_back(t);
    c.start_pos += static_cast<int>(c.tokens.size());
    c.tokens = {t};
  }
  return out;
}

StageLayout stage(int n_layer, int tp, std::vector<int> gpus) {
  StageLayout l;
  l.first_layer = 0;
  l.n_layers = n_layer;
  l.tp = tp;
  l.gpus = std::move(gpus);
  return l;
}

void stories260k_goldens() {
  const std::string path = ftp::test::stories260k("stories260K.bin");
  if (!std::filesystem::exists(path)) {
    std::printf("skip stories260K goldens: %s not found (set FTP_TEST_DATA)\n", path.c_str());
    return;
  }
  ftp::model::Model m = ftp::model::load_model(path);
  WeightStore store(m);
  const auto golden = stories260k_golden_ids();
  const int n_layer = m.hparams.n_layer;
  for (const char* graphs : {"1-32, fusion and programmatic launch", "off, no fusion, no programmatic launch"}) {
    CudaBackendOptions opts;
    opts.fuse = graphs[0] == '1';
    opts.programmatic_launch = opts.fuse;
    if (opts.fuse)
      for (int b = 1; b <= 32; ++b) opts.graph_batches.push_back(b);
    auto cuda = make_cuda_backend(opts);
    for (auto gpus : {std::vector<int>{0}, std::vector<int>{0, 0}}) {
      Executor ex(store, {stage(n_layer, static_cast<int>(gpus.size()), gpus)}, 32, 16, cuda.get(), 64);
      const CudaGraphStats before = cuda_graph_stats();
      auto t0 = std::chrono::steady_clock::now();
      auto got = greedy(ex, {1}, 256);
      const CudaGraphStats after = cuda_graph_stats();
      if (opts.fuse && gpus.size() == 1)
        check(after.captures > before.captures && after.failures == before.failures,
              "TP 1 decode runs as a CUDA graph (" + std::to_string(after.captures - before.captures) + " captured, " +
                  std::to_string(after.failures - before.failures) + " failed)");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::size_t same = 0;
      while (same < got.size() && same < golden.size() && got[same] == golden[same]) ++same;
      check(same == golden.size(), "stories260K golden 256 greedy tokens, TP " + std::to_string(gpus.size()) +
                                       " on cuda:0, graphs " + graphs + " (" + std::to_string(same) +
                                       " equal, " + std::to_string(static_cast<int>(256 / s)) + " tokens/s)");
    }
  }
  // The process-wide setting back to the environment's for the tests below.
  ftp::kernels::set_programmatic_launch(CudaBackendOptions::from_env().programmatic_launch);
}

/// Runs requests through a domain (continuous batching, chunked prefill,
/// paged KV) until idle; returns each request's tokens.
std::vector<std::vector<int>> serve(const WeightStore& store, DomainConfig cfg, const std::vector<std::vector<int>>& prompts,
                                    int max_tokens, float temperature = 0.0f) {
  Domain d(store, cfg);
  std::vector<std::vector<int>> out(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt = prompts[i];
    r.max_tokens = max_tokens;
    r.sampling = SamplingParams{temperature, 0, 0.95f, 100 + i};
    r.on_event = [&out, i](const GenerationEvent& e) {
      if (e.token >= 0) out[i].push_back(e.token);
      if (e.finish_reason == ftp::engine::FinishReason::error) std::printf("     request %zu failed: %s\n", i, e.error.c_str());
    };
    d.submit(std::move(r));
  }
  for (int guard = 0; !d.idle() && guard < 100000; ++guard) d.step();
  return out;
}

/// The scheduler unchanged on the CUDA backend: 6 requests of different
/// prompt lengths batched together (prefill chunks beside decode rows),
/// the same tokens as the CPU backend's domain.
void stories260k_domain(Backend& cuda) {
  const std::string path = ftp::test::stories260k("stories260K.bin");
  if (!std::filesystem::exists(path)) return;
  ftp::model::Model m = ftp::model::load_model(path);
  WeightStore store(m);
  const std::vector<std::vector<int>> prompts = {{1}, {1, 403, 407}, {1, 261, 378, 432, 383, 286, 261, 376, 298},
                                                 {1, 300}, {1, 403, 407, 261, 378}, {1, 500, 20, 33}};
  DomainConfig cpu_cfg;
  cpu_cfg.max_batched_tokens = 8;  // chunked prefill: long prompts take several steps
  const auto want = serve(store, cpu_cfg, prompts, 48);
  for (int tp : {1, 2}) {
    DomainConfig cfg = cpu_cfg;
    cfg.backend = &cuda;
    StageLayout l = stage(m.hparams.n_layer, tp, std::vector<int>(static_cast<std::size_t>(tp), 0));
    cfg.stages = {l};
    const auto got = serve(store, cfg, prompts, 48);
    check(got == want, "stories260K domain on cuda:0 TP " + std::to_string(tp) +
                           ": 6 requests batched (chunked prefill), the CPU domain's tokens");
  }
  // Sampled (temperature 0.8, top-p 0.95, seeded): the tokens are chosen on
  // the GPU (sample_top_p) from the host's draws, as the CPU domain's
  // sampler picks them from its own logits.
  const auto want_sampled = serve(store, cpu_cfg, prompts, 48, 0.8f);
  DomainConfig cfg = cpu_cfg;
  cfg.backend = &cuda;
  cfg.stages = {stage(m.hparams.n_layer, 1, {0})};
  const auto got_sampled = serve(store, cfg, prompts, 48, 0.8f);
  std::size_t same = 0, total = 0;
  for (std::size_t i = 0; i < want_sampled.size(); ++i)
    for (std::size_t j = 0; j < want_sampled[i].size(); ++j, ++total)
      same += j < got_sampled[i].size() && got_sampled[i][j] == want_sampled[i][j];
  check(got_sampled == want_sampled, "stories260K domain on cuda:0 TP 1: 6 sampled requests (temperature 0.8, top-p 0.95), "
                                     "tokens chosen on the GPU, the CPU domain's tokens (" +
                                         std::to_string(same) + "/" + std::to_string(total) + " equal)");
}

/// Graphs captured at warm-up (issue 17): engine::Domain::warm_up at the
/// backend's warm batch sizes captures one graph per size (TP 1: one rank)
/// and nothing fails; requests served afterwards at those batch sizes
/// capture nothing new and give the CPU domain's tokens.
void graphs_at_warm_up(Backend& cuda) {
  const std::string path = ftp::test::stories260k("stories260K.bin");
  if (!std::filesystem::exists(path)) return;
  ftp::model::Model m = ftp::model::load_model(path);
  WeightStore store(m);
  DomainConfig cfg;
  cfg.max_batched_tokens = 64;
  cfg.max_running = 8;
  cfg.kv_blocks = 256;
  // Same-length prompts: every step after the first is a decode of all of them.
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back({1});
  const auto want = serve(store, cfg, prompts, 24);
  cfg.backend = &cuda;
  cfg.stages = {stage(m.hparams.n_layer, 1, {0})};
  Domain d(store, cfg);
  WarmUpPlan plan;
  plan.batch_sizes = cuda.warm_batch_sizes(cfg.max_running);
  plan.prefill_tokens = cfg.max_batched_tokens;
  plan.token = 1;
  const CudaGraphStats before = cuda_graph_stats();
  const std::uint64_t backend_before = cuda.graphs_captured();
  const WarmUpResult r = d.warm_up(plan);
  const CudaGraphStats warmed = cuda_graph_stats();
  std::string sizes;
  for (int b : r.batch_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
  // FTP_CUDA_GRAPHS unset: 1..8 (the default 1-32 up to max_running).
  check(!r.batch_sizes.empty() && r.batch_sizes == plan.batch_sizes && r.prefill_tokens == 64,
        "warm-up on cuda:0: batch sizes " + sizes + " (the graphs' up to max_running 8) after a prefill of " +
            std::to_string(r.prefill_tokens) + " tokens, in " + std::to_string(r.ms) + " ms");
  check(warmed.captures - before.captures == r.batch_sizes.size() && warmed.failures == before.failures &&
            cuda.graphs_captured() - backend_before == r.batch_sizes.size(),
        "warm-up on cuda:0: " + std::to_string(warmed.captures - before.captures) + " graphs captured (one per batch size), " +
            std::to_string(warmed.failures - before.failures) + " failed");
  check(d.kv_usage() == 0.0 && d.stats().finished == 0, "warm-up on cuda:0: every KV page free, no request counted");
  for (std::size_t n : {std::size_t{8}, std::size_t{3}}) {
    std::vector<std::vector<int>> got(n);
    for (std::size_t i = 0; i < n; ++i) {
      GenerationRequest q;
      q.id = "after-" + std::to_string(n) + "-" + std::to_string(i);
      q.prompt = prompts[i];
      q.max_tokens = 24;
      q.on_event = [&got, i](const GenerationEvent& e) {
        if (e.token >= 0) got[i].push_back(e.token);
      };
      d.submit(std::move(q));
    }
    const CudaGraphStats pre = cuda_graph_stats();
    for (int guard = 0; !d.idle() && guard < 10000; ++guard) d.step();
    const CudaGraphStats post = cuda_graph_stats();
    bool same = true;
    for (std::size_t i = 0; i < n; ++i) same = same && got[i] == want[i];
    check(post.captures == pre.captures && post.failures == pre.failures && same,
          "after warm-up on cuda:0: " + std::to_string(n) + " requests decoded at batch " + std::to_string(n) + " capture " +
              std::to_string(post.captures - pre.captures) + " new graphs; tokens " + (same ? "equal" : "differ from") +
              " the CPU domain's");
  }
}

/// Logits of the CUDA backend against the CPU backend for one prefill of 3
/// sequences (21 rows: cuBLAS) and then decode steps of the 3 (GEMV; graphs).
/// Q4_K_M (Q4_K with Q6_K for output, some attn_v and ffn_down) and Q4_0
/// run the block-type kernels with the activations quantized as the CPU
/// backend quantizes them, so they are held to the Q8_0 bound; their
/// shapes are 512 wide so that TP 2 splits the K-quants' rows of 256 on
/// whole blocks. They run twice: with the integer-dot GEMV (the default)
/// at TP 1 and TP 2, and with the float one (FTP_CUDA_INT8_DOTS=0) at TP 1.
void synthetic_logits(Backend& cuda, const std::filesystem::path& dir) {
  CudaBackendOptions float_opts = CudaBackendOptions::from_env();
  float_opts.int8_dots = false;
  const std::unique_ptr<Backend> float_dots = make_cuda_backend(float_opts);
  struct Kind {
    DType dt;
    bool q4_k_m;
    const char* name;
  };
  for (const Kind kind : {Kind{DType::f32, false, "F32"}, Kind{DType::f16, false, "F16"}, Kind{DType::bf16, false, "BF16"},
                          Kind{DType::q8_0, false, "Q8_0"}, Kind{DType::q4_k, true, "Q4_K_M"},
                          Kind{DType::q4_0, false, "Q4_0"}}) {
    const DType dt = kind.dt;
    ftp::testing::SyntheticShape s;
    s.n_layer = 3;
    s.n_embd = kind.q4_k_m ? 512 : 256;
    s.n_ff = kind.q4_k_m ? 1024 : 512;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_vocab = 700;
    s.n_ctx = 256;
    s.dtype = dt;
    s.q4_k_m = kind.q4_k_m;
    s.seed = 11;
    s.stddev = 0.05f;
    const std::string file = (dir / (std::string("synthetic-") + kind.name + ".gguf")).string();
    ftp::testing::write_synthetic_gguf(file, s);
    ftp::model::Model m = ftp::model::load_model(file);
    WeightStore store(m);
    const double limit = dt == DType::f32 ? 1e-6 : 1e-3;
    const bool block = dt != DType::q8_0 && ftp::model::dtype_block(dt) > 1;
    for (auto gpus : {std::vector<int>{0}, std::vector<int>{0, 0}, std::vector<int>{}}) {
      // {}: TP 1 again on the float-dot backend (block types only).
      const bool float_path = gpus.empty();
      if (float_path && !block) continue;
      if (float_path) gpus = {0};
      const int tp = static_cast<int>(gpus.size());
      Executor cpu(store, {stage(s.n_layer, tp, {})}, 64, 16, nullptr, 64);
      Executor gpu(store, {stage(s.n_layer, tp, gpus)}, 64, 16, float_path ? float_dots.get() : &cuda, 64);
      std::vector<std::vector<int>> blocks = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}};
      std::vector<SeqChunk> chunks = {{&blocks[0], 0, {1, 5, 9, 13, 17, 21, 25, 29}, true},
                                      {&blocks[1], 0, {2, 4, 6}, true},
                                      {&blocks[2], 0, {3, 300, 301, 302, 303, 304, 305, 306, 307, 308}, true}};
      double worst = 0;
      for (int step = 0; step < 6; ++step) {
        auto a = cpu.forward(chunks, 1), b = gpu.forward(chunks, 1);
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, nmse(b[i], a[i]));
        for (std::size_t i = 0; i < chunks.size(); ++i) {
          chunks[i].start_pos += static_cast<int>(chunks[i].tokens.size());
          chunks[i].tokens = {argmax(a[i])};
        }
      }
      char line[256];
      std::snprintf(line, sizeof(line), "synthetic %s TP %zu on cuda:0%s: logits vs CPU, prefill 21 rows + 5 decode steps of 3: nmse %.3g (limit %.0e)",
                    kind.name, gpus.size(), float_path ? " (float dots)" : "", worst, limit);
      check(worst <= limit, line);
      // Tokens chosen on the GPU (argmax; top-p with draws exact in float)
      // against choose_token over the same step's logits from the GPU.
      const std::vector<TokenChoice> choices = {{0.0f, 1.0f, 0.0}, {0.9f, 0.95f, 0.375}, {1.2f, 1.0f, 0.8125}};
      const auto logits = gpu.forward(chunks, 1);
      const auto ids = gpu.forward_choose(chunks, 1, choices);
      const auto greedy_ids = gpu.forward_choose(chunks, 1, {{0.0f, 1.0f, 0.0}, {0.0f, 1.0f, 0.0}, {0.0f, 1.0f, 0.0}});
      bool same = ids.size() == 3 && greedy_ids.size() == 3;
      for (std::size_t i = 0; same && i < 3; ++i)
        same = ids[i] == choose_token(logits[i].data(), logits[i].size(), choices[i]) && greedy_ids[i] == argmax(logits[i]);
      check(same, std::string("synthetic ") + kind.name + " TP " + std::to_string(gpus.size()) +
                      " on cuda:0: tokens chosen on the GPU (argmax_rows, sample_top_p) = choose_token over its logits");
    }
  }
}

/// A domain of TP 2 (both ranks on cuda:0) built while a TP 1 domain of the
/// same weights serves: the weights are resident, only views, KV and
/// buffers are made.
/// A 4-layer BF16 synthetic model of 512 wide (two of the checks below).
ftp::testing::SyntheticShape small_bf16_shape() {
  ftp::testing::SyntheticShape s;
  s.n_layer = 4;
  s.n_embd = 512;
  s.n_ff = 1024;
  s.n_head = 8;
  s.n_head_kv = 8;
  s.n_vocab = 1000;
  s.dtype = DType::bf16;
  return s;
}

void another_gear(Backend& cuda, const std::filesystem::path& dir) {
  ftp::testing::SyntheticShape s = small_bf16_shape();
  s.stddev = 0.08f;  // logits far from ties: TP 1 and TP 2 sum in different orders
  const std::string file = (dir / "gear.gguf").string();
  ftp::testing::write_synthetic_gguf(file, s);
  ftp::model::Model m = ftp::model::load_model(file);
  WeightStore store(m);
  // The KV room of a TP 2 domain on cuda:0 (Service's kv_cache_cap applies
  // to it): before the weights are there, what is free less their bytes,
  // halved between the two ranks; with them resident, what is free, halved.
  std::vector<RankSpec> two(2);
  for (int r = 0; r < 2; ++r) {
    two[static_cast<std::size_t>(r)].rank = r;
    two[static_cast<std::size_t>(r)].tp = 2;
    two[static_cast<std::size_t>(r)].n_layers = s.n_layer;
    two[static_cast<std::size_t>(r)].first_stage = two[static_cast<std::size_t>(r)].last_stage = true;
    two[static_cast<std::size_t>(r)].gpu = 0;
  }
  std::uint64_t weight_bytes = 0;
  for (const auto& L : m.weights.layers)
    for (const ftp::model::TensorView* t : L.tensors()) weight_bytes += t->bytes;
  weight_bytes += m.weights.tok_embd.bytes;
  std::size_t free_before = 0, total = 0;
  cudaMemGetInfo(&free_before, &total);
  const auto room_before = cuda.kv_room_bytes(store, two);
  auto t0 = std::chrono::steady_clock::now();
  Executor first(store, {stage(s.n_layer, 1, {0})}, 64, 16, &cuda, 64);
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  Executor second(store, {stage(s.n_layer, 2, {0, 0})}, 64, 16, &cuda, 64);
  const double second_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("info domain build on cuda:0: first (uploads weights) %.1f ms, another gear (TP 2, weights resident) %.1f ms\n",
              first_ms, second_ms);
  std::size_t free_after = 0;
  cudaMemGetInfo(&free_after, &total);
  const auto room_after = cuda.kv_room_bytes(store, two);
  // Each pair of readings is taken back to back: within 4 MiB (the
  // driver's granularity; the norm vectors and classifier are not in
  // weight_bytes), well under the weights' own size.
  const double slack = 4.0 * (1 << 20);
  const double want_before = (static_cast<double>(free_before) - static_cast<double>(weight_bytes)) / 2;
  const double want_after = static_cast<double>(free_after) / 2;
  check(room_before.size() == 2 && room_before[0] == room_before[1] &&
            std::abs(static_cast<double>(room_before[0]) - want_before) < slack && room_after.size() == 2 &&
            std::abs(static_cast<double>(room_after[0]) - want_after) < slack,
        "KV room of TP 2 on cuda:0: (free - weights not resident) / 2 before the upload (" +
            std::to_string(room_before.empty() ? 0 : room_before[0] >> 20) + " MiB), free / 2 after (" +
            std::to_string(room_after.empty() ? 0 : room_after[0] >> 20) + " MiB)");
  auto a = greedy(first, {1, 2, 3}, 8), b = greedy(second, {1, 2, 3}, 8);
  check(a == b, "TP 1 and TP 2 domains on shared resident weights: the same greedy tokens");
}

/// Issue 17: each GPU holds the union of its ranks' shards, not whole
/// tensors: rank 0 of TP 4 alone, then the TP 1 union on top (the rest),
/// a TP 2 domain after it (0 bytes more), release (all freed).
void shard_union_on_device(Backend& cuda, const std::filesystem::path& dir) {
  ftp::testing::SyntheticShape s = small_bf16_shape();
  const std::string file = (dir / "union.gguf").string();
  ftp::testing::write_synthetic_gguf(file, s);
  ftp::model::Model m = ftp::model::load_model(file);
  WeightStore store(m);
  const ftp::engine::RankShard quarter{0, s.n_layer, 4, 0, true, true};
  const ftp::engine::RankShard whole{0, s.n_layer, 1, 0, true, true};
  cuda.make_resident(store, {{0, {quarter}}});
  const std::uint64_t q = cuda.resident_bytes(store)[0];
  const std::uint64_t want_q = store.shard_union({quarter}).bytes();
  check(q == want_q, "rank 0 of TP 4 on cuda:0 holds its shard union: " + std::to_string(q) + " bytes, the store's union " +
                         std::to_string(want_q));
  cuda.make_resident(store, {{0, {quarter, whole}}});
  const std::uint64_t all = cuda.resident_bytes(store)[0];
  const std::uint64_t want_all = store.shard_union({whole}).bytes();
  // The TP 1 union on top of the quarter: each whole tensor is one new
  // segment and the quarter's stay (no partial upload of the rest), so
  // the total is at most both; a table's union made at once (below) has
  // no such overlap.
  check(all >= want_all && all <= want_all + want_q,
        "TP 1 after TP 4 rank 0 on cuda:0: " + std::to_string(all) + " bytes for a union of " + std::to_string(want_all));
  check(cuda.release_device(store, 0) == all && cuda.resident_bytes(store)[0] == 0,
        "release mode: cuda:0 frees every weight byte");
  cuda.make_resident(store, {{0, {whole, quarter, {0, s.n_layer, 2, 1, true, true}}}});
  const std::uint64_t nested = cuda.resident_bytes(store)[0];
  check(std::abs(static_cast<double>(nested) - static_cast<double>(want_all)) <= 0.01 * static_cast<double>(want_all),
        "the table's union at once on cuda:0 (TP 1, 2, 4 nested): " + std::to_string(nested) + " bytes, union " +
            std::to_string(want_all) + " (within 1 %)");
  {
    Executor tp2(store, {stage(s.n_layer, 2, {0, 0})}, 64, 16, &cuda, 64);
    check(cuda.resident_bytes(store)[0] == nested, "a TP 2 domain on the resident union uploads 0 bytes");
  }
}

/// Release weight mode and the communicator pool through the backend
/// interface the service's WeightResidency and Service::start use: a GPU's
/// union freed (every byte) and made resident again (the same bytes), and
/// stages whose communicators were made ahead (prepare_communicators)
/// built without making another (communicator_stats).
void release_and_pool_on_device(Backend& cuda, const std::filesystem::path& dir, int n_gpus) {
  ftp::testing::SyntheticShape s = small_bf16_shape();
  const std::string file = (dir / "release.gguf").string();
  ftp::testing::write_synthetic_gguf(file, s);
  ftp::model::Model m = ftp::model::load_model(file);
  WeightStore store(m);
  const std::vector<ftp::engine::RankShard> table{{0, s.n_layer, 1, 0, true, true}, {0, s.n_layer, 2, 0, true, true}};
  cuda.make_resident(store, {{0, table}});
  const std::uint64_t held = cuda.resident_bytes(store)[0];
  const std::uint64_t freed = cuda.release_device(store, 0);
  check(freed == held && cuda.resident_bytes(store)[0] == 0,
        "release mode round trip: cuda:0 frees its union at retire: " + std::to_string(freed) + " of " + std::to_string(held) + " bytes");
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t back = cuda.make_resident(store, {{0, table}})[0];
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  check(back == freed, "release mode round trip: the reserve uploads exactly those bytes back: " + std::to_string(back) + " in " +
                           std::to_string(ms) + " ms");
  auto spec = [](int rank, int tp, int gpu) {
    ftp::engine::RankSpec r;
    r.rank = rank;
    r.tp = tp;
    r.gpu = gpu;
    return r;
  };
  // Ranks on one GPU share the same-GPU all-reduce: nothing to pool.
  std::vector<std::vector<ftp::engine::RankSpec>> stages{{spec(0, 2, 0), spec(1, 2, 0)}};
  if (n_gpus > 1) stages.push_back({spec(0, 2, 0), spec(1, 2, 1)});
  cuda.prepare_communicators(stages);
  const auto before = cuda.communicator_stats();
  {
    Executor one_gpu(store, {stage(s.n_layer, 2, {0, 0})}, 64, 16, &cuda, 64);
    if (n_gpus > 1) Executor two_gpus(store, {stage(s.n_layer, 2, {0, 1})}, 64, 16, &cuda, 64);
  }
  const auto after = cuda.communicator_stats();
  check(after.created == before.created,
        "communicator pool: stages prepared ahead make " + std::to_string(after.created - before.created) +
            " communicators when built (" + std::to_string(n_gpus) + " GPU(s); pool made " + std::to_string(after.created) +
            " in " + std::to_string(after.create_ms) + " ms)");
  // The root spans the table's GPUs only (0 and 1 here, whatever the host
  // has), none with one GPU; a table without a multi-GPU stage drops it.
  auto names = [](const std::vector<std::string>& v) {
    std::string t;
    for (const auto& d : v) t += (t.empty() ? "" : ",") + d;
    return "[" + t + "]";
  };
  const std::vector<std::string> spanned = cuda.communicator_devices();
  check(n_gpus > 1 ? spanned == std::vector<std::string>{"cuda:0", "cuda:1"} : spanned.empty(),
        "communicator pool: the NCCL root spans the table's GPUs " + names(spanned) + " of " + std::to_string(n_gpus));
  cuda.prepare_communicators({{spec(0, 2, 0), spec(1, 2, 0)}});
  check(cuda.communicator_devices().empty(),
        "communicator pool: a reload without a multi-GPU stage leaves no root: " + names(cuda.communicator_devices()));
  cuda.release_device(store, 0);
}

}  // namespace

/// The arch-refs F32 models (llama, Llama 3 rope_freqs + tied, qwen2,
/// qwen3) against llama.cpp on the CUDA backend, at TP 1 and the largest
/// TP x PP (every rank on GPU 0), as tests/engine/test_arch_refs.cpp does on
/// the CPU.
void arch_refs(Backend& cuda) {
  using namespace ftp::test;
  const std::string refs_path = arch_refs_dir() + "/references.jsonl";
  if (!std::filesystem::exists(refs_path)) {
    std::printf("skip arch-refs: %s not found\n", refs_path.c_str());
    return;
  }
  const auto refs = read_llama_refs(refs_path);
  for (const RefModel& rm : supported_ref_models()) {
    if (rm.weights != RefWeights::f32) continue;
    const std::string file = arch_refs_dir() + "/" + rm.file;
    if (!std::filesystem::exists(file)) {
      std::printf("skip arch-refs %s: not found\n", file.c_str());
      continue;
    }
    const ftp::model::Model m = ftp::model::load_model(file);
    const WeightStore store(m);
    const RefTolerance tol = tolerance_of(rm.weights);
    for (const RefGear& gear : ref_gears(m.hparams))
      for (const LlamaRef& ref : refs_of_model(refs, rm.file)) {
        const RefOutcome o = run_llama_ref(store, gear, ref, tol, &cuda);
        char line[160];
        std::snprintf(line, sizeof line, "logits %.2e", o.logit_error);
        const std::string what = "arch-refs " + std::string(rm.file) + " \"" + ref.prompt + "\" at " + gear.name + ": ";
        check(o.logit_error < tol.logit_rel, what + line);
        check(o.token_failure.empty(), what + "greedy tokens" + (o.token_failure.empty() ? "" : ": " + o.token_failure));
      }
  }
}

/// The vocabulary-parallel head's gather (RankBackend::gather_columns) on
/// a vocabulary that 2 and 4 do not divide (701 rows): TP 2 and TP 4 on
/// cuda:0 (the same-GPU communicator: rank 0's stream copies each slice)
/// and, with two GPUs or more, TP 2 over cuda:0 and cuda:1 (NCCL
/// send/receive; 3 rows through rank 0's staging buffer, 1 row straight
/// into the full row): the logits against the CPU backend's at the same
/// TP, and greedy tokens equal to TP 1's on the GPU.
void vocab_head_on_device(Backend& cuda, const std::filesystem::path& dir, int n_gpus) {
  ftp::testing::SyntheticShape s;
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 8;
  s.n_head_kv = 4;
  s.n_vocab = 701;
  s.n_ctx = 256;
  s.dtype = DType::f32;
  s.seed = 13;
  s.stddev = 0.08f;  // logits far from ties: TP 1 and TP n sum in different orders
  const std::string file = (dir / "uneven-vocab.gguf").string();
  ftp::testing::write_synthetic_gguf(file, s);
  ftp::model::Model m = ftp::model::load_model(file);
  WeightStore store(m);
  Executor tp1(store, {stage(s.n_layer, 1, {0})}, 64, 16, &cuda, 64);
  const std::vector<int> want = greedy(tp1, {1, 700, 350, 2}, 12);
  std::vector<std::vector<int>> layouts = {{0, 0}, {0, 0, 0, 0}};
  if (n_gpus > 1) layouts.push_back({0, 1});
  for (const auto& gpus : layouts) {
    const int tp = static_cast<int>(gpus.size());
    const std::string where = "TP " + std::to_string(tp) + (gpus[1] == 0 ? " on cuda:0" : " on cuda:0 and cuda:1");
    Executor cpu(store, {stage(s.n_layer, tp, {})}, 64, 16, nullptr, 64);
    Executor gpu(store, {stage(s.n_layer, tp, gpus)}, 64, 16, &cuda, 64);
    std::vector<std::vector<int>> blocks = {{0}, {1}, {2}};
    const std::vector<SeqChunk> three = {{&blocks[0], 0, {1, 700, 5}, true},
                                         {&blocks[1], 0, {350, 351}, true},
                                         {&blocks[2], 0, {699, 2, 3, 4}, true}};
    const std::vector<SeqChunk> one = {{&blocks[0], 0, {1, 700, 5}, true}};
    double worst = 0;
    for (const auto* chunks : {&three, &one}) {
      auto a = cpu.forward(*chunks, 1), b = gpu.forward(*chunks, 1);
      for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, nmse(b[i], a[i]));
    }
    char line[256];
    std::snprintf(line, sizeof(line), "vocab-parallel head, vocabulary 701, %s: logits of 3 rows and of 1 row vs CPU: nmse %.3g (limit 1e-6)",
                  where.c_str(), worst);
    check(worst <= 1e-6, line);
    Executor fresh(store, {stage(s.n_layer, tp, gpus)}, 64, 16, &cuda, 64);
    check(greedy(fresh, {1, 700, 350, 2}, 12) == want, "vocab-parallel head, vocabulary 701, " + where +
                                                           ": 12 greedy tokens equal TP 1's");
  }
}

int main() {
  std::vector<ftp::hardware::GpuInfo> gpus;
  if (int rc = ftp::test::discover_gpus_or_skip(gpus); rc != 0) return rc;
  const auto dir = std::filesystem::temp_directory_path() / ("ftp-cuda-engine-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  int rc = 0;
  try {
    Backend& cuda = cuda_backend();
    stories260k_goldens();
    stories260k_domain(cuda);
    graphs_at_warm_up(cuda);
    synthetic_logits(cuda, dir);
    another_gear(cuda, dir);
    shard_union_on_device(cuda, dir);
    release_and_pool_on_device(cuda, dir, static_cast<int>(gpus.size()));
    vocab_head_on_device(cuda, dir, static_cast<int>(gpus.size()));
    arch_refs(cuda);
    if (gpus.size() > 1) {
      std::vector<int> all;
      for (const auto& g : gpus) all.push_back(g.index);
      ftp::comm::NcclPool& pool = ftp::comm::NcclPool::instance();
      const double ms = pool.span(all);
      std::printf("info nccl pool: root over %d GPUs created in %.1f ms\n", pool.n_devices(), ms);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    rc = 1;
  }
  std::filesystem::remove_all(dir);
  if (rc) return rc;
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
  return failures == 0 ? 0 : 1;
}
