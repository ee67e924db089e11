// SPDX-License-Identifier: Apache-2.0
#include <cstdint>

#include "common.cuh"
#include "matvec.cuh"
#include "matvec_common.cuh"
#include "quant_dispatch.cuh"

namespace ftp::kernels {
namespace {

using detail::MatvecTargets;
using detail::target_of;
constexpr int kWarps = detail::kMatvecWarps;
constexpr int kMaxT = 8;   // tokens per pass over the weights

/// Elements a lane converts per step: 16 bytes of F32/F16/BF16, half a Q8_0 block.
template <WeightDType D>
constexpr int lane_elems() {
  return D == WeightDType::f32 ? 4 : D == WeightDType::q8_0 ? 16 : 8;
}

/// Loads the E weights of row `row` (a pointer to the tensor element at the
/// view's first column of that row) at view column k, converted to float.
template <WeightDType D>
__device__ __forceinline__ void load_chunk(const void* row, std::int64_t k, float* wf) {
  if constexpr (D == WeightDType::f32) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(row) + k));
    wf[0] = v.x, wf[1] = v.y, wf[2] = v.z, wf[3] = v.w;
  } else if constexpr (D == WeightDType::f16 || D == WeightDType::bf16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(row) + k));
    const std::uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (D == WeightDType::bf16) {
        wf[2 * i] = __uint_as_float(u[i] << 16);
        wf[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
      } else {
        // Through the bit patterns, not a type-punned pointer.
        wf[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] & 0xffffu)));
        wf[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] >> 16)));
      }
    }
  } else {
    // k is a multiple of 16: block k / 32, half (k / 16) & 1.
    const auto* blk = static_cast<const std::uint8_t*>(row) + (k >> 5) * 34;
    const auto* h = reinterpret_cast<const std::uint16_t*>(blk);  // blocks are 2-byte aligned
    const float d = detail::f16_bits_to_f32(__ldg(h));
    const std::uint16_t* q = h + 1 + ((k >> 4) & 1) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::uint16_t p = __ldg(q + i);
      wf[2 * i] = d * static_cast<float>(static_cast<std::int8_t>(p & 0xff));
      wf[2 * i + 1] = d * static_cast<float>(static_cast<std::int8_t>(p >> 8));
    }
  }
}

/// Address of the view's first element of row i (tensor element (r0 + i) x ld + c0).
template <WeightDType D>
__device__ __forceinline__ const void* row_base(const WeightView& w, std::int64_t i) {
  const std::int64_t e = (w.r0 + i) * w.ld + w.c0;
  if constexpr (D == WeightDType::f32) return static_cast<const float*>(w.data) + e;
  else if constexpr (D == WeightDType::q8_0) return static_cast<const std::uint8_t*>(w.data) + (e >> 5) * 34;
  else return static_cast<const std::uint16_t*>(w.data) + e;
}

/// One row group: R rows x up to T tokens (nt of them), whole rows, of the
/// target its index falls in, computed by S warps (S = 1: one warp per
/// group, kWarps groups per block; S = kWarps: the block's warps split the
/// columns, interleaved by 32 x E, and their sums meet in shared memory in
/// warp order). More rows per group reuse each activation load R times
/// (what batches of 4-8 tokens need: their activation loads outnumber the
/// weight loads); more warps per group keep enough loads in flight when R
/// leaves few groups.
template <WeightDType D, int R, int T, int S>
__global__ void __launch_bounds__(kWarps * 32) matvec_kernel(const float* __restrict__ x, int x_ld, MatvecTargets ts, int t) {
  detail::pdl_begin();
  constexpr int E = lane_elems<D>();
  const detail::RowGroup grp = detail::row_group<R, T, S>(ts, t);
  if constexpr (S == 1) {
    if (!grp.live) return;
  }
  const int lane = grp.lane, sub = grp.sub, u0 = grp.u0, nt = grp.nt;  // sub: this warp's share of the columns
  const bool live = grp.live;
  const std::int64_t row0 = grp.row0;
  const WeightView& w = grp.w;
  const void* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = row_base<D>(w, row0 + r < w.rows ? row0 + r : row0);
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int u = 0; u < T; ++u) acc[r][u] = 0.0f;
  const float* xb = x + static_cast<std::int64_t>(u0) * x_ld;
  const std::int64_t k_end = live ? w.cols : 0;
