// SPDX-License-Identifier: Apache-2.0
#include "argmax.cuh"
#include "common.cuh"

namespace ftp::kernels {
namespace {

// (value, index) better: larger value, or the same value at a lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__global__ void __launch_bounds__(1024) argmax_kernel(const float* __restrict__ x, int n, int* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = x + static_cast<std::int64_t>(blockIdx.x) * n;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = row[i];
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    // All values NaN (or n == 0): index 0, as std::max_element gives.
    if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

}  // namespace

cudaError_t argmax_rows(const float* x, int t, int n, int* out, cudaStream_t stream) {
  if (t <= 0) return cudaSuccess;
  if (n <= 0) return cudaErrorInvalidValue;
  argmax_kernel<<<t, 1024, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
