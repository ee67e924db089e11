// SPDX-License-Identifier: Apache-2.0
#include <climits>

#include "common.cuh"
#include "quant_blocks.cuh"
#include "quantize_act.cuh"

namespace ftp::kernels {
namespace {

constexpr int kWarps = 4;

/// The activation block of this warp (B elements): its row u, first
/// element j0 and length n; false past the last block.
template <int B>
__device__ __forceinline__ bool warp_block(int t, int k, int nb, std::int64_t& wb, std::int64_t& u, int& j0, int& n) {
  wb = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (wb >= static_cast<std::int64_t>(t) * nb) return false;
  u = wb / nb;
  j0 = static_cast<int>(wb % nb) * B;
  n = min(B, k - j0);
  return true;
}

/// Blocks of 32 (Q8_0 / Q8_1 values): a lane per element.
__global__ void __launch_bounds__(kWarps * 32)
    quantize_q8_0_kernel(const float* __restrict__ x, float* __restrict__ out, int t, int k, int nb,
                         std::int8_t* __restrict__ quants, float* __restrict__ scales) {
  detail::pdl_begin();
  const int lane = threadIdx.x & 31;
  std::int64_t wb, u;
  int j0, n;
  if (!warp_block<32>(t, k, nb, wb, u, j0, n)) return;
  const float* xr = x + u * k + j0;
  const float v = lane < n ? xr[lane] : 0.0f;
  // fmaxf ignores a NaN, as the CPU's std::max(amax, |x|) does.
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const qb::Q8Scale s = qb::q8_0_scale(amax);
  if (lane < n) {
    out[u * k + j0 + lane] = qb::q8_0_value(v, s);
    if (quants) quants[u * k + j0 + lane] = static_cast<std::int8_t>(qb::q8_0_int(v, s));
  }
  if (scales && lane == 0) scales[wb] = s.d;
}

/// Blocks of 256 (Q8_K values): 8 elements a lane (element lane + 32 i);
/// the maximum is the first element of the largest magnitude
/// (qb::q8_k_beats over (magnitude, index) pairs).
__global__ void __launch_bounds__(kWarps * 32)
    quantize_q8_k_kernel(const float* __restrict__ x, float* __restrict__ out, int t, int k, int nb,
                         std::int8_t* __restrict__ quants, float* __restrict__ scales) {
  detail::pdl_begin();
  const int lane = threadIdx.x & 31;
  std::int64_t wb, u;
  int j0, n;
  if (!warp_block<256>(t, k, nb, wb, u, j0, n)) return;
  const float* xr = x + u * k + j0;
  float v[8];
  float best = 0.0f, best_v = 0.0f;
  int best_i = INT_MAX;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n ? xr[e] : 0.0f;
    // Strictly larger: within a lane the first (lowest) index keeps a tie.
    if (fabsf(v[i]) > best) {
      best = fabsf(v[i]);
      best_v = v[i];
      best_i = e;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (qb::q8_k_beats(ob, oi, best, best_i)) {
      best = ob;
      best_v = ov;
      best_i = oi;
    }
  }
  const qb::Q8Scale s = qb::q8_k_scale(best_v);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int e = lane + 32 * i;
    if (e < n) {
      out[u * k + j0 + e] = qb::q8_k_value(v[i], s);
      if (quants) quants[u * k + j0 + e] = static_cast<std::int8_t>(qb::q8_k_int(v[i], s));
    }
  }
  if (scales && lane == 0) scales[wb] = s.d;
}

}  // namespace

cudaError_t quantize_activations_f32(const float* x, float* out, int t, int k, ActQuant kind, cudaStream_t stream,
                                     std::int8_t* quants, float* scales) {
  if (t <= 0 || k <= 0) return cudaSuccess;
  if (kind == ActQuant::none)
    return cudaMemcpyAsync(out, x, static_cast<std::size_t>(t) * k * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  const int B = kind == ActQuant::q8_k ? 256 : 32;
  const int nb = (k + B - 1) / B;
  const std::int64_t warps = static_cast<std::int64_t>(t) * nb;
  const unsigned grid = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  if (kind == ActQuant::q8_k)
    detail::launch(quantize_q8_k_kernel, grid, kWarps * 32, 0, stream, x, out, t, k, nb, quants, scales);
  else detail::launch(quantize_q8_0_kernel, grid, kWarps * 32, 0, stream, x, out, t, k, nb, quants, scales);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
