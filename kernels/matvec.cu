// SPDX-License-Identifier: Apache-2.0
#include <cstdint>

#include "common.cuh"
#include "matvec.cuh"

namespace ftp::kernels {
namespace {

constexpr int kWarps = 4;  // warps per block
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

/// The targets of one launch: warps [first_warp[j], first_warp[j + 1]) of
/// the grid compute target j.
struct Targets {
  MatvecTarget t[kMaxMatvecTargets];
  std::int64_t first_warp[kMaxMatvecTargets + 1];
  int n;
};

/// One warp: R rows x up to T tokens (nt of them), whole rows, of the
/// target its index falls in.
template <WeightDType D, int R, int T>
__global__ void __launch_bounds__(kWarps * 32) matvec_kernel(const float* __restrict__ x, int x_ld, Targets ts, int t) {
  constexpr int E = lane_elems<D>();
  const int lane = threadIdx.x & 31;
  const std::int64_t gw = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  int j = 0;
  while (j + 1 < ts.n && gw >= ts.first_warp[j + 1]) ++j;
  if (gw >= ts.first_warp[ts.n]) return;
  const WeightView w = ts.t[j].w;
  float* __restrict__ out = ts.t[j].out;
  const int out_ld = ts.t[j].out_ld;
  const std::int64_t row0 = (gw - ts.first_warp[j]) * R;
  if (row0 >= w.rows) return;
  const int u0 = blockIdx.y * T;
  const int nt = min(T, t - u0);
  const void* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = row_base<D>(w, row0 + r < w.rows ? row0 + r : row0);
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int u = 0; u < T; ++u) acc[r][u] = 0.0f;
  const float* xb = x + static_cast<std::int64_t>(u0) * x_ld;
#pragma unroll 2
  for (std::int64_t k = static_cast<std::int64_t>(lane) * E; k < w.cols; k += 32 * E) {
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
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int u = 0; u < T; ++u) {
      const float s = detail::warp_sum(acc[r][u]);
      if (lane == 0 && u < nt && row0 + r < w.rows) out[static_cast<std::int64_t>(u0 + u) * out_ld + row0 + r] = s;
    }
}

/// Any alignment, any dtype: one warp per row, lanes over single elements.
__global__ void __launch_bounds__(kWarps * 32) matvec_scalar_kernel(const float* __restrict__ x, int x_ld, WeightView w,
                                                                     float* __restrict__ out, int out_ld, int t) {
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

template <WeightDType D, int R, int T>
void launch(const float* x, int x_ld, const MatvecTarget* targets, int n, int t, cudaStream_t stream) {
  Targets ts{};
  ts.n = n;
  for (int j = 0; j < n; ++j) {
    ts.t[j] = targets[j];
    ts.first_warp[j + 1] = ts.first_warp[j] + (targets[j].w.rows + R - 1) / R;
  }
  const std::int64_t warps = ts.first_warp[n];
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps), static_cast<unsigned>((t + T - 1) / T));
  matvec_kernel<D, R, T><<<grid, kWarps * 32, 0, stream>>>(x, x_ld, ts, t);
}

template <WeightDType D>
void dispatch(const float* x, int x_ld, const MatvecTarget* targets, int n, int t, int sms, cudaStream_t stream) {
  // Two rows per warp reuse each activation load twice; only where that
  // still leaves >= 16 warps per multiprocessor to keep loads in flight.
  std::int64_t rows = 0;
  for (int j = 0; j < n; ++j) rows += targets[j].w.rows;
  const bool two = t >= 2 && rows / 2 >= static_cast<std::int64_t>(sms) * 16;
  if (t == 1) return launch<D, 1, 1>(x, x_ld, targets, n, t, stream);
  if (t == 2) return two ? launch<D, 2, 2>(x, x_ld, targets, n, t, stream) : launch<D, 1, 2>(x, x_ld, targets, n, t, stream);
  if (t <= 4) return two ? launch<D, 2, 4>(x, x_ld, targets, n, t, stream) : launch<D, 1, 4>(x, x_ld, targets, n, t, stream);
  return two ? launch<D, 2, 8>(x, x_ld, targets, n, t, stream) : launch<D, 1, 8>(x, x_ld, targets, n, t, stream);
}

bool vector_ok(const float* x, int x_ld, const WeightView& w) {
  switch (w.dtype) {
    case WeightDType::f32: return vector_path_ok<WeightDType::f32>(x, x_ld, w);
    case WeightDType::f16: return vector_path_ok<WeightDType::f16>(x, x_ld, w);
    case WeightDType::bf16: return vector_path_ok<WeightDType::bf16>(x, x_ld, w);
    case WeightDType::q8_0: return vector_path_ok<WeightDType::q8_0>(x, x_ld, w);
  }
  return false;
}

}  // namespace

cudaError_t matvec_multi(const float* x, int x_ld, const MatvecTarget* targets, int n_targets, int t,
                         cudaStream_t stream) {
  if (n_targets < 1 || n_targets > kMaxMatvecTargets) return cudaErrorInvalidValue;
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
        if (cudaError_t e = matvec_multi(x, x_ld, &targets[j], 1, t, stream); e != cudaSuccess) return e;
        continue;
      }
      const dim3 grid(static_cast<unsigned>((w.rows + kWarps - 1) / kWarps), static_cast<unsigned>((t + kMaxT - 1) / kMaxT));
      matvec_scalar_kernel<<<grid, kWarps * 32, 0, stream>>>(x, x_ld, w, targets[j].out, targets[j].out_ld, t);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  int sms = 0;
  if (cudaError_t e = detail::sm_count(&sms); e != cudaSuccess) return e;
  switch (targets[0].w.dtype) {
    case WeightDType::f32: dispatch<WeightDType::f32>(x, x_ld, targets, n_targets, t, sms, stream); break;
    case WeightDType::f16: dispatch<WeightDType::f16>(x, x_ld, targets, n_targets, t, sms, stream); break;
    case WeightDType::bf16: dispatch<WeightDType::bf16>(x, x_ld, targets, n_targets, t, sms, stream); break;
    case WeightDType::q8_0: dispatch<WeightDType::q8_0>(x, x_ld, targets, n_targets, t, sms, stream); break;
  }
  return cudaGetLastError();
}

cudaError_t matvec(const float* x, int x_ld, const WeightView& w, float* out, int out_ld, int t,
                   cudaStream_t stream) {
  if (t <= 0 || w.rows <= 0) return cudaSuccess;
  const MatvecTarget target{w, out, out_ld};
  return matvec_multi(x, x_ld, &target, 1, t, stream);
}

}  // namespace ftp::kernels
