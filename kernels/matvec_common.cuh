// SPDX-License-Identifier: Apache-2.0
// What the GEMV kernels of matvec.cu and matvec_quant*.cu share: the
// targets of one launch and how the grid's row groups map onto them
// (included by .cu files only).
#pragma once

#include <cstdint>

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
