// SPDX-License-Identifier: Apache-2.0
// engine-bench: the CPU engine on a synthetic Llama model (tests/support),
// by default TinyLlama's ~1.1 B-parameter shape, in F16, Q8_0, Q4_0 and
// Q4_K_M (llama.cpp's recipe: Q4_K, Q6_K for output, some attn_v and
// ffn_down; random quants and scales, tests/support's random_blocks). For each
// dtype it writes the model to a temp dir, loads it (weights mapped, not
// copied) and measures, on one domain of TP 1 (one rank thread):
//   prefill tokens/s (one prompt in one step),
//   decode tokens/s at batch 1 and batch 16 (aggregate),
//   weight bytes/s = bytes of the matrices read per decode step x steps/s,
//   that as a fraction of the STREAM triad bandwidth measured in the same
//   run with the same number of threads (ftp-probe's measure_cpu_triad_gbs),
//   peak RSS against weights + KV cap + 10 %.
// --rank-threads gives each rank that many threads (0, the default: this
// process's CPUs over the ranks, as ftp-serve's device of them; the products split by rows,
// engine/intra_op.hpp), each value a run beside the others; the triad of
// each run has as many threads as its domain computes with (tp x threads
// per rank), and the 1- and 2-thread triads are always measured.
// Each dtype runs in a child process so that its peak RSS is its own.
// By default it also runs a domain over the machine's cores: TP = the
// largest power of two <= the hardware threads, at most 8 (rank threads),
// compared with a triad of as many threads; --tp picks the degrees. --kernels reference times ops::matmul_reference (the portable
// tile + sgemm path) instead of the fused kernels.
//
// --matvec N also times the batch-1 products alone (ops::matmul on each
// matrix kind and dtype, every layer's in turn, N passes): their GB/s
// against the same triad, and the step's time outside them at TP 1.
// --kernel-rate N times the batch-1 quantized kernels on their own (Q4_0,
// Q4_K, Q6_K: ops::matmul at t = 1 on a random 256 x 2048 matrix that
// stays in L2, best of N, the best and avx2 kernel families interleaved
// call by call so that a loaded machine slows both alike), in GB/s of
// weights and in cycles per block at the clock a dependent-add loop
// measures in the same run: the rate one core computes the products at
// when memory is no limit, against which the triad fraction can be read.
// Output: one JSON document (kind ftp.engine-bench/v1) on stdout, a table on
// stderr. Goals: batch-1 bandwidth fraction >= 0.8; batch-16 tokens/s >= 8 x
// batch 1. --min-bw-fraction turns the first into a gate (exit 6).
// The roofline column is the largest bN/b1 the machine allows: batch N runs
// at best at the compute rate measured in the same run with the rank
// threads, so bN/b1 <= min(N, peak ops/s / batch-1 ops/s) (2 ops per weight
// and token); the JSON also gives the bound for a batch 1 at 0.8 of the
// triad bandwidth. The peak is the SGEMM FLOP/s (ftp-probe's
// measure_cpu_gemm_tflops) for float weights, and for Q8_0, whose kernels
// multiply int8 with AVX-512 VNNI, the vpdpbusd rate
// (measure_cpu_int8_tops; SGEMM where the CPU has no VNNI).
//
// Q8_0 on the CPU backend reads the store's packed copy (PackedWeights,
// made once before the domain: the "layout" column says packed, the JSON
// gives its bytes and packing time); FTP_Q8_PACK=0 in the environment reads
// the mapped file's blocks instead (the A/B of the packed layout). The other
// block-quantized matrices are read from the store's copy of them on huge
// pages (layout "copy"); --huge-copy on,off runs each dtype with the copy
// and with the mapped file's pages side by side (FTP_HUGE_COPY=0 in the
// child for off).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <random>
#include <sstream>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/measure.hpp"
#include "cli/tool.hpp"
#include "core/error.hpp"
#include "engine/domain.hpp"
#include "engine/intra_op.hpp"
#include "engine/ops.hpp"
#include "model/model.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

/// TP 1 and, where the machine has more, the largest power of two <= its
/// hardware threads, at most 8: one core and the whole machine.
std::vector<int> default_tps() {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int tp = 1;
  while (tp * 2 <= std::min(hw, 8)) tp *= 2;
  return tp > 1 ? std::vector<int>{1, tp} : std::vector<int>{1};
}

struct Options {
  std::string shape = "1b";
  std::vector<std::string> dtypes = {"f16", "q8_0", "q4_0", "q4_k_m"};
  std::vector<int> tps;   // empty: 1 and the machine's cores (default_tps)
  std::vector<int> rank_threads = {0};  // threads per rank, each a run; 0: the engine's default
  std::vector<std::string> huge_copy = {"on"};  // on, off: each a run (off: FTP_HUGE_COPY=0)
  int steps = 8;          // timed decode steps per batch size
  int warmup = 2;         // untimed decode steps first
  int prompt = 128;       // prefill tokens
  int context = 16;       // prompt tokens of each decoding sequence
  int batch = 16;
  std::string kernels = "fast";
  std::string dir;
  bool keep = false;
  int matvec = 0;         // --matvec passes (0: none)
  int kernel_rate = 0;    // --kernel-rate calls per kernel family (0: none)
  int paired = 0;         // --paired rounds of (triad, batch-1 steps) (0: none)
  bool paired_mapped = false;  // --paired-mapped: each round also times a domain reading the mapped file
};

