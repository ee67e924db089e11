// SPDX-License-Identifier: Apache-2.0
#include "engine/ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

#include "engine/quant_matmul.hpp"
#include "model/quant.hpp"

namespace ftp::engine::ops {

namespace {

/// The portable path: tiles of 64 rows converted to float32 by
/// model::to_f32, then sgemm.
void matmul_tiles(const float* x, const MatView& w, float* out, int t) {
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  constexpr int kTile = 64;
  thread_local std::vector<float> tile, row;
  tile.resize(static_cast<std::size_t>(kTile) * k);
  // Quantized types convert whole blocks: start at the block holding c0.
  const std::int64_t lead = w.c0 % model::dtype_block(tv.dtype);
  row.resize(static_cast<std::size_t>(lead + k));
  for (int i0 = 0; i0 < n; i0 += kTile) {
    int rows = std::min(kTile, n - i0);
    for (int i = 0; i < rows; ++i) {
      std::int64_t first = (w.r0 + i0 + i) * tv.cols + w.c0;
      if (lead == 0) {
        model::to_f32(tv, first, k, &tile[static_cast<std::size_t>(i) * k]);
      } else {
        model::to_f32(tv, first - lead, lead + k, row.data());
        std::copy_n(row.data() + lead, k, &tile[static_cast<std::size_t>(i) * k]);
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, rows, k, 1.0f, x, k, tile.data(), k, 0.0f, out + i0, n);
  }
}

#if defined(__x86_64__)
#define FTP_X86 1
#define FTP_AVX2 __attribute__((target("avx2,fma,f16c")))

bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
}

// Software prefetch distance, bytes ahead in each weight row: the rows of
// a block are 4 streams, more than the hardware prefetchers follow well.
constexpr int kPrefetchBytes = 1024;
constexpr int kPrefetch16 = kPrefetchBytes / 2;

FTP_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

FTP_AVX2 inline float f16_scalar(std::uint16_t h) { return _cvtsh_ss(h); }
inline float bf16_scalar(std::uint16_t h) {
  std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

/// 8 weights of a 16-bit row from element j.
template <model::DType D>
FTP_AVX2 inline __m256 load8(const std::uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (D == model::DType::f16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <model::DType D>
FTP_AVX2 inline float scalar16(std::uint16_t h) {
  if constexpr (D == model::DType::f16) return f16_scalar(h);
  else return bf16_scalar(h);
}

/// R weight rows x T tokens of F16/BF16: out[tok][row] = x[tok] . w[row],
/// each weight converted once and used for T tokens.
template <model::DType D, int R, int T>
FTP_AVX2 void block16(const float* x, int ldx, const std::uint16_t* const* wr, int k, float* out, int ldo) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= k; j += 8) {
    __m256 xv[T];
    for (int u = 0; u < T; ++u) xv[u] = _mm256_loadu_ps(x + static_cast<std::ptrdiff_t>(u) * ldx + j);
    if ((j & 31) == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wr[r] + j + kPrefetch16), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      __m256 wv = load8<D>(wr[r] + j);
      for (int u = 0; u < T; ++u) acc[r][u] = _mm256_fmadd_ps(wv, xv[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) {
      float s = hsum(acc[r][u]);
      const float* xu = x + static_cast<std::ptrdiff_t>(u) * ldx;
      for (int jj = j; jj < k; ++jj) s += scalar16<D>(wr[r][jj]) * xu[jj];
      out[static_cast<std::ptrdiff_t>(u) * ldo + r] = s;
    }
}

/// Activations quantised as Q8_0 does its weights: per block of 32, int8
/// values and one float scale (llama.cpp's vec_dot_q8_0_q8_0 scheme).
struct QuantRows {
  std::vector<std::int8_t> q;  // [t][k]
  std::vector<float> d;        // [t][k / 32]
  std::vector<std::int32_t> c; // [t][k / 32]: -128 x the block's sum of q (with `sums`)
};

FTP_AVX2 void quantize_rows(const float* x, int t, int k, QuantRows& out, bool sums = false) {
  out.q.resize(static_cast<std::size_t>(t) * k);
  out.d.resize(static_cast<std::size_t>(t) * (k / 32));
  if (sums) out.c.resize(out.d.size());
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int u = 0; u < t; ++u)
    for (int b = 0; b < k / 32; ++b) {
      const float* p = x + static_cast<std::ptrdiff_t>(u) * k + b * 32;
      __m256 v[4], m = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(p + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      const float d = amax / 127.0f;
      out.d[static_cast<std::size_t>(u) * (k / 32) + b] = d;
      const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      __m256i i32[4];
      for (int i = 0; i < 4; ++i)
        i32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      // Pack 32 int32 to 32 int8 (packs work per 128-bit lane: fix the order).
      if (sums) {
        __m256i a = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        out.c[static_cast<std::size_t>(u) * (k / 32) + b] = -128 * _mm_cvtsi128_si32(h);
      }
      __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
      __m256i i8 = _mm256_packs_epi16(i16a, i16b);
      i8 = _mm256_permutevar8x32_epi32(i8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + static_cast<std::ptrdiff_t>(u) * k + b * 32), i8);
    }
}

/// R Q8_0 weight rows x T quantised tokens, integer dots per block of 32
/// (maddubs on |w| and sign-adjusted x), scaled by d_w x d_x in float.
/// Rows whose segment starts on a block and holds whole blocks.
template <int R, int T>
FTP_AVX2 void block_q8(const std::int8_t* xq, const float* xd, int k, const std::uint8_t* const* wr, float* out,
                       int ldo) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  const int nb = k / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nb; ++b) {
    __m256i xv[T];
    __m256 dx[T];
    for (int u = 0; u < T; ++u) {
      xv[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + static_cast<std::ptrdiff_t>(u) * k + b * 32));
      dx[u] = _mm256_set1_ps(xd[static_cast<std::ptrdiff_t>(u) * nb + b]);
    }
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = wr[r] + static_cast<std::ptrdiff_t>(b) * 34;
      _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
      std::uint16_t h;
      std::memcpy(&h, blk, 2);
      const __m256 dw = _mm256_set1_ps(f16_scalar(h));
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i aw = _mm256_sign_epi8(w, w);
      for (int u = 0; u < T; ++u) {
        __m256i sx = _mm256_sign_epi8(xv[u], w);
        __m256i p16 = _mm256_maddubs_epi16(aw, sx);
        __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[r][u] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[u]), p, acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]);
}

