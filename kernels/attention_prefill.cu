// SPDX-License-Identifier: Apache-2.0
#include <cmath>

#include "attention_common.cuh"
#include "attention_prefill.cuh"

namespace ftp::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16;             // query rows per tile
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr int kKeys = 32;             // positions per K/V tile (a lane each)

std::size_t smem_bytes(int hd) {
  // Q [16][hd], K [32][hd + 1] (padded: lane j reads row j without bank
  // conflicts), V [32][hd], plus the rows' sequence and position.
  return sizeof(float) * (static_cast<std::size_t>(kRows) * hd + kKeys * (hd + 1) + kKeys * hd) + 2 * kRows * sizeof(int);
}

template <int DPL>
__global__ void __launch_bounds__(kWarps * 32) prefill_kernel(AttentionArgs a) {
  extern __shared__ float smem[];
  const int hd = a.head_dim, kst = hd + 1;
  float* q_s = smem;
  float* k_s = q_s + kRows * hd;
  float* v_s = k_s + kKeys * kst;
  int* seq_s = reinterpret_cast<int*>(v_s + kKeys * hd);
  int* pos_s = seq_s + kRows;
  const int h = blockIdx.y, row0 = blockIdx.x * kRows;
  const int n_rows = min(kRows, a.t - row0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvj = (a.q_head0 + h) / a.group - a.kv_head0;

  if (threadIdx.x < kRows) {
    const bool in = static_cast<int>(threadIdx.x) < n_rows;
    seq_s[threadIdx.x] = in ? a.row_seq[row0 + threadIdx.x] : -1;
    pos_s[threadIdx.x] = in ? a.row_pos[row0 + threadIdx.x] : -1;
  }
  for (int e = threadIdx.x; e < n_rows * hd; e += blockDim.x) {
    const int r = e / hd, d = e % hd;
    q_s[e] = a.q[static_cast<std::int64_t>(row0 + r) * a.q_ld + h * hd + d];
  }
  __syncthreads();

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][DPL];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < DPL; ++k) acc[i][k] = 0.0f;
  }

  // Runs of rows of one sequence; every thread walks the same runs.
  for (int ra = 0; ra < n_rows;) {
    const int seq = seq_s[ra];
    int rb = ra + 1, max_pos = pos_s[ra];
    while (rb < n_rows && seq_s[rb] == seq) max_pos = max(max_pos, pos_s[rb++]);
    const int* table = a.block_tables + static_cast<std::int64_t>(seq) * a.bt_ld;
    for (int p0 = 0; p0 <= max_pos; p0 += kKeys) {
      const int nk = min(kKeys, max_pos - p0 + 1);
      __syncthreads();  // the previous tile is no longer read
      for (int e = threadIdx.x; e < nk * hd; e += blockDim.x) {
        const int j = e / hd, d = e % hd;
        const std::int64_t off = detail::kv_offset(a, table, p0 + j, kvj) + d;
        k_s[j * kst + d] = detail::kv_load(a.k_pages, a.kv_elem, off);
        v_s[j * hd + d] = detail::kv_load(a.v_pages, a.kv_elem, off);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp + kWarps * i;
        if (r < ra || r >= rb) continue;  // warp-uniform
        const int pos = pos_s[r];
        if (p0 > pos) continue;           // warp-uniform: nothing visible in this tile
        const bool valid = lane < nk && p0 + lane <= pos;
        float s = -INFINITY;
        if (valid) {
          const float* qr = q_s + r * hd;
          const float* kr = k_s + lane * kst;
          float dsum = 0.0f;
          for (int d = 0; d < hd; ++d) dsum = fmaf(qr[d], kr[d], dsum);
          s = dsum * a.scale;
        }
        const float m_new = fmaxf(m[i], detail::warp_max(s));  // lane 0 is valid
        const float corr = expf(m[i] - m_new);
        const float pj = valid ? expf(s - m_new) : 0.0f;
        l[i] = l[i] * corr + detail::warp_sum(pj);
#pragma unroll
        for (int k = 0; k < DPL; ++k) acc[i][k] *= corr;
        const int n = min(nk, pos - p0 + 1);
        for (int j = 0; j < n; ++j) {
          const float pv = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
          for (int k = 0; k < DPL; ++k) {
            const int d = lane + 32 * k;
            if (d < hd) acc[i][k] = fmaf(pv, v_s[j * hd + d], acc[i][k]);
          }
        }
        m[i] = m_new;
      }
    }
    ra = rb;
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r >= n_rows) continue;
    float* orow = a.out + static_cast<std::int64_t>(row0 + r) * a.out_ld + h * hd;
#pragma unroll
    for (int k = 0; k < DPL; ++k) {
      const int d = lane + 32 * k;
      if (d < hd) orow[d] = acc[i][k] / l[i];
    }
  }
}

template <int DPL>
cudaError_t launch(const AttentionArgs& a, cudaStream_t stream) {
  const std::size_t smem = smem_bytes(a.head_dim);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(prefill_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>((a.t + kRows - 1) / kRows), static_cast<unsigned>(a.n_q_heads));
  prefill_kernel<DPL><<<grid, kWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attention_prefill(const AttentionArgs& a, cudaStream_t stream) {
  if (a.t <= 0 || a.n_q_heads <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim || a.block_tokens <= 0 || a.group <= 0) return cudaErrorInvalidValue;
  if (a.head_dim <= 32) return launch<1>(a, stream);
  if (a.head_dim <= 64) return launch<2>(a, stream);
  if (a.head_dim <= 128) return launch<4>(a, stream);
  return launch<8>(a, stream);
}

}  // namespace ftp::kernels