testing::SyntheticShape shape_of_dims(const std::string& name);

/// The names --dtype takes (q4_k_m: the Q4_K_M mix of Q4_K and Q6_K).
const char* const kDtypes = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_m";

model::DType dtype_of(const std::string& s) {
  static const std::map<std::string, model::DType> names = {
      {"f32", model::DType::f32},   {"f16", model::DType::f16},   {"bf16", model::DType::bf16},
      {"q8_0", model::DType::q8_0}, {"q4_0", model::DType::q4_0}, {"q4_1", model::DType::q4_1},
      {"q5_0", model::DType::q5_0}, {"q5_1", model::DType::q5_1}, {"q2_k", model::DType::q2_k},
      {"q3_k", model::DType::q3_k}, {"q4_k", model::DType::q4_k}, {"q5_k", model::DType::q5_k},
      {"q6_k", model::DType::q6_k}, {"q4_k_m", model::DType::q4_k}};
  auto it = names.find(s);
  if (it == names.end()) throw InputError("--dtype: expected one of " + std::string(kDtypes) + ", got '" + s + "'");
  return it->second;
}

testing::SyntheticShape shape_of(const std::string& name, const std::string& dt_name) {
  testing::SyntheticShape s = shape_of_dims(name);
  s.dtype = dtype_of(dt_name);
  s.q4_k_m = dt_name == "q4_k_m";
  s.seed = 42;
  return s;
}

testing::SyntheticShape shape_of_dims(const std::string& name) {
  testing::SyntheticShape s;
  if (name == "1b") {  // TinyLlama 1.1B
    s.n_layer = 22, s.n_embd = 2048, s.n_ff = 5632, s.n_head = 32, s.n_head_kv = 4, s.n_vocab = 32000;
    s.n_ctx = 2048;
  } else if (name == "tiny") {
    // Widths of whole K-quant super-blocks, also per rank at TP 2.
    s.n_layer = 2, s.n_embd = 512, s.n_ff = 512, s.n_head = 8, s.n_head_kv = 2, s.n_vocab = 512, s.n_ctx = 512;
  } else {
    throw InputError("--shape: expected 1b or tiny, got '" + name + "'");
  }
  return s;
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Bytes of weight matrices one decode step reads: every layer's matrices
/// and the classifier (the embedding rows of the step's tokens are noise).
std::uint64_t step_bytes(const model::Model& m) {
  std::uint64_t b = m.weights.output.bytes;
  for (const auto& L : m.weights.layers)
    b += L.wq.bytes + L.wk.bytes + L.wv.bytes + L.wo.bytes + L.w_gate.bytes + L.w_up.bytes + L.w_down.bytes;
  return b;
}

/// Weight elements (multiply-adds per token) of the matrices a decode step reads.
std::uint64_t step_elements(const model::Model& m) {
  auto n = [](const model::TensorView& t) { return static_cast<std::uint64_t>(t.rows) * static_cast<std::uint64_t>(t.cols); };
  std::uint64_t e = n(m.weights.output);
  for (const auto& L : m.weights.layers) e += n(L.wq) + n(L.wk) + n(L.wv) + n(L.wo) + n(L.w_gate) + n(L.w_up) + n(L.w_down);
  return e;
}

std::vector<int> random_prompt(int n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> id(3, vocab - 1);
  std::vector<int> p = {1};
  while (static_cast<int>(p.size()) < n) p.push_back(id(rng));
  return p;
}

engine::GenerationRequest request(std::string id, std::vector<int> prompt, int max_tokens) {
  engine::GenerationRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.on_event = [](const engine::GenerationEvent& e) {
    if (e.finish_reason == ftp::engine::FinishReason::error) throw Error("request " + e.request_id + ": " + e.error);
  };
  return r;
}

/// --kernel-rate: the batch-1 kernels of the quantized types on one core
/// with the weights in L2 (256 x 2048, at most 590 KB), best of `calls`
/// calls per kernel family, best and avx2 interleaved call by call. The
/// clock: the best of 200 loops of 10^6 dependent adds (one a cycle).
json::Json time_kernel_rate(int calls, const std::vector<int>& split_threads) {
  using engine::ops::MatmulKernels;
  double ghz = 0;  // no clock off x86: cycles are then 0
#if defined(__x86_64__)
  double loop_s = 1e9;
  for (int p = 0; p < 200; ++p) {
    const auto t0 = Clock::now();
    long v = 0;
    for (long i = 0; i < 250000; ++i) asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(v));
    loop_s = std::min(loop_s, since(t0));
  }
  ghz = 1e6 / loop_s / 1e9;
#endif
  json::Json rows = json::Json::array();
  const int n = 256, k = 2048;
  const MatmulKernels was = engine::ops::matmul_kernels();
  for (model::DType dt : {model::DType::q4_0, model::DType::q4_k, model::DType::q6_k}) {
    const std::int64_t elems = static_cast<std::int64_t>(n) * k, blocks = elems / model::dtype_block(dt);
    std::vector<std::uint8_t> bytes(model::dtype_bytes(dt, elems));
    testing::random_blocks(dt, bytes.data(), blocks, 11, 1.0f);
    model::TensorView tv;
    tv.name = "kernel-rate";
    tv.dtype = dt;
    tv.rows = n;
    tv.cols = k;
    tv.data = bytes.data();
    tv.bytes = bytes.size();
    const engine::MatView w{&tv, 0, n, 0, k};
    std::vector<float> x(static_cast<std::size_t>(k)), out(static_cast<std::size_t>(n));
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto& v : x) v = g(rng);
    const MatmulKernels fams[2] = {MatmulKernels::best, MatmulKernels::avx2};
    double best[2] = {1e9, 1e9};
    for (int c = 0; c < calls; ++c)
      for (int f = 0; f < 2; ++f) {
        engine::ops::set_matmul_kernels(fams[f]);
        const auto t0 = Clock::now();
        engine::ops::matmul(x.data(), w, out.data(), 1);
        best[f] = std::min(best[f], since(t0));
      }
    for (int f = 0; f < 2; ++f)
      rows.push_back({{"dtype", model::dtype_name(dt)}, {"kernels", f == 0 ? "best" : "avx2"}, {"threads", 1},
                      {"bytes_per_s", static_cast<double>(bytes.size()) / best[f]},
                      {"cycles_per_block", best[f] * ghz * 1e9 / static_cast<double>(blocks)}});
    // The best kernels split by rows over N threads as a rank splits them
    // (engine::split_matmul): each thread's rows stay in its core's L2.
    for (int nt : split_threads) {
      engine::IntraOpPool pool(nt, nullptr);
      double b = 1e9;
      for (int c = 0; c < calls; ++c) {
        const auto t0 = Clock::now();
        engine::split_matmul(pool, x.data(), w, nullptr, out.data(), 1);
        b = std::min(b, since(t0));
      }
      rows.push_back({{"dtype", model::dtype_name(dt)}, {"kernels", "best"}, {"threads", nt},
                      {"helper_share", static_cast<double>(pool.helper_parts()) / static_cast<double>(pool.parts_run())},
                      {"bytes_per_s", static_cast<double>(bytes.size()) / b},
                      {"cycles_per_block", b * ghz * 1e9 * nt / static_cast<double>(blocks)}});
    }
  }
  engine::ops::set_matmul_kernels(was);
  return {{"clock_ghz", ghz}, {"rows", n}, {"cols", k}, {"calls", calls}, {"kernels", rows}};
}

