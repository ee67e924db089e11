// SPDX-License-Identifier: Apache-2.0
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "sample.cuh"

namespace ftp::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr std::uint32_t kOneBits = 0x3F800000u;  // bits of 1.0f: the largest probability

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
  return detail::block_reduce(s, red, 0.0, detail::Plus{});
}

/// Tokens among the first m whose probability has bits b.
__device__ int count_at(const float* row, int m, float mx, float temp, std::uint32_t b, int* red) {
  int c = 0;
  for (int i = threadIdx.x; i < m; i += blockDim.x) c += __float_as_uint(prob(row, i, mx, temp)) == b;
  return detail::block_reduce(c, red, 0, detail::Plus{});
}

/// The id of the j-th (from 0, in id order) token whose probability has bits b.
__device__ int nth_at(const float* row, int n, float mx, float temp, std::uint32_t b, int j, int* red) {
  int lo = 0, hi = n;  // count_at(lo) <= j < count_at(hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (count_at(row, mid, mx, temp, b, red) > j) hi = mid;
    else lo = mid;
  }
  return lo;
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

  // Max.
  float bv = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) bv = fmaxf(bv, row[i]);
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
  const float tp = top_p[blockIdx.x];
  // Greedy, and top_p <= 0 (the CPU keeps one token): the first of the largest logits.
  if (!(temp > 0.0f) || !(tp > 0.0f)) {
    int cand = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (row[i] == mx) cand = min(cand, i);
    cand = detail::block_reduce(cand, red_i, 0x7fffffff, detail::Min{});
    if (threadIdx.x == 0) out[blockIdx.x] = cand == 0x7fffffff ? 0 : cand;
    return;
  }
  const double total = mass_at_least(row, n, mx, temp, 0u, red_d);
  // Nucleus, as the CPU's sorted prefix: every token above level tau, and the
  // first keep_tau (lowest ids) of the tokens at level tau.
  std::uint32_t tau = 0;
  int keep_tau = 0x7fffffff;
  double nucleus = total;
  if (tp < 1.0f) {
    const double goal = static_cast<double>(tp) * total;
    std::uint32_t lo = 0, hi = kOneBits + 1;  // mass(>= lo) >= goal > mass(>= hi)
    while (hi - lo > 1) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (mass_at_least(row, n, mx, temp, mid, red_d) >= goal) lo = mid;
      else hi = mid;
    }
    tau = lo;
    const double above = mass_at_least(row, n, mx, temp, tau + 1, red_d);
    const double pt = __uint_as_float(tau);
    const int cnt = count_at(row, n, mx, temp, tau, red_i);
    keep_tau = max(1, static_cast<int>(fmin(static_cast<double>(cnt), ceil((goal - above) / pt))));
    nucleus = above + keep_tau * pt;
  }
  // u < 1 strictly (a draw rounded to 1.0f would pick past the nucleus).
  const double target = fmin(static_cast<double>(uniform[blockIdx.x]) * nucleus, nextafter(nucleus, 0.0));
  // The level of the chosen token: the largest b >= tau with mass(>= b) > target.
  std::uint32_t lo = tau, hi = kOneBits + 1;
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (mass_at_least(row, n, mx, temp, mid, red_d) > target) lo = mid;
    else hi = mid;
  }
  // Within the level, tokens in id order (the CPU's stable order): skip
  // floor((target - mass above) / p) of them.
  const double above = mass_at_least(row, n, mx, temp, lo + 1, red_d);
  int cnt = count_at(row, n, mx, temp, lo, red_i);
  if (lo == tau) cnt = min(cnt, keep_tau);
  const double skip = floor((target - above) / static_cast<double>(__uint_as_float(lo)));
  const int j = skip <= 0.0 ? 0 : skip >= cnt - 1 ? cnt - 1 : static_cast<int>(skip);
  const int tok = nth_at(row, n, mx, temp, lo, j, red_i);
  if (threadIdx.x == 0) out[blockIdx.x] = tok;
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