template <int R, int T>
FTP_AVX2 void block_q8_any(const std::int8_t* xq, const float* xd, int k, const std::uint8_t* const* wr, float* out,
                           int ldo) {
  block_q8<R, T>(xq, xd, k, wr, out, ldo);
}

/// Q8_0: rows by 4 (then 1), tokens by groups of 3, as matmul_fused.
FTP_AVX2 void matmul_q8(const float* x, const MatView& w, float* out, int t) {
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols), nb = k / 32;
  const auto* base = static_cast<const std::uint8_t*>(tv.data);
  thread_local QuantRows xq;
  quantize_rows(x, t, k, xq);
  auto row_ptr = [&](std::int64_t i) { return base + ((w.r0 + i) * tv.cols + w.c0) / 32 * 34; };
  using Fn = void (*)(const std::int8_t*, const float*, int, const std::uint8_t* const*, float*, int);
  static constexpr Fn k4[4] = {nullptr, block_q8_any<4, 1>, block_q8_any<4, 2>, block_q8_any<4, 3>};
  static constexpr Fn k1[4] = {nullptr, block_q8_any<1, 1>, block_q8_any<1, 2>, block_q8_any<1, 3>};
  int i = 0;
  for (; i < n; i += (n - i >= 4 ? 4 : 1)) {
    const bool four = n - i >= 4;
    const std::uint8_t* wr[4] = {row_ptr(i), four ? row_ptr(i + 1) : nullptr, four ? row_ptr(i + 2) : nullptr,
                                 four ? row_ptr(i + 3) : nullptr};
    for (int u = 0; u < t; u += 3) {
      int g = std::min(3, t - u);
      (four ? k4 : k1)[g](xq.q.data() + static_cast<std::ptrdiff_t>(u) * k, xq.d.data() + static_cast<std::ptrdiff_t>(u) * nb,
                          k, wr, out + static_cast<std::ptrdiff_t>(u) * n + i, n);
    }
  }
}

using BlockFn = void (*)(const float*, int, const void* const*, int, float*, int);

template <model::DType D, int R, int T>
FTP_AVX2 void block_any(const float* x, int ldx, const void* const* wr, int k, float* out, int ldo) {
  block16<D, R, T>(x, ldx, reinterpret_cast<const std::uint16_t* const*>(wr), k, out, ldo);
}

/// Rows by blocks of 4 (then 1), tokens by groups of 3 (then 2, 1): 12
/// accumulators plus 3 activations and a weight vector fit the 16 ymm
/// registers. A weight row segment (k x 2 bytes, a few KiB) stays in L1
/// while the token groups pass over it, so memory reads each weight once.
template <model::DType D>
FTP_AVX2 void matmul_fused(const float* x, const MatView& w, float* out, int t) {
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const auto* base = static_cast<const std::uint8_t*>(tv.data);
  auto row_ptr = [&](std::int64_t i) -> const void* {
    std::int64_t first = (w.r0 + i) * tv.cols + w.c0;
    return base + first * 2;
  };
  static constexpr BlockFn k4[4] = {nullptr, block_any<D, 4, 1>, block_any<D, 4, 2>, block_any<D, 4, 3>};
  static constexpr BlockFn k1[4] = {nullptr, block_any<D, 1, 1>, block_any<D, 1, 2>, block_any<D, 1, 3>};
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const void* wr[4] = {row_ptr(i), row_ptr(i + 1), row_ptr(i + 2), row_ptr(i + 3)};
    for (int u = 0; u < t; u += 3) {
      int g = std::min(3, t - u);
      k4[g](x + static_cast<std::ptrdiff_t>(u) * k, k, wr, k, out + static_cast<std::ptrdiff_t>(u) * n + i, n);
    }
  }
  for (; i < n; ++i) {
    const void* wr[1] = {row_ptr(i)};
    for (int u = 0; u < t; u += 3) {
      int g = std::min(3, t - u);
      k1[g](x + static_cast<std::ptrdiff_t>(u) * k, k, wr, k, out + static_cast<std::ptrdiff_t>(u) * n + i, n);
    }
  }
}

