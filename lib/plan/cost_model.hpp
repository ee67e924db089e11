// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <cstdint>
#include <vector>

#include "plan/model_shape.hpp"

/// The planner's cost model: time and memory of one pipeline stage, and the
/// throughput of one data-parallel replica, from measured device speeds
/// (ftp.topology/v1). Formulas are written next to each function and in
/// ftp-plan(1). Units: seconds, bytes, 1 GB/s = 1e9 B/s, 1 TFLOP/s = 1e12 FLOP/s.
namespace ftp::plan {

/// Share of a device's measured GEMM TFLOP/s that model GEMMs reach.
inline constexpr double kComputeEfficiency = 0.5;
/// Share of a device's measured triad GB/s that weight and KV reads reach.
inline constexpr double kMemoryEfficiency = 0.7;
/// Share of the memory left after weights and activations that the KV pool
/// may take; the rest is room for a shadow domain during a shift.
inline constexpr double kKvCacheCap = 0.7;
/// safe capacity = kSafeFraction x max capacity (ARCHITECTURE.md, capacity).
inline constexpr double kSafeFraction = 0.8;
/// Bytes per activation element of the scheduler's scratch buffers (f32).
inline constexpr double kActivationBytesPerElement = 4;
/// Fixed cost of one layer in one forward pass (kernel launches, thread
/// hand-offs), seconds; keeps tiny models from looking infinitely fast.
inline constexpr double kLayerOverheadS = 20e-6;
/// Largest decode batch a replica is credited with.
inline constexpr int kMaxDecodeBatch = 256;

/// The traffic a gear is planned for.
struct Workload {
  int prompt_tokens = 0;          ///< reference request: prompt tokens; 0: 512, shrunk to fit the context
  int output_tokens = 0;          ///< reference request: generated tokens; 0: 128, shrunk to fit the context
  int concurrency = 8;            ///< requests a gear must hold at once, at `context` tokens each
  int context = 0;                ///< tokens per request the KV cache must hold; 0: the model's context_length
  int max_batched_tokens = 2048;  ///< scheduler token budget per step (activations)
};

/// The workload with its defaults filled in for a model: context (the model's
/// context_length), prompt and output tokens (512 and 128, or 4/5 and 1/5 of a
/// context shorter than 640 tokens). Throws InputError when the reference request
/// is longer than the context.
Workload resolve(const Workload& w, const ModelShape& m);

/// What a GPU holds besides weights, KV and activations: captured CUDA
/// graphs and NCCL communicator buffers. Estimates with their sources, to
/// be replaced by measurements from a device session (tests/gpu/README.md).
/// CPU virtual devices hold neither.
struct GpuOverheads {
  /// NCCL_BUFFSIZE's default, 4 MiB: "the size of the buffer used by NCCL
  /// when communicating data between pairs of GPUs" (NCCL user guide,
  /// Environment Variables, NCCL_BUFFSIZE:
  /// https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
  double nccl_buffer_bytes = 4.0 * 1024 * 1024;
  /// Channels of one communicator, each with its own buffer. NCCL picks
  /// them per topology (NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS, same
  /// page; NCCL_DEBUG=INFO prints them); 32 is what NVLink machines open,
  /// an upper estimate for PCIe ones. Ours.
  int nccl_channels = 32;
  /// Device memory per node of an instantiated graph: 64 KiB, from a
  /// measurement on NVIDIA's forum (graphs of 500, 1000 and 2000 empty
  /// kernels took 362, 395 and 458 MB: about 64 KB a node;
  /// https://forums.developer.nvidia.com/t/increasing-memory-footprint-with-large-task-graphs/244901).
  double graph_node_bytes = 64.0 * 1024;
  /// Kernel nodes of one layer of a captured decode step (norms, products,
  /// RoPE and KV write, attention, SiLU-multiply, adds, two all-reduces),
  /// and of a stage's ends (embedding, final norm, head). Ours, from
  /// lib/engine/cuda/cuda_backend.cpp's decode sequence.
  int graph_nodes_per_layer = 16;
  int graph_nodes_per_stage = 8;
  /// Decode batch sizes each rank captures (the CUDA backend's default
  /// FTP_CUDA_GRAPH_BATCHES, 1-32).
  int graph_batches = 32;
  /// Communicators a device may be in at once: the root one and one split
  /// per gear of a planner's table (at most four gears).
  int max_communicators = 5;
  /// What the planner's search sets aside on each rank of a GPU stage of
  /// `n_layers` layers (stage_memory), before the table exists: the graphs
  /// of two domains of that stage (its gear's and a shadow's of its size)
  /// and max_communicators communicators' buffers. device_memory counts the
  /// table's own (tests/tools/plan.sh checks that chosen tables fit it).
  double rank_reserve(int n_layers) const {
    return 2.0 * graph_batches * (double(n_layers) * graph_nodes_per_layer + graph_nodes_per_stage) * graph_node_bytes +
           double(max_communicators) * nccl_channels * nccl_buffer_bytes;
  }
};

/// Speed and memory of one tensor-parallel group: the `tp` ranks of one stage.
/// The slowest rank sets the pace, the smallest rank the memory.
struct GroupPerf {
  int tp = 1;
  double tflop_s = 0;               ///< TFLOP/s of the slowest rank
  double gb_s = 0;                  ///< memory GB/s of the slowest rank
  double busbw_gb_s = 0;            ///< all-reduce bus bandwidth over the group, GB/s; unused for tp 1
  double allreduce_latency_us = 0;  ///< latency term of one all-reduce over the group, us
  std::uint64_t memory_bytes = 0;   ///< memory of the smallest rank, bytes
  bool gpu = false;                 ///< every rank is a GPU (or MIG slice): stage_memory sets GpuOverheads aside
  /// Two ranks with no link between them ("a and b") where no island
  /// all-reduce covers the group: such a group cannot run its all-reduces.
  std::string unlinked;
};

/// Which layers a stage runs: a count, and whether it holds the embedding (first) and the head (last).
struct StageSpan {
  int n_layers = 0;
  bool first = false;
  bool last = false;
};

/// Ring all-reduce of `bytes` over n ranks (nccl-tests): 2(n-1)/n x bytes / busbw + latency; 0 for n <= 1. Seconds.
double allreduce_time_s(int n, double bytes, double busbw_gb_s, double latency_us);
/// Point-to-point send between pipeline stages: bytes / bandwidth + latency. Seconds.
double p2p_time_s(double bytes, double gb_s, double latency_us);
/// GPipe bubble share: (pp - 1) / (micro_batches + pp - 1).
double pipeline_bubble(int pp, int micro_batches);

/// Parameters whose GEMMs a stage runs: its layers, plus the output head on the last stage.
double stage_compute_params(const ModelShape& m, const StageSpan& s);
/// Parameters a stage stores: compute params, plus the embedding on the first stage.
double stage_weight_params(const ModelShape& m, const StageSpan& s);

/// The work of one forward pass on one stage (one micro-batch), as the
/// simulated engine counts it from the scheduler's chunks.
struct StepWork {
  double tokens = 0;           ///< tokens through the stage's GEMMs
  double attention_pairs = 0;  ///< (query token, key position) pairs of attention, summed over chunks
  double kv_positions = 0;     ///< KV positions read once per chunk: sum of (start + tokens) over chunks
  double logit_rows = 0;       ///< rows of the output head (last stage only)
};

/// The constants that turn a device's measured speeds into a forward's time.
/// The defaults are the planner's (GPU: compute and memory traffic overlap);
/// a calibration run fits them to one machine (sim::calibrate).
struct Calibration {
  double compute_efficiency = kComputeEfficiency;    ///< share of TFLOP/s the GEMMs reach
  double attention_efficiency = kComputeEfficiency;  ///< share of TFLOP/s attention reaches
  double memory_efficiency = kMemoryEfficiency;      ///< share of GB/s weight (and KV) reads reach
  /// Share of GB/s the KV reads reach, where it is not the weights' (0: the
  /// memory_efficiency). A CPU's attention reads each sequence's KV pages
  /// per row, at a rate its streaming of the weights says nothing of: on
  /// stories260K, whose weights stay in cache, a decode row's position
  /// costs ~0.1 us beside its attention, ~6 GB/s of KV.
  double kv_efficiency = 0;
  double layer_overhead_s = kLayerOverheadS;         ///< per layer per forward, seconds
  double row_overhead_s = 0;                         ///< per logits row (head, sampling), seconds
  /// Rows of the products' kernel: a product of t rows runs as
  /// kernel_passes(t, row_tile) passes, each streaming the weights once
  /// more (from cache, after the first read from memory); the passes beyond
  /// the rows' share of full tiles (extra_passes) are the pass term. 0: no
  /// pass term (GPUs: the datasheet calibrations).
  int row_tile = 0;
  /// The rate a kernel pass streams the stage's weights, as a multiple of
  /// the device's GB/s (a pass reads them from cache: more than 1).
  double pass_efficiency = 1;
  /// true: time = max(compute, memory) (GPUs overlap them); false: their sum
  /// (a CPU's cores do both).
  bool overlap = true;
};

/// Passes of a product's kernel over the weights for `rows` rows, when
/// the kernel takes `row_tile` rows at a time and a remainder in kernels of
/// power-of-two widths (OpenBLAS's SGEMM: 4, then 2 and 1): floor(rows /
/// row_tile) + popcount(rows mod row_tile). 0 for row_tile <= 0 or no rows.
double kernel_passes(double rows, int row_tile);

/// The passes beyond the rows' share of full tiles: kernel_passes(rows) -
/// rows / row_tile, >= 0: 0 for a multiple of the tile, 1.25 for 3 rows of
/// a 4-row tile (a pass of 2 and one of 1). A product's time is
/// c_pass x kernel_passes + c_row x rows = (c_pass / row_tile + c_row) x
/// rows + c_pass x extra_passes: the first part is the GEMM term (its rate
/// for many rows, which the probe bounds), the second the pass term.
double extra_passes(double rows, int row_tile);

/// The weight bytes that the extra passes of one forward stream (per rank):
///   (n_layers x layer_params x extra_passes(tokens) + head_params x extra_passes(logit_rows) [last stage])
///   x bytes_per_param / tp
/// (the head runs on the logits rows only). 0 for row_tile <= 0.
double pass_bytes(const ModelShape& m, const StageSpan& s, int tp, const StepWork& w, int row_tile);

/// One forward of `w` on one stage:
///   compute = (2 x P x tokens / compute_efficiency + 4 x pairs x n_heads x head_dim x n_layers / attention_efficiency)
///             / (tp x TFLOP/s) + pass_bytes(row_tile) / (GB/s x pass_efficiency)
///   memory  = P x bytes_per_param / tp / (GB/s x memory_efficiency)
///             + kv_positions x n_layers x kv_bytes_per_token_layer(tp) / (GB/s x kv_efficiency [memory_efficiency if 0])
///   time = max(compute, memory) (sum when !overlap) + 2 x n_layers x allreduce(tp, hidden x tokens x activation bytes)
///          + n_layers x layer_overhead_s + logit_rows x row_overhead_s
/// with P = stage_compute_params. Seconds.
double step_time_s(const ModelShape& m, const StageSpan& s, const GroupPerf& g, const StepWork& w,
                   const Calibration& c = {});

/// Prefill of `tokens` tokens on one stage:
///   max(2 x P x tokens / (tp x TFLOP/s x kComputeEfficiency), P x bytes_per_param / tp / (GB/s x kMemoryEfficiency))
///   + 2 x n_layers x allreduce(tp, hidden x tokens x activation bytes) + n_layers x kLayerOverheadS
/// with P = stage_compute_params. Attention's context-quadratic FLOPs are not counted. Seconds.
double prefill_time_s(const ModelShape& m, const StageSpan& s, const GroupPerf& g, double tokens);
/// One decode step of `batch` sequences of `context` tokens on one stage:
///   max((P x bytes_per_param / tp + batch x context x n_layers x kv_bytes_per_token_layer(tp)) / (GB/s x kMemoryEfficiency),
///       2 x P x batch / (tp x TFLOP/s x kComputeEfficiency))
///   + 2 x n_layers x allreduce(tp, hidden x batch x activation bytes) + n_layers x kLayerOverheadS. Seconds.
double decode_time_s(const ModelShape& m, const StageSpan& s, const GroupPerf& g, double batch, double context);

/// Logits rows a last stage holds at once: one per sequence of a step, so
/// at most kMaxDecodeBatch (the largest batch the planner credits) and
/// max_batched_tokens.
int logit_rows(const Workload& w);
/// Floats per logits row that rank `rank` of a last stage of degree `tp`
/// holds for the vocabulary-parallel head (engine::Executor,
/// RankBackend::gather_columns): its slice of the vocabulary
/// (model::row_split); rank 0 also the full rows, which the others' slices
/// are gathered into (at tp 1 only those); with `staged` (GPUs at tp > 1:
/// NCCL receives a peer's rows whole before it places them) rank 0 also the
/// peers' slices as received.
double head_floats_per_row(const ModelShape& m, int tp, int rank, bool staged);
/// Activations of rank `rank` of a stage, bytes:
///   max_batched_tokens x (4 hidden + 2 intermediate/tp) x 4
///   + on the last stage: logit_rows x head_floats_per_row(tp, rank, gpu) x 4.
double rank_activations(const ModelShape& m, const StageSpan& s, const GroupPerf& g, const Workload& w, int rank);

/// Memory of one rank of a stage, bytes.
struct StageMemory {
  double weights = 0;      ///< rank 0's weights, the most of any rank: shard_union_bytes of its one shard
  double activations = 0;  ///< rank 0's, the most of any rank: rank_activations(rank 0)
  double kv_needed = 0;    ///< concurrency x context x n_layers x kv_bytes_per_token_layer(tp)
  double kv_pool = 0;      ///< kKvCacheCap x (memory - weights - activations), >= 0
  double need = 0;         ///< weights + activations + kv_needed / kKvCacheCap: memory the rank must have
  double kv_tokens = 0;    ///< tokens the KV pool holds: kv_pool / (n_layers x kv_bytes_per_token_layer(tp))
  double gpu_reserve = 0;  ///< GPUs: GpuOverheads::rank_reserve (graphs, NCCL buffers), in need and out of the KV pool
  bool fits(std::uint64_t memory_bytes) const { return need <= static_cast<double>(memory_bytes); }
};
/// `concurrency` requests of `context` tokens held by this stage's replica.
StageMemory stage_memory(const ModelShape& m, const StageSpan& s, const GroupPerf& g, const Workload& w, int concurrency,
                         int context);

/// One stage of a replica, as the cost model sees it.
struct ReplicaStage {
  StageSpan span;
  GroupPerf perf;
  double send_gb_s = 0;         ///< link to the next stage (unused on the last)
  double send_latency_us = 0;
};

/// Estimated steady-state throughput of one replica for the reference request.
struct ReplicaEstimate {
  int batch = 0;            ///< sequences decoded together: min(kv_tokens / (prompt + output), kMaxDecodeBatch), >= 1
  int micro_batches = 1;    ///< the count m in 1..min(pp, batch) whose schedule gives the most rps
  double prefill_s = 0;     ///< prefill of `batch` prompts
  double decode_round_s = 0;///< one token for each of `batch` sequences
  double bubble = 0;        ///< pipeline_bubble(pp, micro_batches)
  double spread = 0;        ///< (slowest - mean) / slowest decode stage time
  double rps = 0;           ///< batch / (prefill_s + output_tokens x decode_round_s)
  double tokens_s = 0;      ///< rps x output_tokens
  double prefill_tokens_s = 0;  ///< batch x prompt_tokens / prefill_s: prefill only
  double decode_tokens_s = 0;   ///< batch / decode_round_s: decode only
};
/// Throughput of one replica whose KV pool holds `kv_tokens` tokens:
///   prefill_s = chunks x (m + pp - 1) x max_s (prefill_s(batch x prompt / (chunks x m)) + send)
///     with chunks = ceil(batch x prompt / max_batched_tokens), m micro-batches per chunk;
///   decode_round_s = (m + pp - 1) x max_s (decode_s(batch / m, prompt + output / 2) + send);
///   rps = batch / (prefill_s + output_tokens x decode_round_s),
/// each step being one pass of its m micro-batches through the pp stages (the
/// engine's schedule: m + pp - 1 ticks, the pipeline empty between steps),
/// and m the count in 1..min(pp, batch) that gives the most rps.
ReplicaEstimate estimate_replica(const ModelShape& m, const std::vector<ReplicaStage>& stages, const Workload& w,
                                 double kv_tokens);

}  // namespace ftp::plan
