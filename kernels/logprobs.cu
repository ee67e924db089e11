// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "logprobs.cuh"

namespace ftp::kernels {
namespace {

constexpr int kThreads = 256;

// (v, i) comes before (bv, bi) in the top order: larger value, or the
// same value at a lower index.
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Block-wide best (value, index) of the threads' candidates; every thread gets it.
__device__ void block_best(float& bv, int& bi, float* sv, int* si) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (before(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  bv = sv[0], bi = si[0];
  for (int w = 1; w < kThreads / 32; ++w)
    if (before(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
}

__global__ void __launch_bounds__(kThreads) logprobs_kernel(const float* __restrict__ x, int ld, int n,
                                                            const int* __restrict__ ids, int k, float* chosen,
                                                            int* top_ids, float* top_lp) {
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ double ssum[kThreads / 32];
  const float* row = x + static_cast<std::int64_t>(blockIdx.x) * ld;
  // The row's maximum (the first top token).
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += kThreads)
    if (before(row[i], i, bv, bi)) bv = row[i], bi = i;
  block_best(bv, bi, sv, si);
  const float mx = bv;
  double sum = 0;
  if (isfinite(mx))
    for (int i = threadIdx.x; i < n; i += kThreads) sum += exp(static_cast<double>(row[i]) - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) ssum[threadIdx.x >> 5] = sum;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += ssum[w];
  // Non-finite maximum, the host's rule (token_logprobs): +inf gives 0 to
  // the tokens equal to it and -inf to the rest; -inf gives -inf to all.
  const bool finite = isfinite(mx);
  const double lse = mx + log(total);
  auto lp = [&](float v) -> float {
    if (!finite) return v == mx && mx > 0 ? 0.0f : -INFINITY;
    return static_cast<float>(static_cast<double>(v) - lse);
  };
  if (threadIdx.x == 0) {
    const int id = ids[blockIdx.x];
    chosen[blockIdx.x] = id >= 0 && id < n ? lp(row[id]) : -INFINITY;
  }
  // Top k: pass j takes the best token ordered after pass j - 1's.
  float pv = bv;
  int pi = bi;
  for (int j = 0; j < k; ++j) {
    if (j > 0) {
      bv = -INFINITY;
      bi = 0x7fffffff;
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const float v = row[i];
        if (before(pv, pi, v, i) && before(v, i, bv, bi)) bv = v, bi = i;
      }
      block_best(bv, bi, sv, si);
      pv = bv, pi = bi;
    }
    if (threadIdx.x == 0) {
      top_ids[blockIdx.x * k + j] = pi == 0x7fffffff ? j : pi;
      top_lp[blockIdx.x * k + j] = pi == 0x7fffffff ? -INFINITY : lp(pv);
    }
  }
}

}  // namespace

cudaError_t logprobs_rows(const float* logits, int ld, int t, int n, const int* ids, int k, float* chosen,
                          int* top_ids, float* top_lp, cudaStream_t stream) {
  if (t <= 0) return cudaSuccess;
  if (n <= 0 || k < 0 || k > 20 || k > n) return cudaErrorInvalidValue;
  logprobs_kernel<<<t, kThreads, 0, stream>>>(logits, ld, n, ids, k, chosen, top_ids, top_lp);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