#pragma unroll 2
  for (std::int64_t k = static_cast<std::int64_t>(sub * 32 + lane) * E; k < k_end; k += S * 32 * E) {
    float wf[R][E];
#pragma unroll
    for (int r = 0; r < R; ++r) load_chunk<D>(rows[r], k, wf[r]);
#pragma unroll
    for (int u = 0; u < T; ++u) {
      if (u < nt) {
        const float4* xp = reinterpret_cast<const float4*>(xb + static_cast<std::int64_t>(u) * x_ld + k);
#pragma unroll
        for (int q = 0; q < E / 4; ++q) {
          const float4 xv = __ldg(xp + q);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            acc[r][u] = fmaf(wf[r][4 * q], xv.x, acc[r][u]);
            acc[r][u] = fmaf(wf[r][4 * q + 1], xv.y, acc[r][u]);
            acc[r][u] = fmaf(wf[r][4 * q + 2], xv.z, acc[r][u]);
            acc[r][u] = fmaf(wf[r][4 * q + 3], xv.w, acc[r][u]);
          }
        }
      }
    }
  }
  detail::store_group_sums<R, T, S>(acc, live, nt, row0, w.rows, ts.t[grp.j].out, ts.t[grp.j].out_ld, u0);
}

/// Any alignment, any dtype: one warp per row, lanes over single elements.
__global__ void __launch_bounds__(kWarps * 32) matvec_scalar_kernel(const float* __restrict__ x, int x_ld, WeightView w,
                                                                     float* __restrict__ out, int out_ld, int t) {
  detail::pdl_begin();
  const int lane = threadIdx.x & 31;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= w.rows) return;
  const int u0 = blockIdx.y * kMaxT;
  const int nt = min(kMaxT, t - u0);
  const std::int64_t first = (w.r0 + row) * w.ld + w.c0;
  float acc[kMaxT] = {};
  for (std::int64_t k = lane; k < w.cols; k += 32) {
    const float wv = detail::load_weight(w.data, w.dtype, first + k);
#pragma unroll
    for (int u = 0; u < kMaxT; ++u)
      if (u < nt) acc[u] = fmaf(wv, x[static_cast<std::int64_t>(u0 + u) * x_ld + k], acc[u]);
  }
#pragma unroll
  for (int u = 0; u < kMaxT; ++u) {
    const float s = detail::warp_sum(acc[u]);
    if (lane == 0 && u < nt) out[static_cast<std::int64_t>(u0 + u) * out_ld + row] = s;
  }
}

template <WeightDType D>
bool vector_path_ok(const float* x, int x_ld, const WeightView& w) {
  constexpr int E = lane_elems<D>();
  const int unit = D == WeightDType::q8_0 ? 32 : E;  // Q8_0: whole blocks
  const bool x_ok = (reinterpret_cast<std::uintptr_t>(x) & 15) == 0 && x_ld % 4 == 0;
  const bool w_ok = D == WeightDType::q8_0 ? (reinterpret_cast<std::uintptr_t>(w.data) & 1) == 0
                                           : (reinterpret_cast<std::uintptr_t>(w.data) & 15) == 0;
  return x_ok && w_ok && w.ld % unit == 0 && w.c0 % unit == 0 && w.cols % unit == 0;
}

template <WeightDType D, int R, int T, int S>
void launch(const float* x, int x_ld, const MatvecTarget* targets, int n, int t, cudaStream_t stream) {
  const MatvecTargets ts = detail::make_targets(targets, n, R);
  const std::int64_t groups = ts.first_warp[n];
  constexpr int G = kWarps / S;
  const dim3 grid(static_cast<unsigned>((groups + G - 1) / G), static_cast<unsigned>((t + T - 1) / T));
  detail::launch(matvec_kernel<D, R, T, S>, grid, kWarps * 32, 0, stream, x, x_ld, ts, t);
}

/// The tokens of one pass over the weights for t tokens: 1, 2, 4 or 8.
constexpr int tokens_per_pass(int t) { return t == 1 ? 1 : t == 2 ? 2 : t <= 4 ? 4 : 8; }

