// SPDX-License-Identifier: Apache-2.0
#include "common.cuh"
#include "embed.cuh"
#include "quant_dispatch.cuh"

namespace ftp::kernels {
namespace {

/// The view row of the block's token (blockIdx.x), or -1 after writing
/// zeros over its output row o (a token outside the view's rows).
__device__ __forceinline__ std::int64_t token_row(const WeightView& w, const int* __restrict__ tokens, int first_token,
                                                  float* o) {
  const std::int64_t local = static_cast<std::int64_t>(tokens[blockIdx.x]) - first_token;
  if (local >= 0 && local < w.rows) return local;
  for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x) o[j] = 0.0f;
  return -1;
}

__global__ void embed_kernel(WeightView w, const int* __restrict__ tokens, float* __restrict__ out, int first_token) {
  detail::pdl_begin();
  float* o = out + static_cast<std::int64_t>(blockIdx.x) * w.cols;
  const std::int64_t local = token_row(w, tokens, first_token, o);
  if (local < 0) return;
  const std::int64_t first = (w.r0 + local) * w.ld + w.c0;
  for (std::int64_t j = threadIdx.x; j < w.cols; j += blockDim.x) o[j] = detail::load_weight(w.data, w.dtype, first + j);
}

/// Block types: a thread per chunk of 32 weights of the token's row, each
/// weight bit for bit as ggml dequantizes it (quant_blocks.cuh).
template <qb::QType Q>
__global__ void embed_block_kernel(WeightView w, const int* __restrict__ tokens, float* __restrict__ out,
                                   int first_token) {
  detail::pdl_begin();
  using B = qb::Block<Q>;
  float* o = out + static_cast<std::int64_t>(blockIdx.x) * w.cols;
  const std::int64_t local = token_row(w, tokens, first_token, o);
  if (local < 0) return;
  const std::uint8_t* row = detail::block_row<Q>(w, local);
  const std::int64_t n_chunks = w.cols / B::kElems * B::kChunks;
  for (std::int64_t g = threadIdx.x; g < n_chunks; g += blockDim.x) {
    const std::int64_t blk = g / B::kChunks;
    qb::decode_chunk<Q>(row + blk * B::kBytes, static_cast<int>(g % B::kChunks), o + blk * B::kElems);
  }
}

}  // namespace

cudaError_t embed_rows(const WeightView& table, const int* tokens, int t, float* out, cudaStream_t stream,
                       int first_token) {
  if (t <= 0 || table.cols <= 0) return cudaSuccess;
  if (table.dtype == WeightDType::q8_0 && (table.c0 % 32 != 0 || table.ld % 32 != 0)) return cudaErrorInvalidValue;
  if (is_block_quant(table.dtype) && !detail::whole_blocks(table)) return cudaErrorInvalidValue;
  const bool block = detail::visit_block_quant(table.dtype, [&](auto q) {
    detail::launch(embed_block_kernel<decltype(q)::value>, t, 256, 0, stream, table, tokens, out, first_token);
  });
  if (!block) detail::launch(embed_kernel, t, 256, 0, stream, table, tokens, out, first_token);
  return cudaGetLastError();
}

}  // namespace ftp::kernels