// ---------------------------------------------------------------------------
// AVX-512 (F/BW/VL/VNNI) kernels, chosen at run time where the CPU has them.
// 32 vector registers: bigger register blocks (rows x tokens) than AVX2.

// GCC 12's AVX-512 headers trip its own -W(maybe-)uninitialized (the
// undefined-vector idiom inside _mm512_cvtph_ps and friends).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define FTP_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))

bool have_avx512() {
  static const bool ok = have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                         __builtin_cpu_supports("avx512dq");
  return ok;
}

/// Software prefetch into L2 (T1) of the next block of rows at the column
/// being read: one block (a few tens of KiB) ahead, the L1 fill buffers
/// left to the demand loads. Measured on Zen 4 (1 thread): T0 at 1 KiB ahead
/// in the same row streamed ~15 GB/s, this ~22 GB/s.
FTP_AVX512 inline void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

/// 16 weights of a 16-bit row from element j, as float32.
template <model::DType D>
FTP_AVX512 inline __m512 load16(const std::uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (D == model::DType::f16) {
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

/// R rows x T tokens of F16/BF16. Each output: one 16-lane accumulator over
/// chunks of 16 columns, its halves added, one 8-column chunk more, the
/// horizontal sum, then the scalar tail: the same order whatever R, T and t.
template <model::DType D, int R, int T>
FTP_AVX512 void block16_512(const float* x, int ldx, const std::uint16_t* const* wr, const std::uint16_t* const* wn,
                            int k, float* out, int ldo) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm512_setzero_ps();
  int j = 0;
  for (; j + 32 <= k; j += 32) {
    if (wn)
      for (int r = 0; r < R; ++r) prefetch_l2(wn[r] + j);
    for (int h = 0; h < 32; h += 16) {
      __m512 xv[T];
      for (int u = 0; u < T; ++u) xv[u] = _mm512_loadu_ps(x + static_cast<std::ptrdiff_t>(u) * ldx + j + h);
      for (int r = 0; r < R; ++r) {
        __m512 wv = load16<D>(wr[r] + j + h);
        for (int u = 0; u < T; ++u) acc[r][u] = _mm512_fmadd_ps(wv, xv[u], acc[r][u]);
      }
    }
  }
  for (; j + 16 <= k; j += 16) {
    for (int r = 0; r < R; ++r) {
      __m512 wv = load16<D>(wr[r] + j);
      for (int u = 0; u < T; ++u)
        acc[r][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + static_cast<std::ptrdiff_t>(u) * ldx + j), acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) {
      const float* xu = x + static_cast<std::ptrdiff_t>(u) * ldx;
      __m256 s = _mm256_add_ps(_mm512_castps512_ps256(acc[r][u]), _mm512_extractf32x8_ps(acc[r][u], 1));
      int jj = j;
      if (jj + 8 <= k) {
        s = _mm256_fmadd_ps(load8<D>(wr[r] + jj), _mm256_loadu_ps(xu + jj), s);
        jj += 8;
      }
      float v = hsum(s);
      for (; jj < k; ++jj) v += scalar16<D>(wr[r][jj]) * xu[jj];
      out[static_cast<std::ptrdiff_t>(u) * ldo + r] = v;
    }
}

template <model::DType D>
FTP_AVX512 void matmul_fused512(const float* x, const MatView& w, float* out, int t) {
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const auto* base = static_cast<const std::uint16_t*>(tv.data);
  auto row_ptr = [&](std::int64_t i) { return base + (w.r0 + i) * tv.cols + w.c0; };
  using Fn = void (*)(const float*, int, const std::uint16_t* const*, const std::uint16_t* const*, int, float*, int);
  // t = 1: 8 rows (8 weight streams); batches: 4 rows x up to 6 tokens (24
  // accumulators, 6 activations and a weight vector in the 32 registers).
  constexpr int R1 = 8, RB = 4, TB = 6;
  static constexpr Fn kb[TB + 1] = {nullptr,
                                    block16_512<D, RB, 1>,
                                    block16_512<D, RB, 2>,
                                    block16_512<D, RB, 3>,
                                    block16_512<D, RB, 4>,
                                    block16_512<D, RB, 5>,
                                    block16_512<D, RB, 6>};
  static constexpr Fn k1[TB + 1] = {nullptr,
                                    block16_512<D, 1, 1>,
                                    block16_512<D, 1, 2>,
                                    block16_512<D, 1, 3>,
                                    block16_512<D, 1, 4>,
                                    block16_512<D, 1, 5>,
                                    block16_512<D, 1, 6>};
  const int R = t == 1 ? R1 : RB;
  int i = 0;
  for (; i < n;) {
    const int rows = n - i >= R ? R : 1;
    const std::uint16_t* wr[R1];
    const std::uint16_t* wn[R1];
    const bool next = i + 2 * rows <= n;
    for (int r = 0; r < rows; ++r) {
      wr[r] = row_ptr(i + r);
      if (next) wn[r] = row_ptr(i + rows + r);
    }
    if (t == 1) {
      if (rows == R1) block16_512<D, R1, 1>(x, k, wr, next ? wn : nullptr, k, out + i, n);
      else block16_512<D, 1, 1>(x, k, wr, nullptr, k, out + i, n);
    } else {
      for (int u = 0; u < t; u += TB) {
        int g = std::min(TB, t - u);
        (rows == RB ? kb : k1)[g](x + static_cast<std::ptrdiff_t>(u) * k, k, wr, next ? wn : nullptr, k,
                                  out + static_cast<std::ptrdiff_t>(u) * n + i, n);
      }
    }
    i += rows;
  }
}

/// R Q8_0 rows x T tokens with VNNI: the activations offset to unsigned
/// (x + 128) and the integer dot started from -128 x sum(w), so each block's
/// 8 int32 lanes are exactly those of block_q8 (sum of 4 products each),
/// then acc = fma(d_w x d_x, float(lanes), acc) as there: the same results.
/// T = 1 takes the signed activations (xu8 then points at int8 values) and
/// block_q8's sign trick: the same integer lanes again.
template <int R, int T>
FTP_AVX512 void block_q8_vnni(const std::uint8_t* xu8, const float* xd, int k, const std::uint8_t* const* wr,
                              const std::uint8_t* const* wn, float* out, int ldo) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  const int nb = k / 32;
  const __m256i c128 = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i zero = _mm256_setzero_si256();
  for (int b = 0; b < nb; ++b) {
    __m256i xv[T];
    for (int u = 0; u < T; ++u)
      xv[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu8 + static_cast<std::ptrdiff_t>(u) * k + b * 32));
    // For T = 1, xu8 holds the signed values (see matmul_q8_vnni).
    const __m256i xs1 = xv[0];
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = wr[r] + static_cast<std::ptrdiff_t>(b) * 34;
      if (wn && (b & 1) == 0) prefetch_l2(wn[r] + static_cast<std::ptrdiff_t>(b) * 34);
      const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(*reinterpret_cast<const std::uint16_t*>(blk))));
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      if constexpr (T == 1) {
        // One token: |w| x sign(x, w) (x signed here), one integer op
        // fewer than the offset; the same exact lanes.
        __m256i p = _mm256_dpbusd_epi32(zero, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xs1, wv));
        __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[b]));
        acc[r][0] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[r][0]);
      } else {
        const __m256i ncorr = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, c128, wv));
        for (int u = 0; u < T; ++u) {
          __m256i p = _mm256_dpbusd_epi32(ncorr, xv[u], wv);
          __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[static_cast<std::ptrdiff_t>(u) * nb + b]));
          acc[r][u] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[r][u]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]);
}

