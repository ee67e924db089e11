// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "weight_view.cuh"

namespace ftp::kernels {

/// Matrix-vector products for small batches (decode): out[u][i] = x[u] . W[i]
/// for u < t and i < w.rows, x[u] of w.cols floats (rows of x_ld floats),
/// out rows of out_ld floats, over a view of a weight tensor in any dtype
/// (F32, F16, BF16, Q8_0, and the block types Q4_0 .. Q6_K: see
/// matvec_quant_impl.cuh). Each weight is converted in registers and used
/// for up to 8 tokens; accumulation in float32. The block types take
/// views of whole blocks only (cudaErrorInvalidValue otherwise; there is no
/// scalar path for them) with x 16-byte aligned and x_ld a multiple of 4;
/// x is used as given: the caller quantizes it first where the CPU does
/// (quantize_act.cuh). Memory-bound: each lane
/// reads 16 contiguous bytes of a row per step (Q8_0: half a block with
/// 2-byte loads), consecutive lanes consecutive bytes, so that a warp reads
/// 512 contiguous bytes. Views whose rows are not aligned for those loads
/// (odd tensor-parallel splits of tiny models) take a scalar path.
/// t > 8 reads the weights once per 8 tokens: larger batches belong to
/// cuBLAS. Device pointers. Returns the launch status; does not synchronise.
///
/// How the grid covers the rows (MatvecConfig): each row group of
/// rows_per_warp rows is computed by warps_per_row warps (1, or 4: the
/// block's warps split the columns and add their sums in shared memory).
/// {0, 0} chooses by the batch and the row count; the others are for tuning
/// (gpu-bench --gemv-sweep) and give the same sums up to float rounding.
struct MatvecConfig {
  int rows_per_warp = 0;  // 1 or 2 with warps_per_row 1; 1, 2, 4, 8 with 4
  int warps_per_row = 0;
};

/// Whether `c` is one of the built configurations ({0, 0} always is);
/// matvec returns cudaErrorInvalidValue for the others. The block types
/// (Q4_0 .. Q6_K) build fewer: four warps per row group, 1, 2 or 4 rows.
bool matvec_config_built(MatvecConfig c);
bool matvec_config_built(MatvecConfig c, WeightDType d);

/// Activations quantized for the block types' integer dots
/// (quantize_activations_f32's quants and scales): row u's int8 quants at
/// q + u x q_ld, its blocks' scales at d + u x d_ld (blocks of 32 for
/// kind q8_0, 256 for q8_k), q 16-byte aligned, q_ld a multiple of 16.
struct Q8Acts {
  const std::int8_t* q = nullptr;
  const float* d = nullptr;
  int q_ld = 0, d_ld = 0;
  ActQuant kind = ActQuant::none;
};

/// Whether d has the integer-dot GEMV: every block type (Q4_0 .. Q6_K;
/// the legacy types with Q8_0 activations, the K-quants with Q8_K:
/// llama.cpp's vec_dot forms, dp4a on the device): a quarter of the float
/// path's activation bytes and a few integer operations per four weights
/// instead of a conversion each.
bool matvec_int_dots(WeightDType d);

cudaError_t matvec(const float* x, int x_ld, const WeightView& w, float* out, int out_ld, int t,
                   cudaStream_t stream, MatvecConfig config = {}, const Q8Acts* q8 = nullptr);

/// Most targets of one matvec_multi launch.
constexpr int kMaxMatvecTargets = 4;

/// One product of matvec_multi: out[u][i] = x[u] . w[i], rows of out_ld.
struct MatvecTarget {
  WeightView w;
  float* out = nullptr;
  int out_ld = 0;
};

/// Several products of the same activations x in one launch (the q, k and v
/// projections; gate and up): the targets' warps share one grid, so small
/// matrices (k, v of grouped-query attention) ride along with large ones
/// instead of leaving the device half idle, and one launch replaces three.
/// Every target needs the same cols; targets of one dtype whose views allow
/// vector loads share a launch, others take one launch each. At most
/// kMaxMatvecTargets. Results equal matvec's for each target.
///
/// q8 (optional): the same activations as int8 quants and scales (x being
/// their values q x d); targets whose type has integer dots
/// (matvec_int_dots) and whose activation kind is q8->kind read those
/// instead of x: the same products up to float rounding.
cudaError_t matvec_multi(const float* x, int x_ld, const MatvecTarget* targets, int n_targets, int t,
                         cudaStream_t stream, MatvecConfig config = {}, const Q8Acts* q8 = nullptr);

}  // namespace ftp::kernels