/// Runs configuration (R, S) with the pass width of t; false where that
/// configuration is not built.
template <WeightDType D, int T>
bool launch_config(const float* x, int x_ld, const MatvecTarget* targets, int n, int t, int R, int S,
                   cudaStream_t stream) {
  if (S == 1 && R == 1) return launch<D, 1, T, 1>(x, x_ld, targets, n, t, stream), true;
  if (S == 1 && R == 2) return launch<D, 2, T, 1>(x, x_ld, targets, n, t, stream), true;
  if (S == kWarps && R == 1) return launch<D, 1, T, kWarps>(x, x_ld, targets, n, t, stream), true;
  if (S == kWarps && R == 2) return launch<D, 2, T, kWarps>(x, x_ld, targets, n, t, stream), true;
  if (S == kWarps && R == 4) return launch<D, 4, T, kWarps>(x, x_ld, targets, n, t, stream), true;
  if (S == kWarps && R == 8) return launch<D, 8, T, kWarps>(x, x_ld, targets, n, t, stream), true;
  return false;
}

template <WeightDType D>
bool dispatch(const float* x, int x_ld, const MatvecTarget* targets, int n, int t, MatvecConfig c, int sms,
              cudaStream_t stream) {
  if (c.rows_per_warp == 0 || c.warps_per_row == 0) {
    // Automatic, from gpu-bench --gemv-sweep on an H200 (Llama-3-8B layer
    // shapes, BF16; tests/gpu/README.md): the block's four warps over each
    // row group, four rows per group at batch 1 (0.96 of the triad against
    // 0.88 for a warp per row), eight at batch 2 (0.88 against 0.67), four
    // above (activation loads grow with the batch; cuBLAS takes over from 3
    // tokens in the engine where the weights are 16-bit). Q8_0 keeps four at
    // batch 2 (eight rows of it take 255 registers a thread: two blocks per
    // multiprocessor). Fewer rows per group where the matrices (a
    // tensor-parallel shard) would leave under two groups per
    // multiprocessor. Only the BF16 choice was measured.
    int rows_per_group = t == 2 && D != WeightDType::q8_0 ? 8 : 4;
    std::int64_t rows = 0;
    for (int j = 0; j < n; ++j) rows += targets[j].w.rows;
    while (rows_per_group > 1 && rows / rows_per_group < 2 * static_cast<std::int64_t>(sms)) rows_per_group /= 2;
    c = MatvecConfig{rows_per_group, kWarps};
  }
  switch (tokens_per_pass(t)) {
    case 1: return launch_config<D, 1>(x, x_ld, targets, n, t, c.rows_per_warp, c.warps_per_row, stream);
    case 2: return launch_config<D, 2>(x, x_ld, targets, n, t, c.rows_per_warp, c.warps_per_row, stream);
    case 4: return launch_config<D, 4>(x, x_ld, targets, n, t, c.rows_per_warp, c.warps_per_row, stream);
    default: return launch_config<D, 8>(x, x_ld, targets, n, t, c.rows_per_warp, c.warps_per_row, stream);
  }
}

bool vector_ok(const float* x, int x_ld, const WeightView& w) {
  switch (w.dtype) {
    case WeightDType::f32: return vector_path_ok<WeightDType::f32>(x, x_ld, w);
    case WeightDType::f16: return vector_path_ok<WeightDType::f16>(x, x_ld, w);
    case WeightDType::bf16: return vector_path_ok<WeightDType::bf16>(x, x_ld, w);
    case WeightDType::q8_0: return vector_path_ok<WeightDType::q8_0>(x, x_ld, w);
    default:  // the block types: whole blocks, 16-byte aligned, float4 activations
      return (reinterpret_cast<std::uintptr_t>(x) & 15) == 0 && x_ld % 4 == 0 && detail::whole_blocks(w);
  }
}

}  // namespace

namespace detail {
bool matvec_quant_config_built(MatvecConfig c) {
  if (c.rows_per_warp == 0 && c.warps_per_row == 0) return true;
  return c.warps_per_row == kWarps && (c.rows_per_warp == 1 || c.rows_per_warp == 2 || c.rows_per_warp == 4);
}
}  // namespace detail

bool matvec_int_dots(WeightDType d) { return is_block_quant(d); }