FTP_AVX512 void matmul_q8_vnni(const float* x, const MatView& w, float* out, int t) {
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols), nb = k / 32;
  const auto* base = static_cast<const std::uint8_t*>(tv.data);
  thread_local QuantRows xq;
  thread_local std::vector<std::uint8_t> xu;
  quantize_rows(x, t, k, xq);
  if (t > 1) {
    xu.resize(xq.q.size());
    for (std::size_t i = 0; i < xu.size(); ++i) xu[i] = static_cast<std::uint8_t>(xq.q[i]) ^ 0x80u;
  }
  auto row_ptr = [&](std::int64_t i) { return base + ((w.r0 + i) * tv.cols + w.c0) / 32 * 34; };
  using Fn = void (*)(const std::uint8_t*, const float*, int, const std::uint8_t* const*, const std::uint8_t* const*,
                      float*, int);
  constexpr int R1 = 8, RB = 4, TB = 6;
  static constexpr auto kb = [] {
    std::array<Fn, TB + 1> a{};
    [&]<int... I>(std::integer_sequence<int, I...>) { ((a[I + 1] = block_q8_vnni<RB, I + 1>), ...); }(
        std::make_integer_sequence<int, TB>{});
    return a;
  }();
  static constexpr auto k1 = [] {
    std::array<Fn, TB + 1> a{};
    [&]<int... I>(std::integer_sequence<int, I...>) { ((a[I + 1] = block_q8_vnni<1, I + 1>), ...); }(
        std::make_integer_sequence<int, TB>{});
    return a;
  }();
  const int R = t == 1 ? R1 : RB;
  for (int i = 0; i < n;) {
    const int rows = n - i >= R ? R : 1;
    const std::uint8_t* wr[R1];
    const std::uint8_t* wn[R1];
    const bool next = i + 2 * rows <= n;
    for (int r = 0; r < rows; ++r) {
      wr[r] = row_ptr(i + r);
      if (next) wn[r] = row_ptr(i + rows + r);
    }
    const std::uint8_t* const* pn = next ? wn : nullptr;
    const auto* xs = reinterpret_cast<const std::uint8_t*>(xq.q.data());
    if (t == 1) {
      if (rows == R1) block_q8_vnni<R1, 1>(xs, xq.d.data(), k, wr, pn, out + i, n);
      else block_q8_vnni<1, 1>(xs, xq.d.data(), k, wr, pn, out + i, n);
    } else {
      for (int u = 0; u < t; u += TB) {
        int g = std::min(TB, t - u);
        (rows == RB ? kb : k1)[g]((g == 1 ? xs : xu.data()) + static_cast<std::ptrdiff_t>(u) * k,
                                  xq.d.data() + static_cast<std::ptrdiff_t>(u) * nb, k, wr, pn,
                                  out + static_cast<std::ptrdiff_t>(u) * n + i, n);
      }
    }
    i += rows;
  }
}

