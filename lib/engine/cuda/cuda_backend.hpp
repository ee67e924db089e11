// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/rank_backend.hpp"

/// The CUDA backend of the real engine (ARCHITECTURE.md, "Backend"): each
/// tensor-parallel rank runs on one CUDA device with its own stream, cuBLAS
/// handle, buffers and KV pages in device memory.
///
/// * Weights: uploaded once per device (plain cudaMalloc per tensor, never
///   trimmed) in their stored dtype: the resident layout. Every domain of
///   every gear on that device views the same copy (only the views change);
///   the copy lives while any rank of any domain uses it.
/// * KV pages: one allocation per rank ([layer][block][kv_head][slot][dim],
///   in the spec's KvDtype -- 16 bits by default -- as engine::KvStore); creation fails with a BackendError naming
///   the device when they do not fit in its free memory.
/// * matmul: kernels::matvec (weights converted in registers) up to
///   `gemv_max_rows` rows; cuBLAS beyond (F32 sgemm; F16/BF16 cublasGemmEx
///   with float32 compute after converting the activations; Q8_0 and the
///   block types Q4_0 .. Q6_K through dequantised BF16 tiles). The block
///   types take the activations quantized first as the CPU backend does
///   (kernels::quantize_activations_f32: Q8_0 values for the legacy types,
///   Q8_K for the K-quants), so their logits follow the CPU's (and
///   llama.cpp's) up to float rounding.
/// * all_reduce: NCCL (comm::NcclPool: a root communicator over the gear
///   table's GPUs only, split per device set and reused) when a stage's ranks are on
///   distinct GPUs; a same-GPU communicator (kernels::sum_buffers_f32, events
///   and a host barrier) when all its ranks share one GPU, so TP > 1 runs
///   on a single GPU. Mixed placements are rejected.
/// * Fusion (CudaBackendOptions::fuse): calls are deferred until the next
///   one shows whether they combine (see the option); results are the same.
/// * CUDA graphs: decode batches whose row count is in `graph_batches` are
///   captured on first use -- a domain's warm-up (engine::Domain::warm_up,
///   at warm_batch_sizes) makes that use before it serves -- and replayed
///   afterwards; graphs are dropped when a buffer grows (the warm-up's
///   first step sizes the activations and logits; a block table wider than
///   any before still grows). Stages of several ranks on one GPU run
///   eagerly (their all-reduce waits on a host barrier).
/// * Errors: every CUDA, cuBLAS and NCCL status is checked and thrown as
///   ftp::BackendError naming the call, the device and the rank; nothing
///   aborts the process.
namespace ftp::engine {

struct CudaBackendOptions {
  /// Decode batch sizes (rows) run as CUDA graphs. Default 1..32; from
  /// FTP_CUDA_GRAPHS ("off", "1-32", "1,2,4,8") when set.
  std::vector<int> graph_batches;
  /// Largest row count that takes the GEMV kernels (0: cuBLAS always);
  /// FTP_GEMV_MAX_ROWS (a number, or auto). -1 (auto): by weight type, 2
  /// for F16/BF16 (cuBLAS reads them as they are and was faster from 3
  /// rows on an H200: tests/gpu/README.md), 8 for F32, Q8_0 and the block
  /// types (those would go through dequantised tiles).
  int gemv_max_rows = -1;
  /// The GEMV kernels' rows per row group and warps per group
  /// (kernels::MatvecConfig; 0, 0: chosen by batch and rows);
  /// FTP_GEMV_CONFIG=ROWSxWARPS (e.g. 8x4) or auto.
  int gemv_rows_per_warp = 0;
  int gemv_warps_per_row = 0;
  /// Fewer launches with the same arithmetic: consecutive GEMV products of
  /// one input in one launch (q, k, v; gate, up), a residual add with the
  /// RMSNorm that reads its sum, the RoPE of q and k with the KV write.
  /// FTP_CUDA_FUSE=0 turns it off (for A/B runs).
  bool fuse = true;
  /// The GEMV of the block types (Q4_0 .. Q6_K) with integer dots over the
  /// activations' int8 quants (kernels::matvec_int_dots: llama.cpp's
  /// vec_dot forms) instead of float dots over their values; the same
  /// products up to float rounding. FTP_CUDA_INT8_DOTS=0 turns it off (for
  /// A/B runs).
  bool int8_dots = true;
  /// Programmatic dependent launch of the decode kernels on GPUs of compute
  /// capability 9.0 and later (kernels/launch.cuh): each kernel may start
  /// while the one before it finishes, and waits at its top for its
  /// results. Process-wide (the last backend made sets it). FTP_CUDA_PDL=0
  /// turns it off (for A/B runs).
  bool programmatic_launch = true;
  /// CUDA events around each step's parts on the rank that downloads the
  /// result, summed into cuda_step_timing(): where a step's time goes, for
  /// benchmarks. FTP_CUDA_STEP_TIMING=1.
  bool step_timing = false;
  /// Options from the environment (the defaults above where unset).
  static CudaBackendOptions from_env();
};

// cuda_backend() (engine/rank_backend.hpp): the process's CUDA backend,
// options from the environment; ftp::BackendError when no GPU is visible.

/// A CUDA backend with these options (tests compare settings side by side).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);

/// CUDA graphs made by the ranks of this process so far, and captures that
/// failed (that rank then runs eagerly): for tests and benchmarks.
struct CudaGraphStats {
  std::uint64_t captures = 0;
  std::uint64_t failures = 0;
};
CudaGraphStats cuda_graph_stats() noexcept;

/// Device time of the steps timed so far (CudaBackendOptions::step_timing),
/// summed over steps: embedding and layers; the head (final norm,
/// classifier, anything between the layers and the download); the copy to
/// the host. The rest of a step's wall time is host work and waiting.
struct CudaStepTiming {
  std::uint64_t steps = 0;
  double layers_ms = 0;
  double head_ms = 0;
  double download_ms = 0;
};
CudaStepTiming cuda_step_timing();

/// True when this build has the CUDA backend.
bool cuda_backend_built() noexcept;

/// Milliseconds the NCCL pool took to create its root communicator (0
/// before first use or without NCCL devices).
double cuda_nccl_pool_create_ms();

}  // namespace ftp::engine
