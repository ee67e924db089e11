// SPDX-License-Identifier: Apache-2.0
// sim-fidelity: the simulated engine against the real CPU engine, on the
// same workload through the same scheduler (engine::Domain).
//
// For each workload in one run -- stories260K, a synthetic ~29 M-parameter
// Llama written by tests/support ("synthetic-1b", TinyLlama's ~1.1 B shape
// in Q8_0, runs only when named: minutes a run on a 2-core VM), and
// "azure-code": a slice of the Azure LLM code trace on the
// synthetic model, scaled to the CPU (prompt lengths / --azure-scale, output
// lengths as traced, clamped to the model; the slice's gaps stretched so its
// mean rate is the offered load below) --:
//  1. probes the real engine's CPU share (the first of --split equal
//     shares, default 2) as ftp-probe does for that virtual device: GEMM
//     TFLOP/s and triad GB/s with the share's threads;
//     Weights of under 24 MiB (stories260K) are also probed with a triad
//     over their footprint: the rate cached weights are read at, the fit's
//     bound of the memory efficiency;
//  2. calibration: a short run of the real engine on its own workload
//     (another seed; its rate from the planner's constants; a fifth of the
//     requests, --calibration-long-share, with prompts of --long-prompts
//     256-1024 tokens within the model's context, so that attention is
//     fitted at long positions) records each scheduler step's work
//     (tokens, attention pairs, KV positions, logits rows) and wall time;
//  3. the evaluation workload (open loop: Poisson arrivals, prompt and
//     output lengths drawn uniformly, or the trace slice's; no EOS so every
//     request runs to its max_tokens) runs through a Domain of the real
//     engine in wall-clock time; steps 2 and 3 repeat --repeat times
//     (default 3), interleaved, so calibration and evaluation sample the
//     machine's load alike, and each real metric is the rounds' median;
//  4. the cost model's constants are fitted to every round's calibration
//     steps (sim::fit_calibration: bounded least squares, the constants left
//     at a bound printed), and the evaluation workload runs through a Domain
//     of the simulated engine so calibrated, in virtual time; the driver is
//     the same code for both: arrivals due are submitted before each step,
//     idle time passes to the next arrival.
// The rate is --concurrency / (the simulated time of one mean request
// alone), so the domain batches a few requests at a time.
//
// The "shift" workload is the synthetic one through serve::Service, the
// library of ftp-serve, with two gears of one CPU virtual device each (vd0,
// vd1): the real engine in wall-clock time, and the simulated engine
// (sim::engine_factory, paced to wall-clock time, as ftp-serve --engine sim
// runs it) on the probed devices with the calibration; in each, when half
// of the requests have arrived, Service::shift moves from gear "a" (vd0) to
// gear "b" (vd1): a shadow domain is built and warmed, traffic ramps
// 10 %, 50 %, 100 % with checks, the old domain drains while the new one
// serves. Latencies are the client's, from the completion events.
//
// Output: the load average (the machine is shared; the calibration runs in
// the same process minutes before), a table on stderr (P50/P99 TTFT, TPOT
// and E2E, real, sim, sim/real and whether it is within 10 %), one JSON
// document (kind ftp.sim-fidelity/v1) on stdout. --check turns any metric
// outside 10 % into exit 6.
// --write-calibration FILE writes the first model's ftp.sim-calibration/v1
// with the probed speeds as a topology (FILE.topology.json), for
// ftp-serve --engine sim --calibration FILE --topology FILE.topology.json.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "hardware/cpu/measure.hpp"
#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "bench/bench.hpp"
#include "cli/tool.hpp"
#include "control/trace.hpp"
#include "core/error.hpp"
#include "doc/topology.hpp"
#include "engine/domain.hpp"
#include "engine/executor.hpp"
#include "engine/ops.hpp"
#include "engine/weight_store.hpp"
#include "plan/model_shape.hpp"
#include "serve/service.hpp"
#include "sim/calibrate.hpp"
#include "sim/serving.hpp"
#include "sim/simulated_engine.hpp"
#include "synthetic_gguf.hpp"
#include "test_data.hpp"

using namespace ftp;