/// Activations 4j .. 4j + 3 of a block, in every 32-bit lane.
FTP_AVX512 inline __m512i bcast4(const std::int8_t* xb, int j) {
  // An unaligned 32-bit load that may alias the int8 values.
  using A32 = std::int32_t __attribute__((may_alias, aligned(1)));
  return _mm512_set1_epi32(*reinterpret_cast<const A32*>(xb + 4 * j));
}

/// T tokens x one group of 16 packed Q8_0 rows (PackedQ8), blocks [0, nb)
/// of `sc`/`q` (the view's first block). Per block and token: the integer
/// accumulator starts at -128 x sum(x_q) (the weights are stored + 128),
/// 8 dpbusd add the 32 products of each row exactly, then
/// acc = fma(d_w x d_x, float(int), acc) per row: each output is the sum
/// over blocks in block order whatever T, so t = 1 and any batch give
/// bit-identical results. Outputs go to out[u x ldo + lane], lanes < `lanes`.
template <int T>
FTP_AVX512 void packed_q8_group(const std::int8_t* xq, int ldx, const float* xd, const std::int32_t* xc, int ldd,
                                const std::uint16_t* sc, const std::uint8_t* q, int nb, float* out, int ldo, int lanes,
                                const std::uint16_t* sc_next, const std::uint8_t* q_next) {
  __m512 acc[T];
#pragma GCC unroll 16
  for (int u = 0; u < T; ++u) acc[u] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc + b * 16)));
    const std::uint8_t* qb = q + static_cast<std::ptrdiff_t>(b) * 512;
    if (q_next) {
      // The next group's same block into L2: one group (tens of KiB) ahead.
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) prefetch_l2(q_next + static_cast<std::ptrdiff_t>(b) * 512 + 64 * j);
      if ((b & 1) == 0) prefetch_l2(sc_next + b * 16);
    }
    __m512i w[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) w[j] = _mm512_load_si512(reinterpret_cast<const void*>(qb + 64 * j));
#pragma GCC unroll 16
    for (int u = 0; u < T; ++u) {
      const std::int8_t* xb = xq + static_cast<std::ptrdiff_t>(u) * ldx + b * 32;
      __m512i ia = _mm512_set1_epi32(xc[static_cast<std::ptrdiff_t>(u) * ldd + b]);
      if constexpr (T > 2) {
        // Batches are bound by the vector pipes: the activations' 4 bytes
        // as dpbusd's {1to16} memory operand save a broadcast each, which
        // GCC 12 does not fold from the intrinsics.
        using A32 = std::int32_t __attribute__((may_alias, aligned(1)));
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j)
          __asm__("vpdpbusd %2%{1to16%}, %1, %0"
                  : "+v"(ia)
                  : "v"(w[j]), "m"(*reinterpret_cast<const A32*>(xb + 4 * j)));
      } else {
        // Few tokens (bound by memory): two dependency chains of 4; the
        // integer sum is exact either way.
        __m512i ib = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
          ia = _mm512_dpbusd_epi32(ia, w[j], bcast4(xb, j));
          ib = _mm512_dpbusd_epi32(ib, w[j + 1], bcast4(xb, j + 1));
        }
        ia = _mm512_add_epi32(ia, ib);
      }
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(xd[static_cast<std::ptrdiff_t>(u) * ldd + b]));
      acc[u] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(ia), acc[u]);
    }
  }
  const __mmask16 m = static_cast<__mmask16>((1u << lanes) - 1u);
#pragma GCC unroll 16
  for (int u = 0; u < T; ++u) _mm512_mask_storeu_ps(out + static_cast<std::ptrdiff_t>(u) * ldo, m, acc[u]);
}