bool matvec_config_built(MatvecConfig c, WeightDType d) {
  return is_block_quant(d) ? detail::matvec_quant_config_built(c) : matvec_config_built(c);
}

bool matvec_config_built(MatvecConfig c) {
  if (c.rows_per_warp == 0 && c.warps_per_row == 0) return true;
  if (c.warps_per_row == 1) return c.rows_per_warp == 1 || c.rows_per_warp == 2;
  return c.warps_per_row == kWarps && (c.rows_per_warp == 1 || c.rows_per_warp == 2 || c.rows_per_warp == 4 ||
                                       c.rows_per_warp == 8);
}

cudaError_t matvec_multi(const float* x, int x_ld, const MatvecTarget* targets, int n_targets, int t,
                         cudaStream_t stream, MatvecConfig config, const Q8Acts* q8) {
  if (n_targets < 1 || n_targets > kMaxMatvecTargets) return cudaErrorInvalidValue;
  for (int j = 0; j < n_targets; ++j)
    if (!matvec_config_built(config, targets[j].w.dtype)) return cudaErrorInvalidValue;
  if (t <= 0) return cudaSuccess;
  const std::int64_t cols = targets[0].w.cols;
  bool together = true;
  for (int j = 0; j < n_targets; ++j) {
    const WeightView& w = targets[j].w;
    if (w.cols != cols || w.rows < 0) return cudaErrorInvalidValue;
    together = together && w.rows > 0 && w.dtype == targets[0].w.dtype && vector_ok(x, x_ld, w);
  }
  if (cols <= 0) return cudaErrorInvalidValue;
  if (!together) {
    // Scalar path (or mixed dtypes): one launch per target.
    for (int j = 0; j < n_targets; ++j) {
      const WeightView& w = targets[j].w;
      if (w.rows == 0) continue;
      if (n_targets > 1) {
        if (cudaError_t e = matvec_multi(x, x_ld, &targets[j], 1, t, stream, config, q8); e != cudaSuccess) return e;
        continue;
      }
      // The block types have no scalar path: views of whole blocks only.
      if (is_block_quant(w.dtype)) return cudaErrorInvalidValue;
      const dim3 grid(static_cast<unsigned>((w.rows + kWarps - 1) / kWarps), static_cast<unsigned>((t + kMaxT - 1) / kMaxT));
      detail::launch(matvec_scalar_kernel, grid, kWarps * 32, 0, stream, x, x_ld, w, targets[j].out, targets[j].out_ld, t);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  int sms = 0;
  if (cudaError_t e = detail::sm_count(&sms); e != cudaSuccess) return e;
  bool built = false;
  switch (targets[0].w.dtype) {
    case WeightDType::f32: built = dispatch<WeightDType::f32>(x, x_ld, targets, n_targets, t, config, sms, stream); break;
    case WeightDType::f16: built = dispatch<WeightDType::f16>(x, x_ld, targets, n_targets, t, config, sms, stream); break;
    case WeightDType::bf16: built = dispatch<WeightDType::bf16>(x, x_ld, targets, n_targets, t, config, sms, stream); break;
    case WeightDType::q8_0: built = dispatch<WeightDType::q8_0>(x, x_ld, targets, n_targets, t, config, sms, stream); break;
    default: {
      // The integer path where the type has it and q8 holds its activations.
      const WeightDType dt = targets[0].w.dtype;
      const bool int_ok = q8 && q8->q && q8->d && q8->kind == act_quant_of(dt) && matvec_int_dots(dt) &&
                          (reinterpret_cast<std::uintptr_t>(q8->q) & 15) == 0 && q8->q_ld % 16 == 0;
      detail::visit_block_quant(dt, [&](auto q) {
        built = detail::matvec_quant<decltype(q)::value>(x, x_ld, int_ok ? q8 : nullptr, targets, n_targets, t, config,
                                                         sms, stream);
      });
    }
  }
  if (!built) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t matvec(const float* x, int x_ld, const WeightView& w, float* out, int out_ld, int t,
                   cudaStream_t stream, MatvecConfig config, const Q8Acts* q8) {
  if (t <= 0 || w.rows <= 0) return cudaSuccess;
  const MatvecTarget target{w, out, out_ld};
  return matvec_multi(x, x_ld, &target, 1, t, stream, config, q8);
}

}  // namespace ftp::kernels