namespace {

struct Options {
  std::vector<std::string> models = {"stories260K", "synthetic", "azure-code", "shift"};
  std::string stories;            // path of stories260K.gguf
  std::string azure;              // path of the Azure code trace (CSV)
  int azure_offset = 1000;        // first request of the slice
  double azure_scale = 32;        // prompt lengths are divided by this
  int split = 2;                  // CPUs split this many ways for the real engine (shift: at least 2)
  int repeat = 3;                 // rounds of calibration + evaluation of the real engine
  int requests = 160;
  int calibration_requests = 40;
  double concurrency = 3;
  int prompt_min = 8, prompt_max = 96, output_min = 8, output_max = 64;
  double calibration_long_share = 0.2;  // calibration requests with a long prompt
  int long_prompt_min = 256, long_prompt_max = 1024;
  std::uint64_t seed = 1;
  bool check = false;
  std::string write_calibration;
  std::string synthetic_path;     // keep the synthetic model here
  std::string steps_out;          // JSONL of every measured step
  bool sweep = false;             // the decode step alone against rows and context
  bool no_resident_bound = false; // --no-resident-bound: the memory efficiency at most 1 whatever the weights' size
  std::vector<int> sweep_contexts = {16, 128, 512};
  int sweep_rows = 16, sweep_reps = 9;
};

struct Workload {
  std::vector<double> at;  // arrival, s from the start
  std::vector<std::vector<int>> prompt;
  std::vector<int> output;
};

/// `n` requests, Poisson arrivals at `rate`, prompt and output lengths drawn
/// uniformly; with `n_ctx` > 0, every request whose index is a multiple of
/// 1 / o.calibration_long_share (the calibration runs) has a long prompt
/// instead, of o.long_prompt_min..o.long_prompt_max tokens within the
/// model's context `n_ctx`, so that the fit sees attention at the positions
/// the trace workloads reach.
Workload make_workload(const Options& o, int n, double rate, std::uint64_t seed, int n_vocab, int n_ctx = 0) {
  Workload w;
  w.at = bench::arrival_times(rate, bench::Arrivals{"poisson", 1.0, seed}, n, 0);
  std::mt19937_64 rng(seed * 7919 + 1), long_rng(seed * 7919 + 2);
  std::uniform_int_distribution<int> plen(o.prompt_min, o.prompt_max), olen(o.output_min, o.output_max),
      tok(3, n_vocab - 1);
  const int long_max = std::min(o.long_prompt_max, n_ctx - o.output_max - 1);
  std::uniform_int_distribution<int> long_len(std::min(o.long_prompt_min, long_max), std::max(long_max, 2));
  const int long_every =
      n_ctx > 0 && o.calibration_long_share > 0 ? std::max(1, static_cast<int>(std::lround(1 / o.calibration_long_share))) : 0;
  for (int i = 0; i < n; ++i) {
    const int short_len = plen(rng);
    const bool is_long = long_every > 0 && i % long_every == long_every - 1;
    std::vector<int> p(static_cast<std::size_t>(is_long ? long_len(long_rng) : short_len));
    p[0] = 1;
    for (std::size_t k = 1; k < p.size(); ++k) p[k] = tok(rng);
    w.prompt.push_back(std::move(p));
    w.output.push_back(olen(rng));
  }
  return w;
}

/// `n` requests of the Azure trace from `o.azure_offset`: prompts of
/// traced length / azure_scale (at least 2, at most what the context
/// leaves), outputs as traced (2..output_max, so TPOT has two tokens), the
/// gaps as traced, scaled so that the mean rate is `rate`.
Workload trace_workload(const Options& o, const control::Trace& t, int n, double rate, std::uint64_t seed,
                        int n_vocab, int n_ctx) {
  if (o.azure_offset + n > static_cast<int>(t.requests.size()))
    throw InputError("--azure-offset: " + std::to_string(o.azure_offset) + " + " + std::to_string(n) +
                     " requests exceed the trace's " + std::to_string(t.requests.size()));
  const auto* r = &t.requests[static_cast<std::size_t>(o.azure_offset)];
  const double span_s = (r[n - 1].t_ms - r[0].t_ms) / 1e3;
  const double stretch = span_s > 0 ? (n - 1) / rate / span_s : 0;
  Workload w;
  std::mt19937_64 rng(seed * 7919 + 1);
  std::uniform_int_distribution<int> tok(3, n_vocab - 1);
  for (int i = 0; i < n; ++i) {
    const int out = std::clamp(r[i].output_tokens, 2, o.output_max);
    const int len = std::clamp(static_cast<int>(std::lround(r[i].prompt_tokens / o.azure_scale)), 2, n_ctx - out - 1);
    std::vector<int> p(static_cast<std::size_t>(len));
    p[0] = 1;
    for (std::size_t k = 1; k < p.size(); ++k) p[k] = tok(rng);
    w.at.push_back((r[i].t_ms - r[0].t_ms) / 1e3 * stretch);
    w.prompt.push_back(std::move(p));
    w.output.push_back(out);
  }
  return w;
}

/// The real engine with each forward's work written down (for calibration).
class Recording final : public engine::Engine {
 public:
  explicit Recording(std::unique_ptr<engine::Engine> inner) : inner_(std::move(inner)) {}
  const model::HParams& hparams() const override { return inner_->hparams(); }
  int block_tokens() const override { return inner_->block_tokens(); }
  std::uint64_t kv_bytes() const override { return inner_->kv_bytes(); }
  const std::vector<double>& stage_busy_s() const override { return inner_->stage_busy_s(); }
  std::vector<std::vector<float>> forward(const std::vector<engine::SeqChunk>& chunks, int mb) override {
    record(chunks, mb);
    return inner_->forward(chunks, mb);
  }
  void record(const std::vector<engine::SeqChunk>& chunks, int mb) {
    last = plan::StepWork{};
    last_chunks = static_cast<int>(chunks.size());
    last_prefill = 0;
    for (const auto& c : chunks) last_prefill += c.tokens.size() > 1 ? 1 : 0;
    for (const auto& w : sim::micro_batch_work(chunks, mb)) {
      last.tokens += w.tokens;
      last.attention_pairs += w.attention_pairs;
      last.kv_positions += w.kv_positions;
      last.logit_rows += w.logit_rows;
    }
  }
  void recycle(std::vector<std::vector<float>>&& logits) override { inner_->recycle(std::move(logits)); }
  std::vector<int> forward_choose(const std::vector<engine::SeqChunk>& chunks, int mb,
                                  const std::vector<engine::TokenChoice>& choices) override {
    record(chunks, mb);
    return inner_->forward_choose(chunks, mb, choices);
  }
  plan::StepWork last;
  int last_chunks = 0, last_prefill = 0;

 private:
  std::unique_ptr<engine::Engine> inner_;
};

std::ofstream* g_steps_out = nullptr;  // --steps-out
bool g_fit_cpu_time = false;           // --fit-cpu-time: a step's sample is its CPU time
std::string g_workload, g_phase;

struct Latencies {
  std::vector<double> ttft_ms, tpot_ms, e2e_ms;
};

/// Runs the workload through `d`: arrivals due are submitted before each
/// step; while nothing runs, `idle_until` lets time pass to the next arrival.
/// CPU seconds of this process (all threads) so far.
double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

/// The real engine's steps: their wall time and the CPU time the process
/// got meanwhile. Their ratio is the share of a CPU the engine's one thread
/// received (1: undisturbed; other processes on its core take the rest).
struct CpuShare {
  double busy_s = 0, cpu_s = 0;
  double share() const { return busy_s > 0 ? cpu_s / busy_s : 0; }
};

Latencies drive(engine::Domain& d, const Workload& w, const std::function<double()>& now,
                const std::function<void(double)>& idle_until, Recording* rec, std::vector<sim::StepSample>* samples,
                CpuShare* cpu = nullptr) {
  const std::size_t n = w.at.size();
  std::vector<double> first(n, -1), last(n, -1);
  std::vector<int> count(n, 0);
  std::size_t next = 0, done = 0;
  while (done < n) {
    if (d.idle() && next < n) idle_until(w.at[next]);
    for (; next < n && w.at[next] <= now(); ++next) {
      engine::GenerationRequest r;
      r.id = std::to_string(next);
      r.prompt = w.prompt[next];
      r.max_tokens = w.output[next];
      r.eos = -1;  // every request runs to max_tokens, with either engine
      const std::size_t i = next;
      r.on_event = [&, i](const engine::GenerationEvent& e) {
        const double t = now();
        if (e.token >= 0) {
          if (first[i] < 0) first[i] = t;
          last[i] = t;
          ++count[i];
        }
        if (e.finished) {
          if (e.finish_reason == ftp::engine::FinishReason::error) throw Error("request " + e.request_id + ": " + e.error);
          ++done;
        }
      };
      d.submit(std::move(r));
    }
    if (d.idle()) continue;
    const double t0 = now(), c0 = cpu_s();
    const int tokens = d.step();
    if (rec && tokens > 0) {
      const double dt = now() - t0, dc = cpu_s() - c0;
      if (cpu) cpu->busy_s += dt, cpu->cpu_s += dc;
      if (samples) samples->push_back({rec->last, g_fit_cpu_time ? dc : dt});
      if (g_steps_out)
        *g_steps_out << json::Json{{"workload", g_workload}, {"phase", g_phase},
                                   {"tokens", rec->last.tokens}, {"attention_pairs", rec->last.attention_pairs},
                                   {"kv_positions", rec->last.kv_positions}, {"logit_rows", rec->last.logit_rows},
                                   {"chunks", rec->last_chunks}, {"prefill_chunks", rec->last_prefill},
                                   {"t", t0}, {"seconds", dt}, {"cpu_seconds", dc}}
                              .dump()
                       << "\n";
    }
  }
  Latencies l;
  for (std::size_t i = 0; i < n; ++i) {
    l.ttft_ms.push_back((first[i] - w.at[i]) * 1e3);
    l.e2e_ms.push_back((last[i] - w.at[i]) * 1e3);
    if (count[i] > 1) l.tpot_ms.push_back((last[i] - first[i]) / (count[i] - 1) * 1e3);
  }
  return l;
}

engine::DomainConfig domain_config() {
  engine::DomainConfig c;
  c.kv_blocks = 512;
  c.max_running = 16;
  c.max_batched_tokens = 256;
  return c;
}

/// The real engine in wall-clock time, as ftp-serve --gear tp=1 runs it:
/// its rank thread on CPU virtual device vd0 of this process's CPUs split
/// `n_vd` ways (1: all of them; the shift workload's service splits them 2
/// ways, so its calibration runs on the same share).
/// This process's CPUs split `n` ways (made once per n).
const std::vector<std::unique_ptr<hardware::VirtualDevice>>& cpu_shares(int n) {
  static std::map<int, std::vector<std::unique_ptr<hardware::VirtualDevice>>> split;
  auto& vds = split[n];
  if (vds.empty()) vds = hardware::split_cpu(n, hardware::discover_cpu().memory_bytes);
  return vds;
}

Latencies run_real(const engine::WeightStore& store, const Workload& w, std::vector<sim::StepSample>* samples,
                   int n_vd, CpuShare* cpu = nullptr) {
  const auto& vds = cpu_shares(n_vd);
  Recording* rec = nullptr;
  engine::DomainConfig cfg = domain_config();
  cfg.stages = {engine::StageLayout{0, store.hparams().n_layer, 1, {vds[0].get()}}};
  engine::Domain d(store.hparams(), cfg, [&](const engine::DomainConfig& c) {
    auto r = std::make_unique<Recording>(engine::Domain::real_engine(store)(c));
    rec = r.get();
    return r;
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto idle = [&](double t) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(t)));
  };
  return drive(d, w, now, idle, rec, samples, cpu);
}

