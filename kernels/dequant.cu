// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "dequant.cuh"
#include "quant_dispatch.cuh"

namespace ftp::kernels {
namespace {

template <class H>
__global__ void dequant_kernel(WeightView w, std::int64_t row0, H* __restrict__ out) {
  const std::int64_t i = blockIdx.x;  // row of the tile
  const std::int64_t first = (w.r0 + row0 + i) * w.ld + w.c0;
  H* o = out + i * w.cols;
  for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x)
    o[j] = detail::to_half<H>(detail::load_weight(w.data, w.dtype, first + j));
}

/// Block types: a thread per chunk of 32 weights (quant_blocks.cuh), each
/// weight as ggml dequantizes it, rounded once to the tile's type.
template <qb::QType Q, class H>
__global__ void dequant_block_kernel(WeightView w, std::int64_t row0, H* __restrict__ out) {
  using B = qb::Block<Q>;
  const std::int64_t i = blockIdx.x;
  const std::uint8_t* row = detail::block_row<Q>(w, row0 + i);
  H* o = out + i * w.cols;
  const std::int64_t n_chunks = w.cols / B::kElems * B::kChunks;
  for (std::int64_t g = threadIdx.x; g < n_chunks; g += blockDim.x) {
    const std::int64_t blk = g / B::kChunks;
    const int c = static_cast<int>(g % B::kChunks);
    const typename B::Raw raw = B::load(row + blk * B::kBytes, c);
    H* ob = o + blk * B::kElems + B::start(c);
#pragma unroll
    for (int r = 0; r < B::kRuns; ++r) {
      float q[B::kRunLen], d, m;
      B::run(raw, c, r, q, d, m);
#pragma unroll
      for (int k = 0; k < B::kRunLen; ++k) ob[r * B::kStride + k] = detail::to_half<H>(qb::weight<Q>(d, q[k], m));
    }
  }
}

template <class H>
cudaError_t launch_tile(const WeightView& w, std::int64_t row0, unsigned grid, H* out, cudaStream_t stream) {
  const bool block = detail::visit_block_quant(w.dtype, [&](auto q) {
    dequant_block_kernel<decltype(q)::value, H><<<grid, 256, 0, stream>>>(w, row0, out);
  });
  if (!block) dequant_kernel<<<grid, 256, 0, stream>>>(w, row0, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t dequant_tile(const WeightView& w, std::int64_t row0, std::int64_t n_rows, void* out, HalfType to,
                         cudaStream_t stream) {
  if (n_rows <= 0 || w.cols <= 0) return cudaSuccess;
  if (n_rows > 0x7fffffff || row0 < 0 || row0 + n_rows > w.rows) return cudaErrorInvalidValue;
  if (is_block_quant(w.dtype) && !detail::whole_blocks(w)) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(n_rows);
  if (to == HalfType::f16) return launch_tile(w, row0, grid, static_cast<__half*>(out), stream);
  return launch_tile(w, row0, grid, static_cast<__nv_bfloat16*>(out), stream);
}

}  // namespace ftp::kernels
