// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "rope.cuh"

namespace ftp::kernels {
namespace {

__global__ void rope_kernel(float* v, int ld, int n_heads, int head_dim, int n_rot, const int* __restrict__ pos,
                            float theta, bool neox, const float* __restrict__ freq_factors) {
  detail::pdl_begin();
  const int r = blockIdx.x, pairs = n_rot / 2;
  const float p = static_cast<float>(pos[r]);
  float* row = v + static_cast<std::int64_t>(r) * ld;
  for (int e = threadIdx.x; e < n_heads * pairs; e += blockDim.x) {
    const int h = e / pairs;
    float* q = row + h * head_dim;
    const detail::RopePair rp = detail::rope_pair(p, e % pairs, n_rot, theta, neox, freq_factors);
    detail::rope_rotate(q, rp, &q[rp.d0], &q[rp.d1]);
  }
}

}  // namespace

cudaError_t rope_f32(float* v, int ld, int t, int n_heads, int head_dim, int n_rot, const int* pos, float theta,
                     bool neox, const float* freq_factors, cudaStream_t stream) {
  if (t <= 0 || n_heads <= 0 || n_rot < 2) return cudaSuccess;
  if (n_rot > head_dim) return cudaErrorInvalidValue;
  const int work = n_heads * (n_rot / 2);
  const int threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
  detail::launch(rope_kernel, t, threads, 0, stream, v, ld, n_heads, head_dim, n_rot, pos, theta, neox,
                 freq_factors);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