/// The simulated engine in virtual time.
Latencies run_sim(const model::HParams& hp, const plan::ModelShape& shape, const plan::GroupPerf& perf,
                  const plan::Calibration& cal, const Workload& w) {
  sim::SimulatedEngine* e = nullptr;
  engine::Domain d(hp, domain_config(), [&](const engine::DomainConfig& c) {
    sim::SimulatedEngineOptions o;
    o.shape = shape;
    o.stages = sim::uniform_stages(shape, c, perf);
    o.calibration = cal;
    o.kv_blocks = c.kv_blocks;
    o.block_tokens = c.block_tokens;
    auto p = std::make_unique<sim::SimulatedEngine>(o);
    e = p.get();
    return p;
  });
  return drive(d, w, [&] { return e->now_s(); }, [&](double t) { e->advance_idle_to(t); }, nullptr, nullptr);
}

constexpr double kTolerance = 0.10;  // issue 18: every metric within 10 %

std::string load_average() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return "unknown";
  char b[64];
  std::snprintf(b, sizeof b, "%.2f %.2f %.2f", l[0], l[1], l[2]);
  return b;
}

/// This CPU's probed speeds as `n` virtual devices vd0..vd<n-1>, one
/// thread each, for the simulated engine (and ftp-serve --engine sim).
doc::Topology probe_topology(const plan::GroupPerf& perf, int n) {
  doc::Topology topo;
  topo.source = "probe";
  topo.name = "sim-fidelity-cpu";
  topo.nodes.push_back(doc::Host{"node0", "localhost", "", 0, 0, 0});
  doc::Island island{"island0", {}, std::nullopt};
  for (int i = 0; i < n; ++i) {
    doc::Device dev;
    dev.id = "vd" + std::to_string(i);
    dev.type = "virtual";
    dev.node = "node0";
    dev.parent = "cpu0";
    dev.memory_bytes = 4ull << 30;
    dev.compute_units = 1;
    dev.gemm_tflop_s = perf.tflop_s;
    dev.gemm_dtype = "f32";
    dev.memory_bandwidth_gb_s = perf.gb_s;
    dev.perf_source = "measured";
    topo.devices.push_back(dev);
    island.devices.push_back(dev.id);
  }
  topo.islands.push_back(island);
  doc::validate(topo);
  return topo;
}

/// Gears "a" (vd0) and "b" (vd1), one rank each, of model `hp`.
doc::GearTable two_gears(const model::HParams& hp) {
  json::Json t = json::Json{{"kind", "ftp.gear-table/v1"},
                            {"model", json::Json{{"name", "synthetic"},
                                                 {"n_layers", hp.n_layer},
                                                 {"n_heads", hp.n_head},
                                                 {"n_kv_heads", hp.n_head_kv},
                                                 {"hidden_size", hp.n_embd}}},
                            {"topology", "sim-fidelity-cpu"},
                            {"gears", json::Json::array()}};
  for (const char* g : {"a", "b"}) {
    json::Json stage{{"layers", json::Json::array({0, hp.n_layer})},
                     {"devices", json::Json::array({std::string(g) == "a" ? "vd0" : "vd1"})}};
    t["gears"].push_back(json::Json{{"name", g}, {"tp", 1}, {"pp", 1}, {"dp", 1},
                                    {"replicas", json::Json::array({json::Json{{"stages", json::Json::array({stage})}}})}});
  }
  return doc::gear_table_from_json(t);
}

/// The workload through a Service of gears a and b, in wall-clock time,
/// with a shift to b once half of the requests have arrived. `factory`
/// null: the real engine. Returns the client's latencies.
Latencies run_service_shift(const model::Model& m, const Workload& w, const doc::Topology& topo, int n_vd,
                            std::function<std::unique_ptr<engine::Engine>(const doc::Replica&, const engine::DomainConfig&)>
                                factory,
                            json::Json& shift_outcome) {
  serve::ServiceConfig cfg;
  cfg.model_name = "synthetic";
  cfg.gears = two_gears(m.hparams);
  cfg.start_gear = "a";
  const auto dc = domain_config();
  cfg.kv_blocks = dc.kv_blocks;
  cfg.max_running = dc.max_running;
  cfg.max_batched_tokens = dc.max_batched_tokens;
  cfg.virtual_devices = n_vd;
  cfg.step_interval_ms = 500;
  cfg.rollback_p99_factor = 1000;  // the comparison needs the shift to commit in both
  if (factory) {
    cfg.engine_factory = std::move(factory);
    cfg.topology = topo;
  }
  serve::Service svc(m, cfg);
  svc.start();
  const std::size_t n = w.at.size();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<double> first(n, -1), end(n, -1);
  std::vector<int> count(n, 0);
  std::size_t done = 0;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::thread shifter;
  for (std::size_t i = 0; i < n; ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                           std::chrono::duration<double>(w.at[i])));
    if (i == n / 2)
      shifter = std::thread([&] {
        serve::ShiftOptions so;
        so.to = "b";
        const auto ev = svc.shift(so, nullptr);
        std::lock_guard lk(mu);
        shift_outcome = doc::to_json(ev);
      });
    serve::CompletionRequest r;
    r.id = std::to_string(i);
    r.prompt_tokens = w.prompt[i];
    r.max_tokens = w.output[i];
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.on_event = [&, i](const serve::CompletionEvent& e) {
      const double t = now();
      std::lock_guard lk(mu);
      if (e.completion_tokens > 0 && first[i] < 0) first[i] = t;
      count[i] = e.completion_tokens;
      if (e.finished) {
        end[i] = t;
        if (e.finish_reason == engine::FinishReason::error && error.empty()) error = e.request_id + ": " + e.error;
        ++done;
        cv.notify_all();
      }
    };
    svc.submit(std::move(r));
  }
  {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done == n; });
  }
  if (shifter.joinable()) shifter.join();
  svc.drain_and_stop();
  if (!error.empty()) throw Error("shift workload: request " + error);
  Latencies l;
  for (std::size_t i = 0; i < n; ++i) {
    l.ttft_ms.push_back((first[i] - w.at[i]) * 1e3);
    l.e2e_ms.push_back((end[i] - w.at[i]) * 1e3);
    if (count[i] > 1) l.tpot_ms.push_back((end[i] - first[i]) / (count[i] - 1) * 1e3);
  }
  return l;
}

