// SPDX-License-Identifier: Apache-2.0
#include "plan/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "model/tp_split.hpp"
#include "plan/device_memory.hpp"

namespace ftp::plan {

Workload resolve(const Workload& w, const ModelShape& m) {
  Workload r = w;
  if (r.context <= 0) r.context = m.context_length;
  const int dflt_prompt = 512, dflt_output = 128;
  if (r.prompt_tokens <= 0 && r.output_tokens <= 0 && dflt_prompt + dflt_output > r.context) {
    r.prompt_tokens = std::max(1, r.context * 4 / 5);
    r.output_tokens = std::max(1, r.context - r.prompt_tokens);
  }
  if (r.prompt_tokens <= 0) r.prompt_tokens = dflt_prompt;
  if (r.output_tokens <= 0) r.output_tokens = dflt_output;
  if (static_cast<std::int64_t>(r.prompt_tokens) + r.output_tokens > r.context)
    throw InputError("the reference request (" + std::to_string(r.prompt_tokens) + " prompt + " +
                     std::to_string(r.output_tokens) + " output tokens) is longer than the context (" +
                     std::to_string(r.context) + " tokens)");
  return r;
}

double allreduce_time_s(int n, double bytes, double busbw_gb_s, double latency_us) {
  if (n <= 1) return 0;
  double t = latency_us * 1e-6;
  if (busbw_gb_s > 0) t += 2.0 * (n - 1) / n * bytes / (busbw_gb_s * 1e9);
  return t;
}

double p2p_time_s(double bytes, double gb_s, double latency_us) {
  return (gb_s > 0 ? bytes / (gb_s * 1e9) : 0) + latency_us * 1e-6;
}

double pipeline_bubble(int pp, int micro_batches) {
  return pp <= 1 ? 0.0 : double(pp - 1) / double(micro_batches + pp - 1);
}

double stage_compute_params(const ModelShape& m, const StageSpan& s) {
  return s.n_layers * m.layer_params() + (s.last ? m.head_params() : 0);
}

double stage_weight_params(const ModelShape& m, const StageSpan& s) {
  return stage_compute_params(m, s) + (s.first ? m.embedding_params() : 0);
}

double kernel_passes(double rows, int row_tile) {
  if (row_tile <= 0 || !(rows >= 1)) return 0;
  const auto t = static_cast<std::uint64_t>(std::llround(rows));
  const auto tile = static_cast<std::uint64_t>(row_tile);
  return static_cast<double>(t / tile + static_cast<std::uint64_t>(std::popcount(t % tile)));
}

double extra_passes(double rows, int row_tile) {
  if (row_tile <= 0 || !(rows >= 1)) return 0;
  return kernel_passes(rows, row_tile) - std::round(rows) / row_tile;
}

double pass_bytes(const ModelShape& m, const StageSpan& s, int tp, const StepWork& w, int row_tile) {
  if (row_tile <= 0) return 0;
  const double params = s.n_layers * m.layer_params() * extra_passes(w.tokens, row_tile) +
                        (s.last ? m.head_params() * extra_passes(w.logit_rows, row_tile) : 0.0);
  return params * m.bytes_per_param / tp;
}

double step_time_s(const ModelShape& m, const StageSpan& s, const GroupPerf& g, const StepWork& w, const Calibration& c) {
  const double p = stage_compute_params(m, s);
  const double flop_s = g.tp * g.tflop_s * 1e12;
  double compute = 2.0 * p * w.tokens / (flop_s * c.compute_efficiency);
  if (w.attention_pairs > 0)
    compute += 4.0 * w.attention_pairs * m.n_heads * m.head_dim * s.n_layers / (flop_s * c.attention_efficiency);
  if (c.row_tile > 0) compute += pass_bytes(m, s, g.tp, w, c.row_tile) / (g.gb_s * 1e9 * c.pass_efficiency);
  const double weight_bytes = p * m.bytes_per_param / g.tp;
  const double kv_bytes = w.kv_positions * s.n_layers * m.kv_bytes_per_token_layer(g.tp);
  // Tied (kv_efficiency 0), the one quotient of before: the planner's and
  // the GPU replays' step times stay the same to the last bit.
  const double read = c.kv_efficiency > 0 ? weight_bytes / (g.gb_s * 1e9 * c.memory_efficiency) +
                                                kv_bytes / (g.gb_s * 1e9 * c.kv_efficiency)
                                          : (weight_bytes + kv_bytes) / (g.gb_s * 1e9 * c.memory_efficiency);
  const double ar = allreduce_time_s(g.tp, double(m.hidden_size) * w.tokens * m.activation_bytes_per_element(),
                                     g.busbw_gb_s, g.allreduce_latency_us);
  return (c.overlap ? std::max(compute, read) : compute + read) + 2.0 * s.n_layers * ar +
         s.n_layers * c.layer_overhead_s + (s.last ? w.logit_rows * c.row_overhead_s : 0.0);
}

double prefill_time_s(const ModelShape& m, const StageSpan& s, const GroupPerf& g, double tokens) {
  // Small prefills are bound by reading the weights once, like a decode step.
  return step_time_s(m, s, g, StepWork{tokens, 0, 0, 0});
}

double decode_time_s(const ModelShape& m, const StageSpan& s, const GroupPerf& g, double batch, double context) {
  return step_time_s(m, s, g, StepWork{batch, 0, batch * context, 0});
}

int logit_rows(const Workload& w) { return std::max(0, std::min(w.max_batched_tokens, kMaxDecodeBatch)); }

double head_floats_per_row(const ModelShape& m, int tp, int rank, bool staged) {
  const double v = m.vocab_size;
  if (tp <= 1) return v;
  const double own = model::row_split(m.vocab_size, tp, rank).size();
  if (rank != 0) return own;
  return v + own + (staged ? v - own : 0.0);
}

double rank_activations(const ModelShape& m, const StageSpan& s, const GroupPerf& g, const Workload& w, int rank) {
  double a = double(w.max_batched_tokens) * (4.0 * m.hidden_size + 2.0 * m.intermediate_size / g.tp);
  if (s.last) a += double(logit_rows(w)) * head_floats_per_row(m, g.tp, rank, g.gpu);
  return a * kActivationBytesPerElement;
}

StageMemory stage_memory(const ModelShape& m, const StageSpan& s, const GroupPerf& g, const Workload& w, int concurrency,
                         int context) {
  StageMemory r;
  // Rank 0 holds the most: the head, and the larger feed-forward share.
  r.weights = shard_union_bytes(m, {Shard{0, s.n_layers, g.tp, 0, s.first, s.last}});
  r.activations = rank_activations(m, s, g, w, 0);
  const double per_token = s.n_layers * m.kv_bytes_per_token_layer(g.tp);
  r.kv_needed = double(concurrency) * context * per_token;
  if (g.gpu) r.gpu_reserve = GpuOverheads{}.rank_reserve(s.n_layers);
  r.kv_pool = std::max(0.0, kKvCacheCap * (double(g.memory_bytes) - r.weights - r.activations - r.gpu_reserve));
  r.need = r.weights + r.activations + r.gpu_reserve + r.kv_needed / kKvCacheCap;
  r.kv_tokens = per_token > 0 ? r.kv_pool / per_token : 0;
  return r;
}

namespace {

/// estimate_replica's schedule for one micro-batch count `mb`.
ReplicaEstimate estimate_with(const ModelShape& m, const std::vector<ReplicaStage>& stages, const Workload& w, int batch,
                              int mb) {
  ReplicaEstimate e;
  const int pp = static_cast<int>(stages.size());
  e.batch = batch;
  e.micro_batches = mb;
  e.bubble = pipeline_bubble(pp, mb);
  const double act = double(m.hidden_size) * m.activation_bytes_per_element();
  // The engine runs each step as one pass of its micro-batches through the
  // pipeline (Executor::run_micro_batches, SimulatedEngine::schedule_s):
  // mb + pp - 1 ticks of the slowest stage, and the next step starts when
  // the last micro-batch leaves the last stage.
  const int ticks = mb + pp - 1;

  const double prompt_total = double(e.batch) * w.prompt_tokens;
  const double chunks = std::ceil(prompt_total / w.max_batched_tokens);
  const double mb_tokens = prompt_total / (chunks * mb);
  double prefill_max = 0;
  for (int i = 0; i < pp; ++i) {
    const auto& st = stages[static_cast<std::size_t>(i)];
    double t = prefill_time_s(m, st.span, st.perf, mb_tokens);
    if (i + 1 < pp) t += p2p_time_s(mb_tokens * act, st.send_gb_s, st.send_latency_us);
    prefill_max = std::max(prefill_max, t);
  }
  e.prefill_s = chunks * ticks * prefill_max;

  const double mb_batch = double(e.batch) / mb;
  const double context = w.prompt_tokens + w.output_tokens / 2.0;
  double decode_max = 0, decode_sum = 0;
  for (int i = 0; i < pp; ++i) {
    const auto& st = stages[static_cast<std::size_t>(i)];
    double t = decode_time_s(m, st.span, st.perf, mb_batch, context);
    if (i + 1 < pp) t += p2p_time_s(mb_batch * act, st.send_gb_s, st.send_latency_us);
    decode_max = std::max(decode_max, t);
    decode_sum += t;
  }
  e.decode_round_s = ticks * decode_max;
  e.spread = decode_max > 0 ? (decode_max - decode_sum / pp) / decode_max : 0;
  e.rps = e.batch / (e.prefill_s + w.output_tokens * e.decode_round_s);
  e.tokens_s = e.rps * w.output_tokens;
  e.prefill_tokens_s = e.prefill_s > 0 ? prompt_total / e.prefill_s : 0;
  e.decode_tokens_s = e.decode_round_s > 0 ? e.batch / e.decode_round_s : 0;
  return e;
}

}  // namespace

ReplicaEstimate estimate_replica(const ModelShape& m, const std::vector<ReplicaStage>& stages, const Workload& w,
                                 double kv_tokens) {
  const int pp = static_cast<int>(stages.size());
  if (pp == 0) return {};
  const double req_tokens = double(w.prompt_tokens) + w.output_tokens;
  const int batch = static_cast<int>(std::clamp(std::floor(kv_tokens / req_tokens), 1.0, double(kMaxDecodeBatch)));
  // More micro-batches overlap the stages, but each re-reads its stage's
  // weights: a memory-bound decode is fastest with one, a compute-bound
  // prefill with pp. The gear takes the count that serves the most.
  ReplicaEstimate best = estimate_with(m, stages, w, batch, 1);
  for (int mb = 2; mb <= std::min(pp, batch); ++mb) {
    ReplicaEstimate e = estimate_with(m, stages, w, batch, mb);
    if (e.rps > best.rps) best = e;
  }
  return best;
}

}  // namespace ftp::plan
