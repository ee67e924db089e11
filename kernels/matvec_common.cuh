// SPDX-License-Identifier: Apache-2.0
// What the GEMV kernels of matvec.cu and matvec_quant*.cu share: the
// targets of one launch and how the grid's row groups map onto them
// (included by .cu files only).
#pragma once

#include <cstdint>

#include "common.cuh"
#include "matvec.cuh"
#include "quant_blocks.cuh"

namespace ftp::kernels::detail {

constexpr int kMatvecWarps = 4;  // warps per block

/// The targets of one launch: row groups [first_warp[j], first_warp[j + 1])
/// of the grid compute target j.
struct MatvecTargets {
  MatvecTarget t[kMaxMatvecTargets];
  std::int64_t first_warp[kMaxMatvecTargets + 1];
  int n;
};

/// The targets with groups of R rows each.
inline MatvecTargets make_targets(const MatvecTarget* targets, int n, int R) {
  MatvecTargets ts{};
  ts.n = n;
  for (int j = 0; j < n; ++j) {
    ts.t[j] = targets[j];
    ts.first_warp[j + 1] = ts.first_warp[j] + (targets[j].w.rows + R - 1) / R;
  }
  return ts;
}

/// Target of row group g (every group below first_warp[n] has one).
__device__ __forceinline__ int target_of(const MatvecTargets& ts, std::int64_t g) {
  int j = 0;
  while (j + 1 < ts.n && g >= ts.first_warp[j + 1]) ++j;
  return j;
}

/// This thread's row group: of R rows (from row0 of target j's view w) x
/// up to T tokens (nt of them from u0), computed by S warps (1, or all
/// kMatvecWarps of the block: sub is this warp's share of the columns);
/// live false for the groups past the last (a block's spare warps).
struct RowGroup {
  int lane, sub, j, u0, nt;
  bool live;
  std::int64_t row0;
  WeightView w;
};
template <int R, int T, int S>
__device__ __forceinline__ RowGroup row_group(const MatvecTargets& ts, int t) {
  static_assert(S == 1 || S == kMatvecWarps, "a row group is one warp or the whole block");
  constexpr int G = kMatvecWarps / S;  // row groups per block
  RowGroup g;
  const int warp = threadIdx.x >> 5;
  g.lane = threadIdx.x & 31;
  g.sub = warp % S;
  const std::int64_t gw = static_cast<std::int64_t>(blockIdx.x) * G + warp / S;
  g.live = gw < ts.first_warp[ts.n];
  g.j = g.live ? target_of(ts, gw) : 0;
  g.w = ts.t[g.j].w;
  g.row0 = g.live ? (gw - ts.first_warp[g.j]) * R : 0;
  g.u0 = blockIdx.y * T;
  g.nt = min(T, t - g.u0);
  return g;
}

/// The sums of a row group of R rows x T tokens: each lane's acc summed
/// over the group's S warps (S = 1: the warp; S = kMatvecWarps: the
/// block's warps, in warp order, through shared memory) into
/// out[(u0 + u) x out_ld + row0 + r] for u < nt and row0 + r < rows;
/// nothing stored where !live (S = kMatvecWarps: every thread must call).
template <int R, int T, int S>
__device__ __forceinline__ void store_group_sums(float (&acc)[R][T], bool live, int nt, std::int64_t row0,
                                                 std::int64_t rows, float* __restrict__ out, int out_ld, int u0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if constexpr (S == 1) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < T; ++u) {
        const float s = warp_sum(acc[r][u]);
        if (live && lane == 0 && u < nt && row0 + r < rows) out[static_cast<std::int64_t>(u0 + u) * out_ld + row0 + r] = s;
      }
  } else {
    static_assert(S == kMatvecWarps, "a row group is one warp or the whole block");
    __shared__ float part[kMatvecWarps][R * T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < T; ++u) {
        const float s = warp_sum(acc[r][u]);
        if (lane == 0) part[warp][r * T + u] = s;
      }
    __syncthreads();
    for (int i = threadIdx.x; i < R * T; i += kMatvecWarps * 32) {
      const int r = i / T, u = i % T;
      float s = part[0][i];
#pragma unroll
      for (int v = 1; v < kMatvecWarps; ++v) s += part[v][i];
      if (live && u < nt && row0 + r < rows) out[static_cast<std::int64_t>(u0 + u) * out_ld + row0 + r] = s;
    }
  }
}

/// Block types (matvec_quant*.cu): whether configuration c is built, and
/// the launch for targets of block type Q (all of it, views of whole
/// blocks, x 16-byte aligned with x_ld a multiple of 4); false where c is
/// not built for them.
bool matvec_quant_config_built(MatvecConfig c);
/// q8 non-null (and Q with integer dots, qb::IntDot): the integer path.
template <qb::QType Q>
bool matvec_quant(const float* x, int x_ld, const Q8Acts* q8, const MatvecTarget* targets, int n, int t, MatvecConfig c,
                  int sms, cudaStream_t stream);

}  // namespace ftp::kernels::detail