/// --sweep: the real engine's decode step alone, against the model. For
/// each context c in `contexts` and rows r = 1..max_rows: one forward of r
/// one-token chunks at position c (pages of their own; what the KV pages
/// hold does not change the time), the greedy token chosen, as a Domain's
/// decode step runs it. The points are taken in turn, `reps` times over, so
/// that a disturbance of the machine spreads over all of them; each point's
/// time is its median. Prints and returns measured and predicted per point,
/// by the fit `cal` and by `cal0` (the same steps without the pass term).
json::Json sweep_decode(const std::string& name, const engine::WeightStore& store, const plan::ModelShape& shape,
                        const plan::GroupPerf& perf, const plan::Calibration& cal, const plan::Calibration& cal0, int n_vd,
                        const std::vector<int>& contexts, int max_rows, int reps) {
  const auto& hp = store.hparams();
  const int bt = domain_config().block_tokens;
  std::vector<int> ctx;
  for (int c : contexts) ctx.push_back(std::clamp(c, 1, hp.n_ctx_train - 2));
  const int max_pages = (*std::max_element(ctx.begin(), ctx.end()) + 1 + bt - 1) / bt;
  const auto& vds = cpu_shares(n_vd);
  engine::Executor exec(store, {engine::StageLayout{0, hp.n_layer, 1, {vds[0].get()}}}, max_rows * max_pages, bt,
                        nullptr, domain_config().max_batched_tokens);
  std::vector<std::vector<int>> pages(static_cast<std::size_t>(max_rows));
  for (int r = 0; r < max_rows; ++r)
    for (int b = 0; b < max_pages; ++b) pages[static_cast<std::size_t>(r)].push_back(r * max_pages + b);
  auto chunks_of = [&](int rows, int c) {
    std::vector<engine::SeqChunk> ch(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      auto& k = ch[static_cast<std::size_t>(r)];
      k.blocks = &pages[static_cast<std::size_t>(r)];
      k.start_pos = c;
      k.tokens = {3 + r};
      k.want_logits = true;
    }
    return ch;
  };
  // Each row's pages hold the keys and values of a prompt of the longest
  // context (never-written pages may hold denormals, which slow attention).
  const int fill = *std::max_element(ctx.begin(), ctx.end());
  for (int r = 0; r < max_rows; ++r)
    for (int at = 0; at < fill; at += domain_config().max_batched_tokens) {
      std::vector<engine::SeqChunk> prefill(1);
      prefill[0].blocks = &pages[static_cast<std::size_t>(r)];
      prefill[0].start_pos = at;
      for (int p = at; p < std::min(fill, at + domain_config().max_batched_tokens); ++p)
        prefill[0].tokens.push_back(3 + (p * 7 + r) % (hp.n_vocab - 3));
      exec.forward(prefill, 1);
    }
  const std::size_t n_points = ctx.size() * static_cast<std::size_t>(max_rows);
  std::vector<std::vector<double>> t(n_points), tc(n_points);
  const std::vector<engine::TokenChoice> choices(static_cast<std::size_t>(max_rows));
  CpuShare share;
  for (int rep = -1; rep < reps; ++rep)  // rep -1: warm-up, not counted
    for (std::size_t ci = 0; ci < ctx.size(); ++ci)
      for (int rows = 1; rows <= max_rows; ++rows) {
        const auto ch = chunks_of(rows, ctx[ci]);
        const std::vector<engine::TokenChoice> cc(choices.begin(), choices.begin() + rows);
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = cpu_s();
        exec.forward_choose(ch, 1, cc);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep < 0) continue;
        const double dc = cpu_s() - c0;
        share.busy_s += dt, share.cpu_s += dc;
        t[ci * static_cast<std::size_t>(max_rows) + static_cast<std::size_t>(rows - 1)].push_back(dt);
        tc[ci * static_cast<std::size_t>(max_rows) + static_cast<std::size_t>(rows - 1)].push_back(dc);
      }
  const plan::StageSpan span{shape.n_layers, true, true};
  json::Json points = json::Json::array();
  std::fprintf(stderr,
               "%s: decode sweep, %d reps, CPU share %.2f; load average %s (medians; cpu: the process's CPU time, "
               "which other processes do not stretch)\n%8s %5s %9s %9s %9s %14s %12s %9s\n",
               name.c_str(), reps, share.share(), load_average().c_str(), "context", "rows", "wall ms", "cpu ms",
               "model ms", "model/wall", "no pass/wall", "model/cpu");
  for (std::size_t ci = 0; ci < ctx.size(); ++ci)
    for (int rows = 1; rows <= max_rows; ++rows) {
      const auto ch = chunks_of(rows, ctx[ci]);
      plan::StepWork w;
      for (const auto& mw : sim::micro_batch_work(ch, 1)) {
        w.tokens += mw.tokens;
        w.attention_pairs += mw.attention_pairs;
        w.kv_positions += mw.kv_positions;
        w.logit_rows += mw.logit_rows;
      }
      const std::size_t k = ci * static_cast<std::size_t>(max_rows) + static_cast<std::size_t>(rows - 1);
      const double meas = bench::percentile(t[k], 50), meas_cpu = bench::percentile(tc[k], 50);
      const double model = plan::step_time_s(shape, span, perf, w, cal);
      const double model0 = plan::step_time_s(shape, span, perf, w, cal0);
      std::fprintf(stderr, "%8d %5d %9.3f %9.3f %9.3f %14.3f %12.3f %9.3f\n", ctx[ci], rows, meas * 1e3, meas_cpu * 1e3,
                   model * 1e3, model / meas, model0 / meas, model / meas_cpu);
      points.push_back(json::Json{{"context", ctx[ci]}, {"rows", rows}, {"measured_s", meas}, {"measured_cpu_s", meas_cpu},
                                  {"model_s", model}, {"model_no_pass_s", model0}});
    }
  return json::Json{{"cpu_share", share.share()}, {"reps", reps}, {"points", points}};
}