/// One token x NG whole groups at once (16 NG rows): NG weight streams in
/// flight instead of one, for batch 1, which memory bounds. Each group's
/// sums are those of packed_q8_group<1> (exact integer block dots, then the
/// same float operations in block order): the same results.
template <int NG>
FTP_AVX512 void packed_q8_groups1(const std::int8_t* xq, const float* xd, const std::int32_t* xc,
                                  const std::uint16_t* const* sc, const std::uint8_t* const* q, int nb,
                                  float* const* out, const std::uint8_t* const* pf) {
  __m512 acc[NG];
#pragma GCC unroll 8
  for (int i = 0; i < NG; ++i) acc[i] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    if (pf) {
#pragma GCC unroll 8
      for (int i = 0; i < NG; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) prefetch_l2(pf[i] + static_cast<std::ptrdiff_t>(b) * 512 + 64 * j);
    }
    const std::int8_t* xb = xq + b * 32;
    const __m512 dx = _mm512_set1_ps(xd[b]);
    __m512i ia[NG], ib[NG];
#pragma GCC unroll 8
    for (int i = 0; i < NG; ++i) {
      ia[i] = _mm512_set1_epi32(xc[b]);
      ib[i] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
      const __m512i x0 = bcast4(xb, j), x1 = bcast4(xb, j + 1);
#pragma GCC unroll 8
      for (int i = 0; i < NG; ++i) {
        const std::uint8_t* qb = q[i] + static_cast<std::ptrdiff_t>(b) * 512;
        ia[i] = _mm512_dpbusd_epi32(ia[i], _mm512_load_si512(qb + 64 * j), x0);
        ib[i] = _mm512_dpbusd_epi32(ib[i], _mm512_load_si512(qb + 64 * (j + 1)), x1);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NG; ++i) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc[i] + b * 16)));
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(_mm512_add_epi32(ia[i], ib[i])), acc[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NG; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

constexpr int kPackedTokens = 16;  // tokens per pass over a group: 16 accumulators + 8 weight vectors

FTP_AVX512 void matmul_packed512(const float* x, const PackedQ8& p, const MatView& w, float* out, int t) {
  constexpr int G = PackedQ8::kGroup;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols), nb = k / 32;
  const std::int64_t b0 = w.c0 / 32;
  thread_local QuantRows xq;
  quantize_rows(x, t, k, xq, true);
  using Fn = void (*)(const std::int8_t*, int, const float*, const std::int32_t*, int, const std::uint16_t*,
                      const std::uint8_t*, int, float*, int, int, const std::uint16_t*, const std::uint8_t*);
  static constexpr auto kn = [] {
    std::array<Fn, kPackedTokens + 1> a{};
    [&]<int... I>(std::integer_sequence<int, I...>) { ((a[I + 1] = packed_q8_group<I + 1>), ...); }(
        std::make_integer_sequence<int, kPackedTokens>{});
    return a;
  }();
  // Passes of at most 16 tokens, as even as possible (17 = 9 + 8).
  const int passes = (t + kPackedTokens - 1) / kPackedTokens;
  float part[kPackedTokens * G];
  std::int64_t g = w.r0 / G;
  if (t == 1 && g * G == w.r0) {
    // One token, bound by memory: whole groups 4 at a time (4 streams keep
    // more loads in flight than one), then the rest one by one below.
    constexpr int NG = 4;
    for (; (g + NG) * G <= w.r0 + w.rows; g += NG) {
      const bool next = (g + 2 * NG) * G <= w.r0 + w.rows;
      const std::uint16_t* sc[NG];
      const std::uint8_t* q[NG];
      const std::uint8_t* pf[NG];
      float* o[NG];
      for (int i = 0; i < NG; ++i) {
        sc[i] = p.scales(g + i) + b0 * G;
        q[i] = p.quants(g + i) + b0 * G * 32;
        pf[i] = next ? p.quants(g + NG + i) + b0 * G * 32 : nullptr;
        o[i] = out + ((g + i) * G - w.r0);
      }
      packed_q8_groups1<NG>(xq.q.data(), xq.d.data(), xq.c.data(), sc, q, nb, o, next ? pf : nullptr);
    }
  }
  for (; g * G < w.r0 + w.rows; ++g) {
    const std::int64_t first = std::max<std::int64_t>(g * G, w.r0);
    const std::int64_t last = std::min<std::int64_t>((g + 1) * G, w.r0 + w.rows);
    const bool whole = first == g * G && last == (g + 1) * G;
    const std::uint16_t* sc = p.scales(g) + b0 * G;
    const std::uint8_t* q = p.quants(g) + b0 * G * 32;
    const bool next = (g + 1) * G < w.r0 + w.rows;
    const std::uint16_t* sc_next = next ? p.scales(g + 1) + b0 * G : nullptr;
    const std::uint8_t* q_next = next ? p.quants(g + 1) + b0 * G * 32 : nullptr;
    for (int pass = 0, u = 0; pass < passes; ++pass) {
      const int g_t = (t - u + (passes - pass) - 1) / (passes - pass);
      const std::int8_t* xu = xq.q.data() + static_cast<std::ptrdiff_t>(u) * k;
      const float* du = xq.d.data() + static_cast<std::ptrdiff_t>(u) * nb;
      const std::int32_t* cu = xq.c.data() + static_cast<std::ptrdiff_t>(u) * nb;
      float* ou = out + static_cast<std::ptrdiff_t>(u) * n + (first - w.r0);
      if (whole) {
        kn[g_t](xu, k, du, cu, nb, sc, q, nb, ou, n, G, sc_next, q_next);
      } else {
        // A group the view cuts: all 16 rows into `part`, its rows out.
        kn[g_t](xu, k, du, cu, nb, sc, q, nb, part, G, G, sc_next, q_next);
        for (int v = 0; v < g_t; ++v)
          std::copy(part + v * G + (first - g * G), part + v * G + (last - g * G),
                    ou + static_cast<std::ptrdiff_t>(v) * n);
      }
      u += g_t;
    }
  }
}

// ---------------------------------------------------------------------------
// Element-wise operations of the forward pass, 16 floats at a time.

