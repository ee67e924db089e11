// SPDX-License-Identifier: Apache-2.0
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "sample.cuh"

namespace ftp::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr std::uint32_t kOneBits = 0x3F800000u;  // bits of 1.0f: the largest probability

__device__ double block_sum_d(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ int block_min_i(int v, int* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0x7fffffff;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float prob(const float* row, int i, float mx, float temp) {
  return expf((row[i] - mx) / temp);
}

/// Mass of the probabilities whose bits are >= b.
__device__ double mass_at_least(const float* row, int n, float mx, float temp, std::uint32_t b, double* red) {
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float p = prob(row, i, mx, temp);
    if (__float_as_uint(p) >= b) s += p;
  }
  return block_sum_d(s, red);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int ld, int n,
                                                          const float* __restrict__ temperature,
                                                          const float* __restrict__ top_p,
                                                          const float* __restrict__ uniform, int* out) {
  __shared__ double red_d[32];
  __shared__ int red_i[32];
  __shared__ float red_f[32];
  const float* row = logits + static_cast<std::int64_t>(blockIdx.x) * ld;
  const float temp = temperature[blockIdx.x];

  // Max (and argmax, lowest index on ties).
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = row[i];
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
  }
  {
    float w = bv;
    for (int o = 16; o > 0; o >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red_f[warp] = w;
    __syncthreads();
    w = lane < static_cast<int>(blockDim.x >> 5) ? red_f[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, o));
    bv = w;
  }
  const float mx = bv;
  if (!(temp > 0.0f)) {
    int cand = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (row[i] == mx) cand = min(cand, i);
    cand = block_min_i(cand, red_i);
    if (threadIdx.x == 0) out[blockIdx.x] = cand == 0x7fffffff ? 0 : cand;
    return;
  }

  const double total = mass_at_least(row, n, mx, temp, 0u, red_d);
  const float tp = top_p[blockIdx.x];
  // Nucleus: the largest threshold tau whose mass(>= tau) reaches top_p.
  std::uint32_t tau = 0;
  if (tp < 1.0f) {
    if (!(tp > 0.0f)) {
      tau = kOneBits;  // only the most probable token(s), as the CPU keeps one
    } else {
      const double goal = static_cast<double>(tp) * total;
      std::uint32_t lo = 0, hi = kOneBits + 1;  // mass(>= lo) >= goal > mass(>= hi)
      while (hi - lo > 1) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        if (mass_at_least(row, n, mx, temp, mid, red_d) >= goal) lo = mid;
        else hi = mid;
      }
      tau = lo;
    }
  }
  const double nucleus = tau == 0 ? total : mass_at_least(row, n, mx, temp, tau, red_d);
  const double target = static_cast<double>(uniform[blockIdx.x]) * nucleus;
  // The chosen probability: the largest b >= tau with mass(>= b) > target.
  std::uint32_t lo = tau, hi = kOneBits + 1;
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (mass_at_least(row, n, mx, temp, mid, red_d) > target) lo = mid;
    else hi = mid;
  }
  // Some token has exactly these bits (the mass changes at lo); the lowest
  // index of those. If rounding left none, the smallest probability >= lo.
  int cand = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (__float_as_uint(prob(row, i, mx, temp)) == lo) cand = min(cand, i);
  cand = block_min_i(cand, red_i);
  if (cand == 0x7fffffff) {
    std::uint32_t best = 0xffffffffu;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const std::uint32_t b = __float_as_uint(prob(row, i, mx, temp));
      if (b >= lo && b < best) best = b;
    }
    // Block min over unsigned values (as int: bits of positive floats fit).
    const int bmin = block_min_i(static_cast<int>(best >> 1), red_i);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (static_cast<int>(__float_as_uint(prob(row, i, mx, temp)) >> 1) == bmin) cand = min(cand, i);
    cand = block_min_i(cand, red_i);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = cand == 0x7fffffff ? bi : cand;
}

}  // namespace

cudaError_t sample_top_p(const float* logits, int ld, int t, int n, const float* temperature, const float* top_p,
                         const float* uniform, int* out, cudaStream_t stream) {
  if (t <= 0) return cudaSuccess;
  if (n <= 0 || ld < n) return cudaErrorInvalidValue;
  sample_kernel<<<t, kThreads, 0, stream>>>(logits, ld, n, temperature, top_p, uniform, out);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