struct Row {
  std::string model, metric;
  double real = 0, sim = 0;
  std::vector<double> rounds;  // the real engine's value in each round (real: their median)
  double sim_no_pass = 0;      // the simulated engine fitted without the kernel-pass term; 0: not run
  double ratio() const { return real > 0 ? sim / real : 0; }
  bool within() const { return std::abs(ratio() - 1.0) <= kTolerance; }
};

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("sim-fidelity",
                 "The simulated engine against the real CPU engine on the same workload: P50/P99 TTFT, TPOT and E2E,\n"
                 "real vs simulated (calibrated from a probe and a calibration run in the same process).");
  Options o;
  o.stories = test::stories260k("stories260K.gguf");
  o.azure = test::data_dir() + "/traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv";
  auto& app = tool.app();
  app.add_option("--models", o.models,
                 "Workloads: stories260K, synthetic (~29 M), azure-code (the trace slice on the synthetic model) and/or "
                 "shift (the synthetic one through the serve library with a gear shift in the middle); default all four; "
                 "synthetic-1b (TinyLlama's shape in Q8_0, minutes a run) only when named")
      ->delimiter(',')
      ->check(CLI::IsMember({"stories260K", "synthetic", "azure-code", "shift", "synthetic-1b"}));
  app.add_option("--azure-trace", o.azure,
                 "The Azure code trace, CSV (default $FTP_TEST_DATA/traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv)");
  app.add_option("--azure-offset", o.azure_offset, "First request of the azure-code slice (default 1000)")
      ->check(ftp::cli::in_range(0, 100000000));
  app.add_option("--azure-scale", o.azure_scale, "azure-code: traced prompt lengths are divided by this (default 32)")
      ->check(ftp::cli::in_range(1.0, 100000.0));
  app.add_option("--stories", o.stories, "Path of stories260K.gguf (default $FTP_TEST_DATA/models/stories260K/)");
  app.add_option("--requests", o.requests, "Requests of the evaluation workload (default 160: a P99 over 40 is nearly their largest)")->check(ftp::cli::in_range(2, 100000));
  app.add_option("--calibration-requests", o.calibration_requests, "Requests of the calibration run (default 40)")
      ->check(ftp::cli::in_range(5, 100000));
  app.add_option("--calibration-long-share", o.calibration_long_share,
                 "Share of the calibration requests with a long prompt, of --long-prompts tokens within the model's "
                 "context, so that attention is fitted at long positions (default 0.2; 0: none)")
      ->check(ftp::cli::in_range(0.0, 1.0));
  std::vector<int> long_prompts = {o.long_prompt_min, o.long_prompt_max};
  app.add_option("--long-prompts", long_prompts,
                 "Tokens of the calibration's long prompts: MIN,MAX (default 256,1024; clamped to the model's context)")
      ->expected(2)
      ->delimiter(',')
      ->check(ftp::cli::in_range(2, 1000000));
  app.add_option("--concurrency", o.concurrency, "Offered load: requests in flight if none waited (default 3)")
      ->check(ftp::cli::in_range(0.1, 64.0));
  app.add_option("--split", o.split,
                 "The real engine runs on the first of this many equal shares of the CPUs, probed with its threads "
                 "(default 2: one thread on a 2-core machine, the least disturbed by other processes; 1: all CPUs; the "
                 "shift workload's service splits them at least 2 ways)")
      ->check(ftp::cli::in_range(1, 64));
  app.add_option("--repeat", o.repeat,
                 "Rounds of the real engine, each a calibration run then the evaluation workload; its metrics are the "
                 "rounds' medians, the simulated engine's fit uses every round's steps (default 3)")
      ->check(ftp::cli::in_range(1, 100));
  app.add_option("--seed", o.seed, "Seed of the evaluation workload (calibration: seed + 1000)");
  app.add_flag("--check", o.check, "Exit 6 when a metric is off by more than 10 %");
  app.add_option("--write-calibration", o.write_calibration,
                 "Write the first model's ftp.sim-calibration/v1 here, and the probed device as FILE.topology.json");
  app.add_option("--synthetic-path", o.synthetic_path, "Write the synthetic model here and keep it (default: a temp file)");
  app.add_option("--steps-out", o.steps_out,
                 "Write every measured step of the real engine (its work, seconds, workload and phase) here, JSONL");
  app.add_flag("--fit-cpu-time", g_fit_cpu_time,
               "Fit and compare the steps on the process's CPU time instead of their wall time: what other processes "
               "take from the core does not count (the latencies of the simulated engine are then those of an idle "
               "machine)");
  app.add_flag("--no-resident-bound", o.no_resident_bound,
               "Hold the memory efficiency at 1 even for weights under 24 MiB (no triad over their footprint): the "
               "bound before 2026-12-06, to compare");
  app.add_flag("--sweep", o.sweep,
               "After each fit (not the shift workload's), time the real engine's decode step alone at 1..--sweep-rows "
               "rows and each of --sweep-contexts positions, against the fitted model");
  app.add_option("--sweep-contexts", o.sweep_contexts, "--sweep: positions of the rows (default 16,128,512)")
      ->delimiter(',')
      ->check(ftp::cli::in_range(1, 1000000));
  app.add_option("--sweep-rows", o.sweep_rows, "--sweep: the most rows (default 16)")->check(ftp::cli::in_range(1, 256));
  app.add_option("--sweep-reps", o.sweep_reps, "--sweep: steps per point, the median taken (default 9)")
      ->check(ftp::cli::in_range(1, 1000));
  return tool.run(argc, argv, [&]() -> int {
    o.long_prompt_min = long_prompts.at(0), o.long_prompt_max = long_prompts.at(1);
    if (o.long_prompt_min > o.long_prompt_max)
      throw InputError("--long-prompts: MIN " + std::to_string(o.long_prompt_min) + " exceeds MAX " +
                       std::to_string(o.long_prompt_max));
    const auto tmp = std::filesystem::temp_directory_path() / ("ftp-sim-fidelity-" + std::to_string(::getpid()));
    std::filesystem::create_directories(tmp);
    struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() { std::filesystem::remove_all(p); }
    } cleanup{tmp};

    // 1. This CPU's share as one virtual device, probed with its threads
    // (ftp-probe's measurements), once per share size.
    std::map<int, plan::GroupPerf> probes;
    // int8: the model's products are the packed Q8_0 kernels, whose peak is
    // the VNNI int8 rate, not the float GEMM's (engine-bench's roofline):
    // the compute efficiency's bound of 1 is relative to it.
    auto probe = [&](int n_vd, bool int8) {
      const int key = n_vd * 2 + (int8 ? 1 : 0);
      auto it = probes.find(key);
      if (it != probes.end()) return it->second;
      const int threads = cpu_shares(n_vd)[0]->threads();
      plan::GroupPerf perf;
      perf.tp = 1;
      if (int8) perf.tflop_s = hardware::measure_cpu_int8_tops(threads, true).value;
      int8 = int8 && perf.tflop_s > 0;  // no VNNI here: the float GEMM
      if (!int8) perf.tflop_s = hardware::measure_cpu_gemm_tflops(threads, true).value;
      perf.gb_s = hardware::measure_cpu_triad_gbs(threads, true).value;
      std::cerr << "probe: " << perf.tflop_s * 1e3 << (int8 ? " GOP/s int8 VNNI, " : " GFLOP/s GEMM, ") << perf.gb_s
                << " GB/s triad (" << threads << " thread" << (threads == 1 ? "" : "s") << ", one of " << n_vd
                << " CPU share" << (n_vd == 1 ? "" : "s") << "); load average " << load_average() << "\n";
      return probes[key] = perf;
    };
    // The triad over a footprint of `bytes` (a model's weights): the rate
    // weights that fit in a cache are read at, which bounds the memory
    // efficiency of such a model above 1 (sim::CalibrationBounds::resident_gb_s).
    // Weights of over a quarter of the quick triad's 3 x 32 MiB are read
    // from memory: 0, the triad's bound (a probe of the synthetic model's
    // 109 MB read 1.13x the triad, the machine's noise).
    auto resident_probe = [&](int n_vd, double bytes) {
      if (o.no_resident_bound || bytes > 24.0 * (1 << 20)) return 0.0;
      const int threads = cpu_shares(n_vd)[0]->threads();
      const auto elements = static_cast<std::size_t>(std::max(1024.0, bytes / (3 * sizeof(double))));
      const int reps = static_cast<int>(std::clamp(4e9 / bytes, 10.0, 4000.0));
      const double gb_s = hardware::measure_cpu_triad_gbs(threads, elements, reps).value;
      std::cerr << "probe: " << gb_s << " GB/s triad over " << bytes / 1e6 << " MB (the weights' footprint); load average "
                << load_average() << "\n";
      return gb_s;
    };
    json::Json probes_json = json::Json::array();

    std::ofstream steps_out;
    if (!o.steps_out.empty()) {
      steps_out.open(o.steps_out);
      if (!steps_out) throw InputError("--steps-out: cannot write " + o.steps_out);
      g_steps_out = &steps_out;
    }
    std::vector<Row> rows;
    json::Json models = json::Json::array();
    bool wrote = false;
    for (const auto& name : o.models) {
      g_workload = name;
      std::string path;
      std::optional<control::Trace> trace;
      if (name == "azure-code") {
        if (!std::filesystem::exists(o.azure)) {
          std::cerr << "SKIP: azure-code: " << o.azure << " not found (set FTP_TEST_DATA or --azure-trace)\n";
          continue;
        }
        trace = control::read_trace(o.azure);
      }
      if (name == "stories260K") {
        if (!std::filesystem::exists(o.stories)) {
          std::cerr << "SKIP: stories260K: " << (o.stories.empty() ? "(no path)" : o.stories)
                    << " not found (set FTP_TEST_DATA or --stories)\n";
          continue;
        }
        path = o.stories;
      } else {
        testing::SyntheticShape s;
        s.n_layer = 8;
        s.n_embd = 512;
        s.n_ff = 1536;
        s.n_head = 8;
        s.n_head_kv = 4;
        s.n_vocab = 4096;
        s.n_ctx = 1024;
        path = o.synthetic_path.empty() ? (tmp / "synthetic.gguf").string() : o.synthetic_path;
        if (name == "synthetic-1b") {  // TinyLlama 1.1 B, Q8_0 (engine-bench's fastest CPU dtype)
          s.n_layer = 22, s.n_embd = 2048, s.n_ff = 5632, s.n_head = 32, s.n_head_kv = 4, s.n_vocab = 32000;
          s.n_ctx = 2048;
          s.dtype = model::DType::q8_0;
          path = (tmp / "synthetic-1b.gguf").string();
        }
        if (!std::filesystem::exists(path)) testing::write_synthetic_gguf(path, s);
      }
      auto model = model::load_model(path);
      engine::WeightStore store(model);
      const auto shape = plan::model_shape_of_file(path);
      const int vocab = model.hparams.n_vocab;

      // The real engine's CPU share; the shift workload's service splits the
      // CPUs at least two ways (gears a and b), its calibration runs on one.
      const int n_vd = name == "shift" ? std::max(2, o.split) : o.split;
      const bool packed_q8 = store.matrix_dtype() == model::DType::q8_0 && engine::ops::packed_kernels_available();
      const plan::GroupPerf perf = probe(n_vd, packed_q8);
      sim::CalibrationBounds bounds;
      // The packed Q8_0 kernels hide the weights' reads behind their
      // arithmetic: the fit may take compute and memory overlapped.
      bounds.try_overlap = packed_q8;
      bounds.resident_gb_s = resident_probe(
          n_vd, plan::stage_compute_params(shape, plan::StageSpan{shape.n_layers, true, true}) * shape.bytes_per_param);

      // 2. Calibration: runs of the real engine on their own workload
      // (another seed each), offered --concurrency by the planner's constants.
      auto alone_s = [&](const plan::Calibration& c) {
        Workload w;
        w.at = {0.0};
        w.prompt = {std::vector<int>(static_cast<std::size_t>((o.prompt_min + o.prompt_max) / 2), 5)};
        w.output = {(o.output_min + o.output_max) / 2};
        auto l = run_sim(model.hparams, shape, perf, c, w);
        return l.ttft_ms[0] * 1e-3 + l.tpot_ms[0] * 1e-3 * (w.output[0] - 1);
      };
      if (g_steps_out)
        *g_steps_out << json::Json{{"workload", name}, {"phase", "shape"}, {"n_layers", shape.n_layers},
                                   {"p", plan::stage_compute_params(shape, plan::StageSpan{shape.n_layers, true, true})},
                                   {"bytes_per_param", shape.bytes_per_param},
                                   {"kv_bytes_per_token_layer", shape.kv_bytes_per_token_layer(1)},
                                   {"n_heads", shape.n_heads}, {"head_dim", shape.head_dim},
                                   {"tflop_s", perf.tflop_s}, {"gb_s", perf.gb_s}}
                              .dump()
                       << "\n";
      // A few steps to warm caches and threads, not counted.
      g_phase = "warm-up";
      run_real(store, make_workload(o, 2, 1000.0, o.seed + 2000, vocab), nullptr, n_vd);
      const double t1 = alone_s(plan::Calibration{});
      std::vector<sim::StepSample> samples;
      std::vector<sim::StepSample> eval_steps;  // the evaluation runs' steps: the fit's held-out error
      std::vector<CpuShare> cal_cpu(static_cast<std::size_t>(o.repeat)), eval_cpu(cal_cpu.size());
      auto calibration_round = [&](int round) {
        g_phase = "calibration";
        run_real(store,
                 make_workload(o, o.calibration_requests, o.concurrency / t1, o.seed + 1000 + round, vocab,
                               model.hparams.n_ctx_train),
                 &samples, n_vd, &cal_cpu[static_cast<std::size_t>(round)]);
      };
      // The evaluation workload's rate is set by the first round's fit.
      calibration_round(0);
      const double rate = o.concurrency / alone_s(sim::fit_calibration(shape, perf, samples, bounds).calibration);
      const Workload w = trace ? trace_workload(o, *trace, o.requests, rate, o.seed, vocab, model.hparams.n_ctx_train)
                               : make_workload(o, o.requests, rate, o.seed, vocab);
      const auto topo = probe_topology(perf, n_vd);

      // 3. The evaluation workload through the real engine, --repeat rounds,
      // each after a calibration run (the first: above), so both sample the
      // machine's load alike; then through the simulated engine with the fit
      // of all rounds' calibration steps.
      json::Json shift_real = json::Json::array(), shift_sim;
      std::vector<Latencies> real;
      double real_s = 0;
      for (int round = 0; round < o.repeat; ++round) {
        if (round > 0) calibration_round(round);
        g_phase = "evaluation";
        const auto t_real0 = std::chrono::steady_clock::now();
        json::Json ev;
        real.push_back(name == "shift" ? run_service_shift(model, w, topo, n_vd, nullptr, ev)
                                       : run_real(store, w, &eval_steps, n_vd, &eval_cpu[static_cast<std::size_t>(round)]));
        real_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_real0).count();
        if (name == "shift") shift_real.push_back(ev);
        // The CPU the real engine got (the service's steps are not timed here).
        const auto& cc = cal_cpu[static_cast<std::size_t>(round)];
        const auto& ec = eval_cpu[static_cast<std::size_t>(round)];
        std::fprintf(stderr, "%s: round %d: CPU share of the real engine's steps: calibration %.2f, evaluation %s; "
                     "load average %s\n", name.c_str(), round + 1, cc.share(),
                     name == "shift" ? "(service, not timed)" : std::to_string(ec.share()).substr(0, 4).c_str(),
                     load_average().c_str());
      }
      const auto fit = sim::fit_calibration(shape, perf, samples, bounds);
      const auto& cal = fit.calibration;
      // The same steps fitted without the kernel-pass term (row tile 0):
      // its errors below, beside the full fit's, on the same measurements.
      sim::CalibrationBounds no_pass = bounds;
      no_pass.row_tiles = {0};
      const auto fit0 = sim::fit_calibration(shape, perf, samples, no_pass);
      std::cerr << name << ": calibration from " << samples.size() << " steps in " << o.repeat
                << " round" << (o.repeat == 1 ? "" : "s") << ", rms relative error " << fit.rms_error * 100
                << " % (row tile " << cal.row_tile << ", pass efficiency " << cal.pass_efficiency
                << "; without the pass term " << fit0.rms_error * 100 << " %), at a bound: "
                << sim::describe_bounds(fit.at_bound) << "; row tiles tried (rms relative to the prediction):";
      for (const auto& tt : fit.tiles)
        std::cerr << " " << tt.row_tile << (tt.split_kv ? " (KV apart)" : "") << (tt.overlap ? " (overlap)" : "") << ": "
                  << tt.rms * 100 << " %";
      std::cerr << "; KV reads' efficiency " << (cal.kv_efficiency > 0 ? std::to_string(cal.kv_efficiency) : "the weights'")
                << "; compute and memory " << (cal.overlap ? "overlapped" : "added");
      std::cerr << "\n";
      // The model's total over the measured total, on the steps it was fitted
      // to and on the evaluation runs' steps (held out; not for the service).
      auto total_ratio = [&](const std::vector<sim::StepSample>& steps, const plan::Calibration& c) {
        const plan::StageSpan span{shape.n_layers, true, true};
        double p = 0, m = 0;
        for (const auto& st : steps) p += plan::step_time_s(shape, span, perf, st.work, c), m += st.seconds;
        return m > 0 ? p / m : 0;
      };
      const double cal_total = total_ratio(samples, cal), eval_total = total_ratio(eval_steps, cal);
      const double eval_rms = eval_steps.empty() ? 0 : sim::calibration_rms_error(shape, perf, cal, eval_steps);
      if (!eval_steps.empty()) {
        std::fprintf(stderr, "%s: step time model/measured: calibration steps' total %.3f; evaluation steps' (%zu) total "
                     "%.3f, rms relative error %.1f %%\n", name.c_str(), cal_total, eval_steps.size(), eval_total,
                     eval_rms * 100);
        std::fprintf(stderr, "%s: without the pass term: calibration steps' total %.3f; evaluation steps' total %.3f, "
                     "rms relative error %.1f %%\n", name.c_str(), total_ratio(samples, fit0.calibration),
                     total_ratio(eval_steps, fit0.calibration),
                     sim::calibration_rms_error(shape, perf, fit0.calibration, eval_steps) * 100);
        // The held-out decode steps (one token a row) by their rows: the
        // model's total over the measured, with and without the pass term.
        const plan::StageSpan span{shape.n_layers, true, true};
        std::map<int, std::array<double, 3>> by_rows;  // rows -> model, model without passes, measured
        for (const auto& st : eval_steps) {
          if (st.work.tokens != st.work.logit_rows || st.work.tokens > 16) continue;
          auto& b = by_rows[static_cast<int>(st.work.tokens)];
          b[0] += plan::step_time_s(shape, span, perf, st.work, cal);
          b[1] += plan::step_time_s(shape, span, perf, st.work, fit0.calibration);
          b[2] += st.seconds;
        }
        std::fprintf(stderr, "%s: evaluation decode steps, model/measured by rows (with / without the pass term):", name.c_str());
        for (const auto& [r, b] : by_rows) std::fprintf(stderr, " %d: %.3f/%.3f", r, b[0] / b[2], b[1] / b[2]);
        std::fprintf(stderr, "\n");
        // The held-out steps with a prefill chunk (more tokens than logits
        // rows) by their attention pairs: long prompts' chunks are where
        // the attention term weighs (azure-code's TPOT tail).
        const std::array<double, 3> edges{5000, 20000, 1e300};
        std::array<std::array<double, 3>, 3> by_pairs{};  // model, measured, steps
        for (const auto& st : eval_steps) {
          if (st.work.tokens <= st.work.logit_rows) continue;
          const auto k = static_cast<std::size_t>(std::upper_bound(edges.begin(), edges.end(), st.work.attention_pairs) -
                                                  edges.begin());
          auto& b = by_pairs[std::min<std::size_t>(k, 2)];
          b[0] += plan::step_time_s(shape, span, perf, st.work, cal);
          b[1] += st.seconds;
          b[2] += 1;
        }
        std::fprintf(stderr, "%s: evaluation steps with a prefill chunk, model/measured by attention pairs:", name.c_str());
        const char* labels[3] = {"under 5000", "5000-20000", "over 20000"};
        for (std::size_t k = 0; k < 3; ++k)
          if (by_pairs[k][2] > 0)
            std::fprintf(stderr, " %s: %.3f (%.0f steps)", labels[k], by_pairs[k][0] / by_pairs[k][1], by_pairs[k][2]);
        std::fprintf(stderr, "\n");
      }
      json::Json sweep;
      if (o.sweep && name != "shift")
        sweep = sweep_decode(name, store, shape, perf, cal, fit0.calibration, n_vd, o.sweep_contexts, o.sweep_rows,
                             o.sweep_reps);
      const auto t_sim0 = std::chrono::steady_clock::now();
      Latencies simd = name == "shift" ? run_service_shift(model, w, topo, n_vd,
                                                           sim::engine_factory(shape, model, topo, cal,
                                                                               sim::Pacing::wait_real_time),
                                                           shift_sim)
                                       : run_sim(model.hparams, shape, perf, cal, w);
      const double sim_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_sim0).count();
      // The same workload on the fit without the kernel-pass term (virtual
      // time; the shift workload's service runs in real time: not repeated).
      std::optional<Latencies> sim_no_pass;
      if (name != "shift") sim_no_pass = run_sim(model.hparams, shape, perf, fit0.calibration, w);
      if (name == "shift") std::cerr << "shift: real " << shift_real.dump() << "\nshift: sim  " << shift_sim.dump() << "\n";

      // Each metric of the real engine: the median of the rounds' values.
      using Pick = std::vector<double> Latencies::*;
      auto metric = [&](const char* label, Pick pick, double pct) {
        std::vector<double> v;
        for (const auto& l : real) v.push_back(bench::percentile(l.*pick, pct));
        Row r{name, label, bench::percentile(v, 50), bench::percentile(simd.*pick, pct)};
        r.rounds = v;
        if (sim_no_pass) r.sim_no_pass = bench::percentile((*sim_no_pass).*pick, pct);
        return r;
      };
      std::vector<Row> mine = {
          metric("TTFT P50 ms", &Latencies::ttft_ms, 50), metric("TTFT P99 ms", &Latencies::ttft_ms, 99),
          metric("TPOT P50 ms", &Latencies::tpot_ms, 50), metric("TPOT P99 ms", &Latencies::tpot_ms, 99),
          metric("E2E P50 ms", &Latencies::e2e_ms, 50),   metric("E2E P99 ms", &Latencies::e2e_ms, 99),
      };
      json::Json metrics = json::Json::array();
      for (const auto& r : mine) {
        metrics.push_back(json::Json{{"metric", r.metric}, {"real", r.real}, {"real_rounds", r.rounds}, {"sim", r.sim},
                                     {"ratio", r.ratio()}, {"within_10pct", r.within()},
                                     {"sim_no_pass", r.sim_no_pass > 0 ? json::Json(r.sim_no_pass) : json::Json()}});
        rows.push_back(r);
      }
      models.push_back(json::Json{{"model", name},
                                  {"load_average", load_average()},
                                  {"n_params", shape.n_params},
                                  {"cpu_shares", n_vd},
                                  {"probe", json::Json{{"tflop_s", perf.tflop_s}, {"gb_s", perf.gb_s}}},
                                  {"rate_rps", rate},
                                  {"requests", o.requests},
                                  {"rounds", o.repeat},
                                  {"cpu_share", [&] {
                                     json::Json a = json::Json::array();
                                     for (std::size_t i = 0; i < cal_cpu.size(); ++i)
                                       a.push_back(json::Json{{"calibration", cal_cpu[i].share()},
                                                              {"evaluation", eval_cpu[i].share()}});
                                     return a;
                                   }()},
                                  {"calibration", sim::calibration_to_json(cal, perf, fit.rms_error, fit.at_bound)},
                                  {"calibration_steps", samples.size()},
                                  {"step_total_ratio", json::Json{{"calibration", cal_total},
                                                                  {"evaluation", eval_steps.empty() ? json::Json() : json::Json(eval_total)},
                                                                  {"evaluation_rms", eval_steps.empty() ? json::Json() : json::Json(eval_rms)}}},
                                  {"real_wall_s", real_s},
                                  {"sim_wall_s", sim_wall_s},
                                  {"shift", json::Json{{"real", shift_real}, {"sim", shift_sim}}},
                                  {"sweep", sweep},
                                  {"metrics", metrics}});
      if (!o.write_calibration.empty() && !wrote) {
        std::ofstream(o.write_calibration) << sim::calibration_to_json(cal, perf, fit.rms_error, fit.at_bound).dump(2)
                                           << "\n";
        // The probed device as a one-device topology for ftp-serve --engine sim.
        std::ofstream(o.write_calibration + ".topology.json") << doc::to_json(probe_topology(perf, 1)).dump(2) << "\n";
        wrote = true;
      }
      std::fprintf(stderr,
                   "%s: %d requests at %.2f req/s, %d round%s; real runs %.1f s, simulated run %.3f s of wall time; "
                   "load average %s\n",
                   name.c_str(), o.requests, rate, o.repeat, o.repeat == 1 ? "" : "s", real_s, sim_wall_s,
                   load_average().c_str());
    }

    std::fprintf(stderr, "\nload average at the end: %s\n", load_average().c_str());
    std::fprintf(stderr, "%-12s %-12s %10s %21s %10s %8s %-11s %s\n", "workload", "metric", "real", "(rounds' range)",
                 "sim", "sim/real", "within 10 %", "sim/real without the pass term");
    bool all = true;
    for (const auto& r : rows) {
      const auto [lo, hi] = std::minmax_element(r.rounds.begin(), r.rounds.end());
      char range[64];
      std::snprintf(range, sizeof range, "(%.3f-%.3f)", *lo, *hi);
      char no_pass[32] = "-";
      if (r.sim_no_pass > 0 && r.real > 0) std::snprintf(no_pass, sizeof no_pass, "%.3f", r.sim_no_pass / r.real);
      std::fprintf(stderr, "%-12s %-12s %10.3f %21s %10.3f %8.3f %-11s %s\n", r.model.c_str(), r.metric.c_str(), r.real,
                   range, r.sim, r.ratio(), r.within() ? "yes" : "NO", no_pass);
      all = all && r.within();
    }
    tool.emit(json::Json{{"kind", "ftp.sim-fidelity/v1"},
                         {"models", models},
                         {"load_average", load_average()},
                         {"all_within_10pct", all}});
    if (o.check && !all) {
      std::cerr << "sim-fidelity: a metric is off by more than 10 % (--check)\n";
      return static_cast<int>(Exit::check_failed);
    }
    return 0;
  });
}