/// e^x, 16 lanes: Cody-Waite reduction by ln 2 and Cephes' degree-6
/// polynomial for expf (within 2 ulp of the exact value), then 2^n by
/// vscalefps, which handles underflow to 0 and denormals; x is clamped to
/// [-88.38, 88.38] (e^x overflows float32 beyond).
FTP_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f)), _mm512_set1_ps(88.3762626647949f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

/// Lanes [i, n) of a tail: the mask of the last, partial vector.
FTP_AVX512 inline __mmask16 tail_mask(std::size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

FTP_AVX512 void silu_mul512(float* g, const float* u, std::size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (std::size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    const __m512 r = _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(g + i, m, r);
  }
}

/// Sixteen partial sums, lane l over elements l, l + 16, ..., then the
/// lanes added in a fixed order: the same result for the same n on every
/// call.
FTP_AVX512 void softmax512(float* x, int n) {
  const std::size_t N = static_cast<std::size_t>(n);
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (std::size_t i = 0; i < N; i += 16)
    mx = _mm512_mask_max_ps(mx, tail_mask(N - i), mx, _mm512_maskz_loadu_ps(tail_mask(N - i), x + i));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (std::size_t i = 0; i < N; i += 16) {
    const __mmask16 k = tail_mask(N - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  const __m512 s = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
  for (std::size_t i = 0; i < N; i += 16) {
    const __mmask16 k = tail_mask(N - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), s));
  }
}

FTP_AVX512 void rmsnorm512(const float* x, const float* w, float* out, int n, float eps) {
  const std::size_t N = static_cast<std::size_t>(n);
  __m512 ss = _mm512_setzero_ps();
  for (std::size_t i = 0; i < N; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(tail_mask(N - i), x + i);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const float r = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(n) + eps);
  const __m512 rv = _mm512_set1_ps(r);
  for (std::size_t i = 0; i < N; i += 16) {
    const __mmask16 k = tail_mask(N - i);
    _mm512_mask_storeu_ps(out + i, k,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + i), _mm512_mul_ps(rv, _mm512_maskz_loadu_ps(k, x + i))));
  }
}
/// Scores of the positions [b x B, b x B + m) of one K page (transposed):
/// lane s sums q[d] x K[d][s] over d in order.
FTP_AVX512 void page_scores512(const float* q, const float* kt, int m, int hd, int B, float scale, float* scores) {
  for (int s0 = 0; s0 < m; s0 += 16) {
    const __mmask16 k = tail_mask(static_cast<std::size_t>(m - s0));
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < hd; ++d)
      acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_maskz_loadu_ps(k, kt + static_cast<std::ptrdiff_t>(d) * B + s0), acc);
    _mm512_mask_storeu_ps(scores + s0, k, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
  }
}

/// out[d] += a x v[d] for one position, 16 dimensions at a time.
FTP_AVX512 void axpy512(float a, const float* v, float* out, int hd) {
  const __m512 av = _mm512_set1_ps(a);
  for (int d = 0; d < hd; d += 16) {
    const __mmask16 k = tail_mask(static_cast<std::size_t>(hd - d));
    _mm512_mask_storeu_ps(out + d, k, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(k, v + d), _mm512_maskz_loadu_ps(k, out + d)));
  }
}
#pragma GCC diagnostic pop
#endif

}  // namespace

namespace {
// FTP_MATMUL=reference|avx2 in the environment (A/B runs of engine-bench),
// or set_matmul_kernels (the tests).
std::atomic<int> g_kernels{[] {
  const char* e = std::getenv("FTP_MATMUL");
  const std::string_view v = e ? e : "";
  return static_cast<int>(v == "reference" ? MatmulKernels::reference
                          : v == "avx2"    ? MatmulKernels::avx2
                                           : MatmulKernels::best);
}()};
}  // namespace

#if FTP_X86
namespace {
/// The AVX-512 element-wise operations: where the CPU has them and the
/// kernels are the best (FTP_MATMUL=avx2 or reference, set_matmul_kernels,
/// take the scalar ones too: A/B runs, and the tests reach both).
bool wide_elementwise() {
  return have_avx512() && g_kernels.load(std::memory_order_relaxed) == static_cast<int>(MatmulKernels::best);
}
}  // namespace
#endif

void set_matmul_kernels(MatmulKernels k) { g_kernels.store(static_cast<int>(k), std::memory_order_relaxed); }
MatmulKernels matmul_kernels() { return static_cast<MatmulKernels>(g_kernels.load(std::memory_order_relaxed)); }

void matmul_reference(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  if (tv.dtype == model::DType::f32) {
    const float* base = static_cast<const float*>(tv.data) + w.r0 * tv.cols + w.c0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, n, k, 1.0f, x, k, base, static_cast<int>(tv.cols), 0.0f,
                out, n);
    return;
  }
  if (tv.dtype != model::DType::q8_0 && model::dtype_block(tv.dtype) > 1) {
    // The other block types take the activations as llama.cpp quantizes them.
    thread_local std::vector<float> xq;
    xq.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k));
    quantize_activations(tv.dtype, x, t, k, xq.data());
    return matmul_tiles(xq.data(), w, out, t);
  }
  matmul_tiles(x, w, out, t);
}