/// --matvec: the batch-1 products alone, one matrix kind at a time (wq .. w_down,
/// output), split by dtype (Q4_K_M mixes Q4_K and Q6_K), each pass over every
/// layer's matrix of that kind so that the weights stream from memory as in a
/// decode step (one layer's matrix alone would sit in the L3). The kernels
/// are the backend's (ops::matmul, or matmul_packed for a packed Q8_0; the
/// huge-page copy of the other quantized matrices where the store has one).
json::Json time_matvec(const model::Model& m, const engine::PackedWeights* packed, int passes) {
  struct Kind {
    std::vector<const model::TensorView*> t;
    std::uint64_t bytes = 0;
    double seconds = 0;
  };
  std::map<std::string, Kind> kinds;
  const char* names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up"};
  auto add = [&](const std::string& name, const model::TensorView* t) {
    Kind& k = kinds[name + " " + model::dtype_name(t->dtype)];
    k.t.push_back(t);
    k.bytes += t->bytes;
  };
  for (const auto& L : m.weights.layers) {
    const auto mats = L.matrices();
    for (int i = 0; i < 7; ++i) add(names[i], mats[static_cast<std::size_t>(i)]);
  }
  add("output", &m.weights.output);
  std::int64_t widest = 0, tallest = 0;
  for (const auto& [name, k] : kinds)
    for (const auto* t : k.t) widest = std::max(widest, t->cols), tallest = std::max(tallest, t->rows);
  std::vector<float> x(static_cast<std::size_t>(widest)), out(static_cast<std::size_t>(tallest));
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& v : x) v = g(rng);
  auto product = [&](const model::TensorView* t) {
    const engine::MatView w{t, 0, t->rows, 0, t->cols};
    if (const engine::PackedQ8* p = packed ? packed->find(t) : nullptr) return engine::ops::matmul_packed(x.data(), *p, w, out.data(), 1);
    const model::TensorView* c = packed ? packed->copy_of(t) : nullptr;
    engine::ops::matmul(x.data(), c ? engine::MatView{c, 0, t->rows, 0, t->cols} : w, out.data(), 1);
  };
  // Interleave the kinds pass by pass (as a step does), timing each kind's run of layers.
  for (int pass = -1; pass < passes; ++pass)
    for (auto& [name, k] : kinds) {
      const auto t0 = Clock::now();
      for (const auto* t : k.t) product(t);
      if (pass >= 0) k.seconds += since(t0);
    }
  json::Json a = json::Json::array();
  for (const auto& [name, k] : kinds)
    a.push_back({{"matrices", name}, {"count", k.t.size()}, {"bytes", k.bytes},
                 {"seconds_per_pass", k.seconds / passes}, {"bytes_per_s", static_cast<double>(k.bytes) * passes / k.seconds}});
  return a;
}

