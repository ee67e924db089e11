// SPDX-License-Identifier: Apache-2.0
// The GEMV of the block types (Q4_0 .. Q6_K), a template instantiated per
// type by matvec_q*.cu (several files: the types compile in parallel).
//
// Each lane takes one chunk of 32 weights of a block per step
// (quant_blocks.cuh: consecutive lanes, consecutive chunks, so a warp
// reads consecutive bytes: Q4_K and Q5_K in 16-byte loads, the others in
// the 2-, 4- or 8-byte words their block sizes allow), for the R rows of
// its row group, and for each run of the chunk (weights under one scale)
// sums q x x over the run for each token, then adds d x that sum (+ m x the
// sum of x for types with a min): the quants are exact small integers,
// the scales ggml's, so the products differ from the CPU's only by float
// rounding of the sums. The activations are float (the CUDA backend passes
// them quantized as the CPU backend quantizes them: quantize_act.cuh), read
// in float4 loads shared by the R rows. Row groups and warps per group as
// matvec.cu's kernel (MatvecConfig), the sums of one group's warps added in
// shared memory in warp order.
//
// Every type also has an integer path (qb::chunk_int, taken when the caller
// passes the activations' int8 quants): each run's quants dotted with its
// activation quants in dp4a (qb::IntDot, checked on the CPU against
// run()'s quants), scaled by the run's d (plus m x the sum of the
// activation quants) and the activation block's scale: llama.cpp's vec_dot
// forms, the CPU backend's integer kernels up to float rounding. Per four
// weights a few integer operations and one dp4a, where the float path
// converts each weight; and a quarter of the activation bytes.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "matvec_common.cuh"
#include "quant_dispatch.cuh"

namespace ftp::kernels::detail {

/// A row group of R rows x up to T tokens over S warps (matvec.cu's
/// scheme); Int: the integer path (activations from a), else the float
/// one (from x).
template <qb::QType Q, int R, int T, int S, bool Int>
__global__ void __launch_bounds__(kMatvecWarps * 32)
    matvec_quant_kernel(const float* __restrict__ x, int x_ld, Q8Acts a, MatvecTargets ts, int t) {
  pdl_begin();
  using B = qb::Block<Q>;
  const RowGroup grp = row_group<R, T, S>(ts, t);
  if constexpr (S == 1) {
    if (!grp.live) return;
  }
  const WeightView& w = grp.w;
  const std::uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = block_row<Q>(w, grp.row0 + r < w.rows ? grp.row0 + r : grp.row0);
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int u = 0; u < T; ++u) acc[r][u] = 0.0f;
  const std::int64_t n_chunks = grp.live ? w.cols / B::kElems * B::kChunks : 0;
#pragma unroll 1
  for (std::int64_t g = grp.sub * 32 + grp.lane; g < n_chunks; g += S * 32) {
    const std::int64_t blk = g / B::kChunks;
    const int c = static_cast<int>(g % B::kChunks);
    typename B::Raw raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = B::load(rows[r] + blk * B::kBytes, c);
    const std::int64_t e = blk * B::kElems + B::start(c);  // the chunk's first activation
    if constexpr (Int) {
      const auto* xq0 = reinterpret_cast<const std::uint8_t*>(a.q) + static_cast<std::int64_t>(grp.u0) * a.q_ld + e;
      qb::chunk_int<Q, R, T>(raw, c, xq0, a.q_ld, a.d + static_cast<std::int64_t>(grp.u0) * a.d_ld + blk, a.d_ld, grp.nt,
                             acc);
    } else {
      qb::chunk_float<Q, R, T>(raw, c, x + static_cast<std::int64_t>(grp.u0) * x_ld + e, x_ld, grp.nt, acc);
    }
  }
  store_group_sums<R, T, S>(acc, grp.live, grp.nt, grp.row0, w.rows, ts.t[grp.j].out, ts.t[grp.j].out_ld, grp.u0);
}

template <qb::QType Q, int R, int T>
void launch_quant(const float* x, int x_ld, const Q8Acts* q8, const MatvecTarget* targets, int n, int t,
                  cudaStream_t stream) {
  const MatvecTargets ts = make_targets(targets, n, R);
  const std::int64_t groups = ts.first_warp[n];
  // One row group per block: the block's four warps split the columns.
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>((t + T - 1) / T));
  if (q8) {
    launch(matvec_quant_kernel<Q, R, T, kMatvecWarps, true>, grid, kMatvecWarps * 32, 0, stream, x, x_ld, *q8, ts, t);
    return;
  }
  launch(matvec_quant_kernel<Q, R, T, kMatvecWarps, false>, grid, kMatvecWarps * 32, 0, stream, x, x_ld, Q8Acts{}, ts, t);
}

template <qb::QType Q, int T>
bool launch_quant_rows(const float* x, int x_ld, const Q8Acts* q8, const MatvecTarget* targets, int n, int t, int R,
                       cudaStream_t stream) {
  switch (R) {
    case 1: return launch_quant<Q, 1, T>(x, x_ld, q8, targets, n, t, stream), true;
    case 2: return launch_quant<Q, 2, T>(x, x_ld, q8, targets, n, t, stream), true;
    case 4: return launch_quant<Q, 4, T>(x, x_ld, q8, targets, n, t, stream), true;
    default: return false;
  }
}

/// Tokens of one pass over the weights for t tokens: 1, 4 or 8 (fewer
/// instantiations than the float types' 1, 2, 4, 8).
constexpr int quant_tokens_per_pass(int t) { return t == 1 ? 1 : t <= 4 ? 4 : 8; }

template <qb::QType Q>
bool matvec_quant(const float* x, int x_ld, const Q8Acts* q8, const MatvecTarget* targets, int n, int t, MatvecConfig c,
                  int sms, cudaStream_t stream) {
  if (!matvec_quant_config_built(c)) return false;
  int R = c.rows_per_warp;
  if (R == 0) {
    // Automatic: four rows per group, fewer where the matrices would leave
    // under two groups per multiprocessor (not measured yet: the first
    // device run's gpu-bench --gemv-sweep --dtype q4_k_m decides).
    R = 4;
    std::int64_t rows = 0;
    for (int j = 0; j < n; ++j) rows += targets[j].w.rows;
    while (R > 1 && rows / R < 2 * static_cast<std::int64_t>(sms)) R /= 2;
  }
  switch (quant_tokens_per_pass(t)) {
    case 1: return launch_quant_rows<Q, 1>(x, x_ld, q8, targets, n, t, R, stream);
    case 4: return launch_quant_rows<Q, 4>(x, x_ld, q8, targets, n, t, R, stream);
    default: return launch_quant_rows<Q, 8>(x, x_ld, q8, targets, n, t, R, stream);
  }
}

}  // namespace ftp::kernels::detail
