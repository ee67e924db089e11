// SPDX-License-Identifier: Apache-2.0
#include <cmath>

#include "attention_common.cuh"
#include "attention_decode.cuh"

namespace ftp::kernels {
namespace {

constexpr int kWarps = 4;

/// DPL: dimensions per lane (head_dim <= 32 x DPL): lane owns d = lane + 32 i.
/// T: the pages' element type (float, __half, __nv_bfloat16).
template <int DPL, class T>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(AttentionArgs a) {
  detail::pdl_begin();
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float acc_s[kWarps][kMaxHeadDim];
  __shared__ float m_s[kWarps], l_s[kWarps];
  const int row = blockIdx.x, h = blockIdx.y;  // rows on x: gridDim.y is capped at 65535
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = a.head_dim;
  const int pos = a.row_pos[row];
  const int* table = a.block_tables + static_cast<std::int64_t>(a.row_seq[row]) * a.bt_ld;
  const int kvj = (a.q_head0 + h) / a.group - a.kv_head0;
  const float* qrow = a.q + static_cast<std::int64_t>(row) * a.q_ld + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q_s[d] = qrow[d];
  __syncthreads();

  float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
  for (int p0 = warp * 32; p0 <= pos; p0 += kWarps * 32) {
    const int p = p0 + lane;
    const bool valid = p <= pos;
    float s = -INFINITY;
    std::int64_t off = 0;
    if (valid) {
      off = detail::kv_offset(a, table, p, kvj);
      s = detail::dot_head(q_s, static_cast<const T*>(a.k_pages) + off, hd) * a.scale;
    }
    const float m_new = fmaxf(m, detail::warp_max(s));  // finite: lane 0 is valid
    const float corr = expf(m - m_new);
    const float pj = valid ? expf(s - m_new) : 0.0f;
    l = l * corr + detail::warp_sum(pj);
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= corr;
    const int n = min(32, pos - p0 + 1);
    for (int j = 0; j < n; ++j) {
      const float pv = __shfl_sync(0xffffffffu, pj, j);
      const long long vo = __shfl_sync(0xffffffffu, static_cast<long long>(off), j);
      const T* vrow = static_cast<const T*>(a.v_pages) + vo;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] = fmaf(pv, detail::kv_f32(vrow[d]), acc[i]);
      }
    }
    m = m_new;
  }
  // Merge the warps: out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M).
  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) acc_s[warp][d] = acc[i];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w]);
  float L = 0.0f;
  float f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    f[w] = l_s[w] > 0.0f ? expf(m_s[w] - M) : 0.0f;
    L += l_s[w] * f[w];
  }
  float* orow = a.out + static_cast<std::int64_t>(row) * a.out_ld + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += acc_s[w][d] * f[w];
    orow[d] = o / L;
  }
}

template <class T>
void launch_decode(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.t), static_cast<unsigned>(a.n_q_heads));
  if (a.head_dim <= 32) detail::launch(decode_kernel<1, T>, grid, kWarps * 32, 0, stream, a);
  else if (a.head_dim <= 64) detail::launch(decode_kernel<2, T>, grid, kWarps * 32, 0, stream, a);
  else if (a.head_dim <= 128) detail::launch(decode_kernel<4, T>, grid, kWarps * 32, 0, stream, a);
  else detail::launch(decode_kernel<8, T>, grid, kWarps * 32, 0, stream, a);
}

}  // namespace

cudaError_t attention_decode(const AttentionArgs& a, cudaStream_t stream) {
  if (a.t <= 0 || a.n_q_heads <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim || a.block_tokens <= 0 || a.group <= 0) return cudaErrorInvalidValue;
  switch (a.kv_elem) {
    case KvElem::f16: launch_decode<__half>(a, stream); break;
    case KvElem::bf16: launch_decode<__nv_bfloat16>(a, stream); break;
    default: launch_decode<float>(a, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace ftp::kernels