/// One dtype at one TP degree with `threads` per rank (0: the engine's
/// default), in this (child) process.
json::Json run_one(const Options& o, const std::string& dt_name, int tp, int threads) {
  const testing::SyntheticShape shape = shape_of(o.shape, dt_name);
  const std::string path = o.dir + "/synthetic-" + o.shape + "-" + dt_name + ".gguf";
  auto t0 = Clock::now();
  if (!std::filesystem::exists(path)) testing::write_synthetic_gguf(path, shape);
  const double write_s = since(t0);
  model::Model m = model::load_model(path);
  engine::WeightStore store(m);
  const auto& hp = m.hparams;
  // The store's one-time preparation for the CPU backend (packing Q8_0),
  // which the domain would otherwise do when it builds its stage.
  t0 = Clock::now();
  const engine::PackedWeights* packed = store.packed_for_cpu();
  const double pack_s = since(t0);

  engine::DomainConfig cfg;
  cfg.stages = {engine::StageLayout{0, hp.n_layer, tp}};
  // 0: this process's CPUs over the ranks (the domain has no devices, so
  // the engine's own default would be one thread a rank).
  cfg.stages[0].rank_threads =
      threads > 0 ? threads : std::max(1, static_cast<int>(hardware::usable_cpu_ids().size()) / tp);
  const int per_rank = engine::resolve_rank_threads(cfg.stages)[0][0];
  cfg.block_tokens = 16;
  const int per_seq = std::max(o.prompt, o.context) + o.warmup + std::max(o.steps, (o.steps + 1) * o.paired) + 2;
  cfg.kv_blocks = o.batch * ((per_seq + cfg.block_tokens - 1) / cfg.block_tokens);
  cfg.max_batched_tokens = std::max(o.prompt, o.batch * o.context);
  cfg.max_running = std::max(o.batch, 1);
  engine::Domain d(store, cfg);
  const int kv_per_rank_heads = tp <= hp.n_head_kv ? hp.n_head_kv / tp : 1;
  const std::uint64_t kv_bytes = 2ull * hp.n_layer * tp * kv_per_rank_heads * cfg.block_tokens * hp.head_dim *
                                 2 /* 16-bit pages, the default */ * static_cast<std::uint64_t>(cfg.kv_blocks);
  const std::uint64_t per_step = step_bytes(m);

  // Prefill: one prompt in one step (max_tokens 1: the step that computes it ends it).
  d.submit(request("prefill", random_prompt(o.prompt, hp.n_vocab, 1), 1));
  t0 = Clock::now();
  int computed = d.step();
  const double prefill_s = since(t0);
  if (computed != o.prompt) throw Error("prefill step computed " + std::to_string(computed) + " tokens");
  while (!d.idle()) d.step();

  json::Json decode = json::Json::array();
  double tps1 = 0;
  for (int batch : {1, o.batch}) {
    for (int i = 0; i < batch; ++i)
      d.submit(request("b" + std::to_string(batch) + "-" + std::to_string(i),
                       random_prompt(o.context, hp.n_vocab, 100 + static_cast<std::uint32_t>(i)),
                       o.warmup + o.steps + 1));
    d.step();  // all prompts in one step (within max_batched_tokens)
    for (int i = 0; i < o.warmup; ++i) d.step();
    t0 = Clock::now();
    for (int i = 0; i < o.steps; ++i) {
      int n = d.step();
      if (n != batch) throw Error("decode step at batch " + std::to_string(batch) + " computed " + std::to_string(n) + " tokens");
    }
    const double s = since(t0);
    while (!d.idle()) d.step();
    const double steps_per_s = o.steps / s;
    const double tok_s = steps_per_s * batch;
    if (batch == 1) tps1 = tok_s;
    json::Json r = json::Json::object();
    r["batch"] = batch;
    r["steps"] = o.steps;
    r["seconds"] = s;
    r["tokens_per_s"] = tok_s;
    r["weight_bytes_per_s"] = steps_per_s * static_cast<double>(per_step);
    r["speedup_over_batch_1"] = tok_s / tps1;
    decode.push_back(r);
  }

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const std::uint64_t rss = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;

  // --paired, after the peak RSS is read (the triad's arrays would count
  // in it): rounds of a triad, one untimed and o.steps timed batch-1
  // steps, each round's fraction against its own triad, so that the
  // bandwidth other tenants leave is about the same for the numerator and
  // the denominator.
  if (o.paired > 0) {
    // --paired-mapped: a second store and domain on the same mapped file,
    // without the huge-page copy, timed in the same rounds against the same
    // triad (first or second in alternate rounds).
    std::unique_ptr<engine::WeightStore> mapped_store;
    std::unique_ptr<engine::Domain> mapped;
    if (o.paired_mapped) {
      setenv("FTP_HUGE_COPY", "0", 1);
      mapped_store = std::make_unique<engine::WeightStore>(m);
      mapped = std::make_unique<engine::Domain>(*mapped_store, cfg);
      unsetenv("FTP_HUGE_COPY");
    }
    const int tokens = o.warmup + (o.steps + 1) * o.paired + 1;
    for (engine::Domain* dd : {&d, mapped.get()}) {
      if (!dd) continue;
      dd->submit(request("paired", random_prompt(o.context, hp.n_vocab, 99), tokens));
      dd->step();
      for (int i = 0; i < o.warmup; ++i) dd->step();
    }
    // One untimed step (wakes the helpers, refills the caches the triad
    // evicted), then o.steps timed ones: steps per second.
    auto timed = [&](engine::Domain& dd) {
      dd.step();
      const auto tk = Clock::now();
      for (int i = 0; i < o.steps; ++i)
        if (dd.step() != 1) throw Error("paired decode step at batch 1 computed another count of tokens");
      return o.steps / since(tk);
    };
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const std::size_t n = v.size();
      return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    };
    const int threads = tp * per_rank;
    json::Json rounds = json::Json::array(), mapped_rounds = json::Json::array();
    std::vector<double> f, fm, ratio;
    for (int k = 0; k < o.paired; ++k) {
      // Let the pool's helpers stop spinning and sleep before the triad.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const double tri = hardware::measure_cpu_triad_gbs(threads, o.shape != "1b").value;
      double sps_mapped = 0;
      if (mapped && k % 2 == 1) sps_mapped = timed(*mapped);
      const double sps = timed(d);
      if (mapped && k % 2 == 0) sps_mapped = timed(*mapped);
      const double bps = sps * static_cast<double>(per_step);
      f.push_back(bps / (tri * 1e9));
      rounds.push_back(
          {{"triad_gbs", tri}, {"tokens_per_s", sps}, {"weight_bytes_per_s", bps}, {"bandwidth_fraction", f.back()}});
      if (mapped) {
        const double bm = sps_mapped * static_cast<double>(per_step);
        fm.push_back(bm / (tri * 1e9));
        ratio.push_back(sps / sps_mapped);
        mapped_rounds.push_back({{"triad_gbs", tri}, {"tokens_per_s", sps_mapped}, {"weight_bytes_per_s", bm},
                                 {"bandwidth_fraction", fm.back()}});
      }
    }
    while (!d.idle()) d.step();
    if (mapped)
      while (!mapped->idle()) mapped->step();
    decode[0]["paired"] = {{"rounds", rounds}, {"median_bandwidth_fraction", median(f)}};
    if (mapped)
      decode[0]["paired"]["mapped"] = {{"rounds", mapped_rounds},
                                       {"median_bandwidth_fraction", median(fm)},
                                       {"median_speedup_over_mapped", median(ratio)}};
  }
  const std::uint64_t weights = store.weight_bytes();
  const std::uint64_t budget = static_cast<std::uint64_t>(static_cast<double>(weights + kv_bytes) * 1.1);

  json::Json j = json::Json::object();
  j["dtype"] = shape.q4_k_m ? std::string("Q4_K_M") : std::string(model::dtype_name(shape.dtype));
  j["tp"] = tp;
  j["rank_threads"] = tp;
  j["threads_per_rank"] = per_rank;
  j["threads"] = tp * per_rank;
  j["file_bytes"] = std::filesystem::file_size(path);
  j["weight_bytes"] = weights;
  j["weight_bytes_per_decode_step"] = per_step;
  j["flops_per_token"] = 2.0 * static_cast<double>(step_elements(m));
  j["write_seconds"] = write_s;
  j["layout"] = !packed ? "mapped" : packed->copied_tensors() == packed->tensors() ? "copy" : "packed";
  j["packed"] = {{"bytes", store.packed_bytes()},
                 {"seconds", pack_s},
                 {"released_file_bytes", packed ? packed->released_bytes() : 0}};
  j["prefill"] = {{"tokens", o.prompt}, {"seconds", prefill_s}, {"tokens_per_s", o.prompt / prefill_s}};
  j["decode"] = decode;
  if (o.matvec > 0) j["matvec"] = time_matvec(m, packed, o.matvec);
  j["rss"] = {{"peak_bytes", rss},
              {"weights_bytes", weights},
              {"kv_cap_bytes", kv_bytes},
              {"budget_bytes", budget},
              {"within_budget", rss <= budget}};
  return j;
}