void matmul(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const model::TensorView& tv = *w.t;
#if FTP_X86
  const MatmulKernels which = matmul_kernels();
  if (tv.dtype != model::DType::f32 && w.cols > 0 && which != MatmulKernels::reference && have_avx2()) {
    const bool wide = which == MatmulKernels::best && have_avx512();
    switch (tv.dtype) {
      case model::DType::f16:
        if (wide) return matmul_fused512<model::DType::f16>(x, w, out, t);
        return matmul_fused<model::DType::f16>(x, w, out, t);
      case model::DType::bf16:
        if (wide) return matmul_fused512<model::DType::bf16>(x, w, out, t);
        return matmul_fused<model::DType::bf16>(x, w, out, t);
      case model::DType::q8_0:
        // Segments that start on a block and hold whole blocks; others
        // (odd TP splits of tiny models) take the portable path.
        if (w.c0 % 32 == 0 && w.cols % 32 == 0 && tv.cols % 32 == 0)
          return wide ? matmul_q8_vnni(x, w, out, t) : matmul_q8(x, w, out, t);
        break;
      case model::DType::f32: break;
      default:  // the other block types: decoded a few rows at a time, float activations
        return wide ? matmul_quant512(x, w, out, t) : matmul_quant(x, w, out, t);
    }
  }
#endif
  matmul_reference(x, w, out, t);
}

bool packed_kernels_available() {
#if FTP_X86
  return matmul_kernels() == MatmulKernels::best && have_avx512();
#else
  return false;
#endif
}

void matmul_packed(const float* x, const PackedQ8& p, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
#if FTP_X86
  if (packed_kernels_available() && w.c0 % 32 == 0 && w.cols % 32 == 0 && w.cols > 0 && p.cols == w.t->cols &&
      p.rows == w.t->rows)
    return matmul_packed512(x, p, w, out, t);
#endif
  matmul(x, w, out, t);
}

void rope(float* v, int n_heads, int head_dim, int n_rot, int pos, float theta, model::RopeType type,
          const float* freq_factors) {
  // The angles depend on the pair only: computed once for every head.
  const int pairs = n_rot / 2;
  thread_local std::vector<float> cs;
  cs.resize(static_cast<std::size_t>(2 * pairs));
  for (int j = 0; j < pairs; ++j) {
    float freq = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(n_rot));
    if (freq_factors) freq /= freq_factors[j];
    const float a = static_cast<float>(pos) * freq;
    cs[static_cast<std::size_t>(2 * j)] = std::cos(a);
    cs[static_cast<std::size_t>(2 * j) + 1] = std::sin(a);
  }
  // Pair j is (p[j x step], p[j x step + other]).
  const bool neox = type == model::RopeType::neox;
  const int step = neox ? 1 : 2, other = neox ? pairs : 1;
  for (int h = 0; h < n_heads; ++h) {
    float* p = v + static_cast<std::ptrdiff_t>(h) * head_dim;
    for (int j = 0; j < pairs; ++j) {
      const float c = cs[static_cast<std::size_t>(2 * j)], s = cs[static_cast<std::size_t>(2 * j) + 1];
      float& x0 = p[j * step];
      float& x1 = p[j * step + other];
      const float v0 = x0, v1 = x1;
      x0 = v0 * c - v1 * s;
      x1 = v0 * s + v1 * c;
    }
  }
}

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
#if FTP_X86
  if (wide_elementwise()) return rmsnorm512(x, w, out, n, eps);
#endif
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  ss = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

void attention_head(const float* q, const float* const* kp, const float* const* vp, int n, int hd, int B, float scale,
                    float* scores, float* out) {
  const int pages = (n + B - 1) / B;
#if FTP_X86
  const bool wide = wide_elementwise();
#else
  const bool wide = false;
#endif
  for (int b = 0; b < pages; ++b) {
    const int m = std::min(B, n - b * B);
    float* sc = scores + static_cast<std::ptrdiff_t>(b) * B;
#if FTP_X86
    if (wide) {
      page_scores512(q, kp[b], m, hd, B, scale, sc);
      continue;
    }
#endif
    for (int s = 0; s < m; ++s) {
      float acc = 0;
      for (int d = 0; d < hd; ++d) acc += q[d] * kp[b][static_cast<std::ptrdiff_t>(d) * B + s];
      sc[s] = acc * scale;
    }
  }
  softmax(scores, n);
  std::fill_n(out, hd, 0.0f);
  for (int p = 0; p < n; ++p) {
    const float* v = vp[p / B] + static_cast<std::ptrdiff_t>(p % B) * hd;
#if FTP_X86
    if (wide) {
      axpy512(scores[p], v, out, hd);
      continue;
    }
#endif
    for (int d = 0; d < hd; ++d) out[d] += scores[p] * v[d];
  }
}

void silu_mul(float* g, const float* u, std::size_t n) {
#if FTP_X86
  if (wide_elementwise()) return silu_mul512(g, u, n);
#endif
  for (std::size_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

#if FTP_X86
FTP_AVX2 void widen_f16_f16c(const std::uint16_t* h, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) out[i] = model::quant::f16_to_f32(h[i]);
}
#endif

void widen_f16(const std::uint16_t* h, float* out, std::size_t n) {
#if FTP_X86
  if (have_avx2()) return widen_f16_f16c(h, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = model::quant::f16_to_f32(h[i]);
}

void softmax(float* x, int n) {
#if FTP_X86
  if (wide_elementwise()) return softmax512(x, n);
#endif
  float m = *std::max_element(x, x + n);
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] /= sum;
}

void blas_single_threaded() { openblas_set_num_threads(1); }

}  // namespace ftp::engine::ops