/// Runs run_one in a child process; its JSON comes back through a pipe.
json::Json run_child(const Options& o, const std::string& dt, int tp, int threads, bool huge_copy) {
  int fds[2];
  if (pipe(fds) != 0) throw Error("pipe failed");
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw Error("fork failed");
  if (pid == 0) {
    close(fds[0]);
    if (!huge_copy) setenv("FTP_HUGE_COPY", "0", 1);
    std::string out;
    int rc = 0;
    try {
      out = run_one(o, dt, tp, threads).dump();
    } catch (const std::exception& e) {
      out = json::Json{{"error", e.what()}}.dump();
      rc = 1;
    }
    for (std::size_t off = 0; off < out.size();) {
      ssize_t n = write(fds[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    _exit(rc);
  }
  close(fds[1]);
  std::string buf;
  char tmp[4096];
  for (ssize_t n; (n = read(fds[0], tmp, sizeof tmp)) > 0;) buf.append(tmp, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (buf.empty()) throw Error(dt + " tp " + std::to_string(tp) + ": the child process died (status " + std::to_string(status) + ")");
  json::Json j = json::Json::parse(buf);
  if (j.contains("error")) throw Error(dt + " tp " + std::to_string(tp) + ": " + j["error"].get<std::string>());
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("engine-bench", "CPU engine throughput on a synthetic Llama model (F16, Q8_0, Q4_0, Q4_K_M)");
  Options o;
  double min_bw_fraction = 0;
  auto& app = tool.app();
  app.add_option("--shape", o.shape, "1b (TinyLlama 1.1B shape) or tiny")->capture_default_str();
  app.add_option("--dtype", o.dtypes, std::string("Weight dtypes: ") + kDtypes)->delimiter(',')->capture_default_str();
  app.add_option("--tp", o.tps, "Tensor-parallel degrees (default: 1 and the machine's cores, a power of two, at most 8)")
      ->delimiter(',');
  app.add_option("--rank-threads", o.rank_threads,
                 "Threads of each rank, each value a run of every dtype and TP side by side (0: this process's CPUs over "
                 "the ranks, as ftp-serve's virtual device of them would give; 1: no helper threads)")
      ->delimiter(',')
      ->check(ftp::cli::non_negative())
      ->capture_default_str();
  app.add_option("--huge-copy", o.huge_copy,
                 "on, off: each a run of every dtype side by side, the quantized matrices read from the store's copy "
                 "on huge pages (on) or from the mapped file (off: FTP_HUGE_COPY=0)")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Timed decode steps per batch size")->check(ftp::cli::positive())->capture_default_str();
  app.add_option("--warmup", o.warmup, "Untimed decode steps first")->check(ftp::cli::non_negative())->capture_default_str();
  app.add_option("--prompt", o.prompt, "Prefill tokens")->check(ftp::cli::positive())->capture_default_str();
  app.add_option("--batch", o.batch, "The large decode batch")->check(ftp::cli::positive())->capture_default_str();
  app.add_option("--kernels", o.kernels, "fast or reference (ops::matmul_reference)")->check(CLI::IsMember({"fast", "reference"}))->capture_default_str();
  app.add_option("--dir", o.dir, "Where to write the models (default: a new dir under $TMPDIR)");
  app.add_flag("--keep", o.keep, "Keep the model files (reused by the next run with the same --dir)");
  app.add_option("--matvec", o.matvec, "Also time the batch-1 products alone, per matrix kind and dtype, over this many passes (0: not)")
      ->check(ftp::cli::non_negative());
  app.add_option("--kernel-rate", o.kernel_rate, "Also time the batch-1 Q4_0/Q4_K/Q6_K kernels from L2, best of this many calls per kernel family (0: not)")
      ->check(ftp::cli::non_negative());
  app.add_option("--paired", o.paired,
                 "Also run this many rounds of a triad followed by --steps batch-1 steps, each round's fraction against "
                 "its own triad, and report their median (0: not)")
      ->check(ftp::cli::non_negative());
  app.add_flag("--paired-mapped", o.paired_mapped,
               "With --paired: each round also times --steps batch-1 steps of a second domain whose store reads the "
               "quantized matrices from the mapped file (FTP_HUGE_COPY=0), against the same triad, before or after "
               "the first in alternate rounds");
  app.add_option("--min-bw-fraction", min_bw_fraction,
                 "Exit 6 when a batch-1 bandwidth fraction (the paired median with --paired) is below this (0: no gate)")
      ->check(ftp::cli::non_negative());

  return tool.run(argc, argv, [&]() -> int {
    for (const auto& d : o.dtypes) dtype_of(d);
    if (o.tps.empty()) o.tps = default_tps();
    shape_of_dims(o.shape);
    if (o.kernels == "reference") setenv("FTP_MATMUL", "reference", 1);
    bool own_dir = o.dir.empty();
    if (own_dir) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "ftp-engine-bench-XXXXXX").string();
      if (!mkdtemp(tmpl.data())) throw Error("cannot create a temp dir under " + std::filesystem::temp_directory_path().string());
      o.dir = tmpl;
    }
    json::Json runs = json::Json::array();
    try {
      for (const auto& dt : o.dtypes)
        for (int tp : o.tps)
          for (int th : o.rank_threads)
            for (const auto& hc : o.huge_copy) {
              tool.progress("engine-bench: " + dt + " tp " + std::to_string(tp) + " rank threads " + std::to_string(th) +
                            " huge copy " + hc + " ...");
              runs.push_back(run_child(o, dt, tp, th, hc == "on"));
            }
    } catch (...) {
      if (own_dir && !o.keep) std::filesystem::remove_all(o.dir);
      throw;
    }
    if (own_dir && !o.keep) std::filesystem::remove_all(o.dir);

    // The bandwidth, measured after the children so nothing else runs.
    const bool quick = o.shape != "1b";
    // Keyed by threads: each run's denominator is the triad of as many
    // threads as its domain computes with (tp x threads per rank); the
    // 1-thread triad and, where the machine has them, the 2-thread one are
    // always measured, to read a fraction against either.
    std::map<int, hardware::Measurement> triad, gemm, int8;
    const bool any_q8 = std::find(o.dtypes.begin(), o.dtypes.end(), "q8_0") != o.dtypes.end();
    std::set<int> thread_counts = {1};
    if (std::thread::hardware_concurrency() >= 2) thread_counts.insert(2);
    std::vector<int> split_threads;  // threads per rank > 1 of the runs (--kernel-rate splits over them)
    for (const auto& r : runs) {
      thread_counts.insert(r["threads"].get<int>());
      const int per = r["threads_per_rank"].get<int>();
      if (per > 1 && std::find(split_threads.begin(), split_threads.end(), per) == split_threads.end())
        split_threads.push_back(per);
    }
    for (int n : thread_counts) {
      triad.emplace(n, hardware::measure_cpu_triad_gbs(n, quick));
      gemm.emplace(n, hardware::measure_cpu_gemm_tflops(n, quick));
      if (any_q8) int8.emplace(n, hardware::measure_cpu_int8_tops(n, quick));
    }
    bool gate_ok = true;
    for (auto& r : runs) {
      const auto& m = triad.at(r["threads"].get<int>());
      r["triad_gbs"] = m.value;
      r["triad_threads"] = r["threads"];
      // Roofline of the batch-N speedup: batch N can at best run at the
      // measured peak (SGEMM FLOP/s; for Q8_0 the int8 VNNI ops/s), so
      // bN/b1 <= min(N, peak / batch-1 ops/s), and with batch 1 at 0.8 of
      // the triad bandwidth the goal of 8x needs peak >= 8 x 0.8 x triad B/s
      // x ops per weight byte.
      const int tp = r["threads"].get<int>();  // the measurements' key: threads
      const double gemm_flops = gemm.at(tp).value * 1e12;
      const bool use_int8 = r["dtype"] == "Q8_0" && int8.count(tp) && int8.at(tp).value > 0;
      const double peak = use_int8 ? int8.at(tp).value * 1e12 : gemm_flops;
      const double flop_per_byte = r["flops_per_token"].get<double>() / r["weight_bytes_per_decode_step"].get<double>();
      const double b1_flops = r["decode"][0]["tokens_per_s"].get<double>() * r["flops_per_token"].get<double>();
      r["sgemm_tflops"] = gemm_flops / 1e12;
      if (int8.count(tp)) r["int8_tops"] = int8.at(tp).value;
      r["roofline_peak"] = use_int8 ? "int8 vnni" : "sgemm";
      r["batch_n_speedup_roofline"] = std::min<double>(o.batch, peak / b1_flops);
      r["batch_n_speedup_roofline_at_0_8_bw"] = std::min<double>(o.batch, peak / (0.8 * m.value * 1e9 * flop_per_byte));
      if (r.contains("matvec")) {
        double sum = 0;
        for (auto& mv : r["matvec"]) {
          mv["bandwidth_fraction"] = mv["bytes_per_s"].get<double>() / (m.value * 1e9);
          sum += mv["seconds_per_pass"].get<double>();
        }
        // The batch-1 step's time outside the products (which include the
        // activations' quantization): attention, norms, SiLU, RoPE, the
        // embedding, sampling, scheduling.
        r["matvec_seconds_per_step"] = sum;
        // Only on one thread: the products alone run on one, whole matrices.
        if (tp == 1) r["other_seconds_per_step"] = 1.0 / r["decode"][0]["tokens_per_s"].get<double>() - sum;
      }
      for (auto& d : r["decode"]) {
        d["bandwidth_fraction"] = d["weight_bytes_per_s"].get<double>() / (m.value * 1e9);
        d["bandwidth_fraction_of_1_thread_triad"] = d["weight_bytes_per_s"].get<double>() / (triad.at(1).value * 1e9);
        const double gated = d.contains("paired") ? d["paired"]["median_bandwidth_fraction"].get<double>()
                                                  : d["bandwidth_fraction"].get<double>();
        if (d["batch"] == 1 && min_bw_fraction > 0 && gated < min_bw_fraction) gate_ok = false;
      }
    }
    json::Json doc = json::Json::object();
    doc["kind"] = "ftp.engine-bench/v1";
    const auto sh = shape_of_dims(o.shape);
    doc["shape"] = {{"name", o.shape}, {"n_layer", sh.n_layer}, {"n_embd", sh.n_embd}, {"n_ff", sh.n_ff},
                    {"n_head", sh.n_head}, {"n_head_kv", sh.n_head_kv}, {"n_vocab", sh.n_vocab}};
    doc["kernels"] = o.kernels;
    doc["hardware_threads"] = std::thread::hardware_concurrency();
    json::Json tri = json::Json::object();
    for (const auto& [tp, m] : triad) tri[std::to_string(tp)] = {{"threads", tp}, {"gbs", m.value}, {"method", m.method}};
    doc["triad"] = tri;
    json::Json gm = json::Json::object();
    for (const auto& [tp, m] : gemm) gm[std::to_string(tp)] = {{"threads", tp}, {"tflops", m.value}, {"method", m.method}};
    doc["sgemm"] = gm;
    json::Json i8 = json::Json::object();
    for (const auto& [tp, m] : int8) i8[std::to_string(tp)] = {{"threads", tp}, {"tops", m.value}, {"method", m.method}};
    doc["int8"] = i8;
    doc["decode_context_tokens"] = o.context;
    doc["runs"] = runs;
    if (o.kernel_rate > 0) doc["kernel_rate"] = time_kernel_rate(o.kernel_rate, split_threads);
    doc["goals"] = {{"batch_1_bandwidth_fraction", 0.8}, {"batch_16_speedup", 8.0}, {"rss_over_weights_plus_kv", 1.1}};
    doc["gate"] = {{"min_bw_fraction", min_bw_fraction}, {"passed", gate_ok}};
    tool.emit(doc);

    std::ostringstream t;
    char line[320];
    std::snprintf(line, sizeof line, "%-6s %-3s %-3s %-6s %10s %10s %10s %8s %8s %8s %7s %10s %9s %9s\n", "dtype", "tp", "thr", "layout",
                  "prefill/s", "b1 tok/s", "bN tok/s", "bN/b1", "roofline", "b1 GB/s", "b1 frac", "triad GB/s", "RSS MiB",
                  "budget");
    t << "engine-bench: shape " << o.shape << ", kernels " << o.kernels << ", batch N = " << o.batch
      << ", thr = threads of each TP rank (its products split by rows)\n" << line;
    for (const auto& r : runs) {
      const auto& d1 = r["decode"][0];
      const auto& dn = r["decode"][1];
      std::snprintf(line, sizeof line, "%-6s %-3d %-3d %-6s %10.1f %10.2f %10.2f %8.2f %8.2f %8.2f %7.3f %10.2f %9.0f %9.0f\n",
                    r["dtype"].get<std::string>().c_str(), r["tp"].get<int>(), r["threads_per_rank"].get<int>(),
                    r["layout"].get<std::string>().c_str(),
                    r["prefill"]["tokens_per_s"].get<double>(),
                    d1["tokens_per_s"].get<double>(), dn["tokens_per_s"].get<double>(),
                    dn["speedup_over_batch_1"].get<double>(), r["batch_n_speedup_roofline"].get<double>(),
                    d1["weight_bytes_per_s"].get<double>() / 1e9,
                    d1["bandwidth_fraction"].get<double>(), r["triad_gbs"].get<double>(),
                    r["rss"]["peak_bytes"].get<double>() / 1048576.0, r["rss"]["budget_bytes"].get<double>() / 1048576.0);
      t << line;
    }
    t << "triad:";
    for (const auto& [n, m] : triad) {
      std::snprintf(line, sizeof line, " %d thread%s %.2f GB/s", n, n == 1 ? "" : "s", m.value);
      t << line;
    }
    t << "; b1 frac is against the triad of the run's threads (tp x thr)\n";
    for (const auto& r : runs) {
      const auto& d1 = r["decode"][0];
      if (!d1.contains("paired")) continue;
      std::snprintf(line, sizeof line, "paired b1 (triad, then %d steps; %zu rounds): %s tp %d thr %d %s median %.3f of triad; rounds",
                    o.steps, d1["paired"]["rounds"].size(), r["dtype"].get<std::string>().c_str(), r["tp"].get<int>(),
                    r["threads_per_rank"].get<int>(), r["layout"].get<std::string>().c_str(),
                    d1["paired"]["median_bandwidth_fraction"].get<double>());
      auto rounds = [&](const json::Json& ps) {
        t << line;
        for (const auto& p : ps) {
          std::snprintf(line, sizeof line, " %.2f/%.1f=%.3f", p["weight_bytes_per_s"].get<double>() / 1e9,
                        p["triad_gbs"].get<double>(), p["bandwidth_fraction"].get<double>());
          t << line;
        }
        t << " (GB/s / triad GB/s)\n";
      };
      rounds(d1["paired"]["rounds"]);
      if (!d1["paired"].contains("mapped")) continue;
      const auto& pm = d1["paired"]["mapped"];
      std::snprintf(line, sizeof line,
                    "  the same rounds, mapped file: median %.3f of triad, %s over mapped x%.3f (median of rounds); rounds",
                    pm["median_bandwidth_fraction"].get<double>(), r["layout"].get<std::string>().c_str(),
                    pm["median_speedup_over_mapped"].get<double>());
      rounds(pm["rounds"]);
    }
    for (const auto& r : runs) {
      if (!r.contains("matvec")) continue;
      t << "matvec (batch 1, alone): " << r["dtype"].get<std::string>() << " tp " << r["tp"].get<int>() << "\n";
      for (const auto& mv : r["matvec"]) {
        std::snprintf(line, sizeof line, "  %-18s x%-3d %9.1f MB %8.2f ms %7.2f GB/s %6.3f of triad\n",
                      mv["matrices"].get<std::string>().c_str(), mv["count"].get<int>(), mv["bytes"].get<double>() / 1e6,
                      mv["seconds_per_pass"].get<double>() * 1e3, mv["bytes_per_s"].get<double>() / 1e9,
                      mv["bandwidth_fraction"].get<double>());
        t << line;
      }
      if (r.contains("other_seconds_per_step")) {
        std::snprintf(line, sizeof line, "  products %.2f ms, the rest of the batch-1 step %.2f ms\n",
                      r["matvec_seconds_per_step"].get<double>() * 1e3, r["other_seconds_per_step"].get<double>() * 1e3);
        t << line;
      }
    }
    t << "roofline: the best bN/b1 the measured peak allows over this run's batch 1, min(N, peak / b1 ops/s); peak:";
    for (const auto& [tp, m] : gemm) {
      std::snprintf(line, sizeof line, " tp %d SGEMM %.3f TFLOP/s", tp, m.value);
      t << line;
    }
    for (const auto& [tp, m] : int8) {
      std::snprintf(line, sizeof line, ", tp %d int8 VNNI %.3f TOP/s (Q8_0 rows)", tp, m.value);
      t << line;
    }
    t << "\n";
    if (doc.contains("kernel_rate")) {
      const auto& kr = doc["kernel_rate"];
      std::snprintf(line, sizeof line, "kernel rate (batch 1, 256 x 2048 in L2, one core unless threads > 1, clock ~%.2f GHz):\n",
                    kr["clock_ghz"].get<double>());
      t << line;
      for (const auto& r : kr["kernels"]) {
        std::snprintf(line, sizeof line, "  %-5s %-5s %d thr %7.1f GB/s %6.1f cycles per block\n", r["dtype"].get<std::string>().c_str(),
                      r["kernels"].get<std::string>().c_str(), r["threads"].get<int>(), r["bytes_per_s"].get<double>() / 1e9,
                      r["cycles_per_block"].get<double>());
        if (r.contains("helper_share")) {
          line[std::strlen(line) - 1] = '\0';
          t << line;
          std::snprintf(line, sizeof line, ", %.2f of the parts on the helpers\n", r["helper_share"].get<double>());
        }
        t << line;
      }
    }
    std::cerr << t.str();
    if (!gate_ok) {
      std::cerr << "engine-bench: error: a batch-1 bandwidth fraction is below --min-bw-fraction " << min_bw_fraction << "\n";
      return static_cast<int>(Exit::check_failed);
    }
    return 0;
  });
}
