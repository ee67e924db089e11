// SPDX-License-Identifier: Apache-2.0
#include "engine/quant_matmul.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "model/quant.hpp"

namespace ftp::engine::ops {

namespace {

constexpr int kRows = 4;  // rows decoded and dotted together

/// Where a view's blocks lie, and decode(): rows [i, i + rows) of the view
/// decoded into buf (row r at r x ld floats), the view's first column at
/// `lead` in each decoded row.
struct Decoder {
  const model::TensorView& tv;
  const MatView& w;
  model::quant::BlockShape b;
  std::int64_t b0 = 0;       // first block of the view in a row
  std::int64_t nblk = 0;     // blocks the view touches in a row
  std::int64_t lead = 0;     // view columns start this far into block b0
  std::size_t row_bytes = 0; // bytes per tensor row
  std::int64_t ld = 0;       // floats per decoded row

  explicit Decoder(const MatView& v)
      : tv(*v.t), w(v), b(model::quant::block_shape(v.t->dtype)) {
    b0 = w.c0 / b.elems;
    lead = w.c0 - b0 * b.elems;
    nblk = (lead + w.cols + b.elems - 1) / b.elems;
    row_bytes = static_cast<std::size_t>(tv.cols / b.elems) * static_cast<std::size_t>(b.bytes);
    ld = nblk * b.elems;
  }
  void decode(std::int64_t i, int rows, float* buf) const {
    const auto* base = static_cast<const std::uint8_t*>(tv.data);
    for (int r = 0; r < rows; ++r) {
      const std::uint8_t* src = base + static_cast<std::size_t>(w.r0 + i + r) * row_bytes +
                                static_cast<std::size_t>(b0) * static_cast<std::size_t>(b.bytes);
      model::quant::dequantize(tv.dtype, src, nblk, buf + r * ld);
    }
  }
};

std::vector<float>& buffer(std::int64_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<std::size_t>(floats)) buf.resize(static_cast<std::size_t>(floats));
  return buf;
}

/// One block of n activations as Q8_0/Q8_1 values.
void q8_0_values(const float* x, int n, float* out) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = model::quant::f16_to_f32(model::quant::f32_to_f16(amax / 127.0f));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < n; ++j) out[j] = std::nearbyint(x[j] * id) * d;
}

/// One block of n activations as Q8_K values.
void q8_k_values(const float* x, int n, float* out) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  if (amax == 0.0f) {
    std::fill_n(out, n, 0.0f);
    return;
  }
  const float iscale = -127.0f / max, d = 1.0f / iscale;
  for (int j = 0; j < n; ++j) out[j] = std::min(127.0f, std::nearbyint(iscale * x[j])) * d;
}

#if defined(__x86_64__)
#define FTP_AVX2 __attribute__((target("avx2,fma,f16c")))

FTP_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// R rows against one token: two accumulators per row (columns 16m..16m+7
/// and 16m+8..16m+15), one more 8-wide step, then the scalar tail.
template <int R>
FTP_AVX2 void dots(const float* x, const float* const* wr, int k, float* out, std::ptrdiff_t ldo) {
  __m256 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  int j = 0;
  for (; j + 16 <= k; j += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
    for (int r = 0; r < R; ++r) {
      a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(wr[r] + j), x0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(wr[r] + j + 8), x1, a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 s = _mm256_add_ps(a[r][0], a[r][1]);
    int jj = j;
    if (jj + 8 <= k) {
      s = _mm256_fmadd_ps(_mm256_loadu_ps(wr[r] + jj), _mm256_loadu_ps(x + jj), s);
      jj += 8;
    }
    float v = hsum(s);
    for (; jj < k; ++jj) v += wr[r][jj] * x[jj];
    out[r * ldo] = v;
  }
}

FTP_AVX2 inline float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/// Prefetches `lines` cache lines from p into the L2 (prefetcht1). Into
/// the L1 (prefetcht0) the prefetches hold the L1's few miss buffers: a
/// batch-1 Q4_K_M step's products streamed at 8-10 GB/s on one Zen 4 core
/// with t0, 16-19 with t1 (docs/benchmarks.md, 2026-12-03, "prefetch into
/// the L2"); the kernels' own loads then hit the L2.
template <int lines>
FTP_AVX2 inline void prefetch(const std::uint8_t* p) {
  for (int l = 0; l < lines; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + 64 * l), _MM_HINT_T1);
}

/// Q4_0 with the activations as Q8_0 integers, llama.cpp's scheme: per
/// block of 32, the int8 dot of the weights' (q - 8) and the activations'
/// quants (maddubs on |w| and the sign-adjusted x, exact in int32), scaled
/// by d_w x d_x in float. R rows x T tokens; each output sums its blocks in
/// order in 8 lanes whatever T, so a token's result does not depend on the
/// batch. Views of whole blocks only.
template <int R, int T>
FTP_AVX2 void q4_0_int(const std::int8_t* xq, const float* xd, int k, const std::uint8_t* const* rows, float* out,
                       int ldo, std::ptrdiff_t pf) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  const int nb = k / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i low = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi8(8);
  for (int b = 0; b < nb; ++b) {
    __m256i xv[T];
    __m256 dx[T];
    for (int u = 0; u < T; ++u) {
      xv[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + static_cast<std::ptrdiff_t>(u) * k + b * 32));
      dx[u] = _mm256_set1_ps(xd[static_cast<std::ptrdiff_t>(u) * nb + b]);
    }
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 18;
      if (pf && (b & 3) == 0) prefetch<2>(blk + pf);  // 72 bytes every 4 blocks
      const __m256 dw = _mm256_set1_ps(half_at(blk));
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      // Weights 0..15 from the low nibbles, 16..31 from the high ones, minus 8.
      const __m256i w = _mm256_sub_epi8(
          _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low), _mm_and_si128(qs, low)), eight);
      const __m256i aw = _mm256_sign_epi8(w, w);
      for (int u = 0; u < T; ++u) {
        const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[u], w));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[r][u] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[u]), p, acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]);
}

/// The activations of t tokens as Q8_0 integers and f16-rounded scales, the
/// values q8_0_values gives (q x d).
struct Q8Ints {
  std::vector<std::int8_t> q;  // [t][k]
  std::vector<float> d;        // [t][k / 32]
};

void q8_0_ints(const float* x, int t, int k, Q8Ints& a) {
  const int nb = k / 32;
  a.q.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k));
  a.d.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(nb));
  for (int u = 0; u < t; ++u)
    for (int b = 0; b < nb; ++b) {
      const float* p = x + static_cast<std::ptrdiff_t>(u) * k + b * 32;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(p[j]));
      a.d[static_cast<std::size_t>(u) * nb + b] = model::quant::f16_to_f32(model::quant::f32_to_f16(amax / 127.0f));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (int j = 0; j < 32; ++j)
        a.q[static_cast<std::size_t>(u) * k + b * 32 + j] = static_cast<std::int8_t>(std::nearbyint(p[j] * id));
    }
}

/// The tiles of the integer kernels: rows of the view by 4 (then 1), tokens
/// by up to 3; fn(the rows' first blocks, rows, first token, tokens, first
/// row, prefetch). prefetch: bytes from each row to the same place in the
/// rows kPrefetchTiles tiles on, for the first tokens of a tile of 4 that
/// has a whole tile of 4 there, else 0. A kernel that prefetches there as
/// it reads keeps the next rows' loads in flight while it computes: the
/// hardware prefetcher alone, following 4 streams, left a single-thread
/// Q4_K product at ~5 GB/s where it computes at ~10 from the L3 and the
/// memory reads at ~11 (AVX2 EPYC VM); with it, 7.5-8.3. Two tiles ahead
/// (into the L2) measured ~10 % above one on Zen 4, three and four no
/// better than two.
inline constexpr int kPrefetchTiles = 2;
template <class Fn>
void for_each_tile(const MatView& w, const Decoder& d, int t, Fn&& fn) {
  const int n = static_cast<int>(w.rows);
  const auto* base = static_cast<const std::uint8_t*>(w.t->data) + static_cast<std::size_t>(d.b0) * d.b.bytes;
  for (int i = 0; i < n;) {
    const int rows = n - i >= 4 ? 4 : 1;
    const std::uint8_t* wr[4];
    for (int r = 0; r < rows; ++r) wr[r] = base + static_cast<std::size_t>(w.r0 + i + r) * d.row_bytes;
    const std::ptrdiff_t next =
        rows == 4 && i + 4 * (kPrefetchTiles + 1) <= n ? static_cast<std::ptrdiff_t>(4 * kPrefetchTiles * d.row_bytes) : 0;
    for (int u = 0; u < t; u += 3) fn(wr, rows, u, std::min(3, t - u), i, u == 0 ? next : 0);
    i += rows;
  }
}


/// Q4_0 over whole blocks: rows by 4 (then 1), tokens by up to 3.
void matmul_q4_0_int(const float* x, const MatView& w, const Decoder& d, float* out, int t) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  thread_local Q8Ints a;
  q8_0_ints(x, t, k, a);
  using Fn = void (*)(const std::int8_t*, const float*, int, const std::uint8_t* const*, float*, int, std::ptrdiff_t);
  static constexpr Fn k4[4] = {nullptr, q4_0_int<4, 1>, q4_0_int<4, 2>, q4_0_int<4, 3>};
  static constexpr Fn k1[4] = {nullptr, q4_0_int<1, 1>, q4_0_int<1, 2>, q4_0_int<1, 3>};
  const int nb = k / 32;
  for_each_tile(w, d, t, [&](const std::uint8_t* const* wr, int rows, int u, int g, int i, std::ptrdiff_t pf) {
    (rows == 4 ? k4 : k1)[g](a.q.data() + static_cast<std::ptrdiff_t>(u) * k, a.d.data() + static_cast<std::ptrdiff_t>(u) * nb,
                             k, wr, out + static_cast<std::ptrdiff_t>(u) * n + i, n, pf);
  });
}

/// The activations of t tokens as Q8_K integers, the values q8_k_values
/// gives (q x d): q [t][k], d [t][k / 256] in float, and the sums of each
/// 16 quants [t][k / 16] (llama.cpp's bsums, for Q6_K's -32 offset) and of
/// each 32 [t][k / 32] (pairs of those, for Q4_K's mins), in int16 (at
/// most 32 x 127).
struct Q8KInts {
  std::vector<std::int8_t> q;
  std::vector<float> d;
  std::vector<std::int16_t> bsums16, bsums32;
};

FTP_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

/// q8_k_values' integers, 8 lanes at a time: the same float products and
/// the same rounding (vroundps to nearest even is nearbyint in the default
/// mode), so the same quants and scales as the scalar formula.
FTP_AVX2 void q8_k_ints(const float* x, int t, int k, Q8KInts& a) {
  const int nb = k / 256;
  a.q.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k));
  a.d.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(nb));
  a.bsums16.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k / 16));
  a.bsums32.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k / 32));
  const __m256 sign = _mm256_set1_ps(-0.0f), top = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int u = 0; u < t; ++u)
    for (int b = 0; b < nb; ++b) {
      const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(u) * k + b * 256;
      const float* p = x + o;
      __m256 vmax = _mm256_setzero_ps();
      for (int j = 0; j < 256; j += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(p + j)));
      const float amax = hmax(vmax);
      std::int8_t* q = a.q.data() + o;
      if (!(amax > 0.0f)) {
        std::fill_n(q, 256, std::int8_t{0});
        a.d[static_cast<std::size_t>(u) * nb + b] = 0.0f;
      } else {
        // The first value of largest magnitude gives the sign, as in the scalar scan.
        int j0 = 0;
        while (std::fabs(p[j0]) != amax) ++j0;
        const float iscale = -127.0f / p[j0];
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < 256; j += 32) {
          __m256i v[4];
          for (int c = 0; c < 4; ++c) {
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(p + j + 8 * c)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v[c] = _mm256_cvtps_epi32(_mm256_min_ps(r, top));
          }
          const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm256_permutevar8x32_epi32(w, order));
        }
        a.d[static_cast<std::size_t>(u) * nb + b] = 1.0f / iscale;
      }
      std::int16_t* b16 = a.bsums16.data() + o / 16;
      std::int16_t* b32 = a.bsums32.data() + o / 32;
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += q[16 * g + j];
        b16[g] = static_cast<std::int16_t>(sum);
      }
      for (int g = 0; g < 8; ++g) b32[g] = static_cast<std::int16_t>(b16[2 * g] + b16[2 * g + 1]);
    }
}

/// pshufb controls that broadcast int16 word w of each 128-bit lane to the
/// whole lane: kWord[w].
alignas(32) constexpr std::uint8_t kWord[8][32] = {
#define FTP_W(w) {2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, \
                  2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, \
                  2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, \
                  2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1, 2 * (w), 2 * (w) + 1}
    FTP_W(0), FTP_W(1), FTP_W(2), FTP_W(3), FTP_W(4), FTP_W(5), FTP_W(6), FTP_W(7)
#undef FTP_W
};

/// pshufb controls for Q6_K's chunks of 32 weights (two groups of 16):
/// word 2i in the low lane, word 2i + 1 in the high lane: kPair[i].
alignas(32) constexpr std::uint8_t kPair[4][32] = {
#define FTP_P(i) {4 * (i), 4 * (i) + 1, 4 * (i), 4 * (i) + 1, 4 * (i), 4 * (i) + 1, 4 * (i), 4 * (i) + 1, \
                  4 * (i), 4 * (i) + 1, 4 * (i), 4 * (i) + 1, 4 * (i), 4 * (i) + 1, 4 * (i), 4 * (i) + 1, \
                  4 * (i) + 2, 4 * (i) + 3, 4 * (i) + 2, 4 * (i) + 3, 4 * (i) + 2, 4 * (i) + 3, 4 * (i) + 2, 4 * (i) + 3, \
                  4 * (i) + 2, 4 * (i) + 3, 4 * (i) + 2, 4 * (i) + 3, 4 * (i) + 2, 4 * (i) + 3, 4 * (i) + 2, 4 * (i) + 3}
    FTP_P(0), FTP_P(1), FTP_P(2), FTP_P(3)
#undef FTP_P
};

FTP_AVX2 inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

/// The eight 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K
/// block from its 12 bytes, 32 bits at a time (what scale_min_k4 gives for
/// groups 0..7): groups 0-3 in the low 6 bits of bytes 0-3 (scales) and
/// 4-7 (mins); groups 4-7 in the nibbles of bytes 8-11, their high 2 bits
/// the top bits of bytes 0-3 (scales) and 4-7 (mins).
FTP_AVX2 inline __m128i scales_mins_k4(const std::uint8_t* s) {
  std::uint32_t v[3];
  std::memcpy(v, s, 12);
  const std::uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
  const std::uint32_t sc_lo = v[0] & six, mn_lo = v[1] & six;
  const std::uint32_t sc_hi = (v[2] & nib) | (((v[0] >> 6) & two) << 4);
  const std::uint32_t mn_hi = ((v[2] >> 4) & nib) | (((v[1] >> 6) & two) << 4);
  return _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), static_cast<int>(mn_lo),
                        static_cast<int>(mn_hi));
}

/// Q4_K with the activations as Q8_K integers, llama.cpp's
/// vec_dot_q4_K_q8_K: per super-block of 256, the int8 dots of each group
/// of 32 nibbles with the activations' quants (maddubs, exact in int16),
/// times the group's 6-bit scale (madd, exact in int32), summed in int32
/// and scaled by d_w x d_x in float; the mins as d_min x d_x x the integer
/// sums of min x the group's quant sum (bsums32, a vector madd), kept in
/// four float lanes. R rows x T tokens; each output adds its blocks in
/// order whatever T, so a token's result does not depend on the batch.
/// Views of whole blocks only.
template <int R, int T>
FTP_AVX2 void q4_k_int(const Q8KInts& a, int u0, int k, const std::uint8_t* const* rows, float* out, int ldo,
                       std::ptrdiff_t pf) {
  __m256 acc[R][T];
  __m128 accm[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps(), accm[r][u] = _mm_setzero_ps();
  const int nb = k / 256;
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 144;
      if (pf) prefetch<3>(blk + pf);
      const float d = half_at(blk), dmin = half_at(blk + 2);
      const __m256i sm = _mm256_cvtepu8_epi16(scales_mins_k4(blk + 4));  // 8 scales | 8 mins, int16
      const __m256i scl = _mm256_permute2x128_si256(sm, sm, 0x00);
      const __m128i mins = _mm256_extracti128_si256(sm, 1);
      __m256i sumi[T];
      for (int u = 0; u < T; ++u) sumi[u] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i q4 = load256(blk + 16 + 32 * c);
        const __m256i lo = _mm256_and_si256(q4, low), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low);
        const __m256i s1 = _mm256_shuffle_epi8(scl, load256(kWord[2 * c]));
        const __m256i s2 = _mm256_shuffle_epi8(scl, load256(kWord[2 * c + 1]));
        for (int u = 0; u < T; ++u) {
          const std::int8_t* xq = a.q.data() + static_cast<std::ptrdiff_t>(u0 + u) * k + b * 256 + 64 * c;
          const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(xq)), s1);
          const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(xq + 32)), s2);
          sumi[u] = _mm256_add_epi32(sumi[u], _mm256_add_epi32(p0, p1));
        }
      }
      for (int u = 0; u < T; ++u) {
        const std::size_t xb = static_cast<std::size_t>(u0 + u) * static_cast<std::size_t>(nb) + static_cast<std::size_t>(b);
        const float dx = a.d[xb];
        // min_j x (the quant sum of group j), exact in int32, four lanes of pairs.
        const __m128i m = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.bsums32.data() + xb * 8)));
        acc[r][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[u]), acc[r][u]);
        accm[r][u] = _mm_fmadd_ps(_mm_set1_ps(dmin * dx), _mm_cvtepi32_ps(m), accm[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) {
      __m128 m = accm[r][u];
      m = _mm_add_ps(m, _mm_movehl_ps(m, m));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]) - _mm_cvtss_f32(m);
    }
}

/// Q6_K with the activations as Q8_K integers, llama.cpp's
/// vec_dot_q6_K_q8_K: the 6-bit weights unsigned (0..63, before the -32),
/// their int8 dots per group of 16 with the activations' quants (maddubs,
/// exact in int16: at most 2 x 63 x 127), times the group's int8 scale
/// (madd), summed in int32; the -32 is subtracted as 32 x the integer sum
/// of scale x the group's quant sum (bsums16), so the integer is exactly
/// sum scale x (q - 32) x x_q; then scaled by d_w x d_x in float. R rows x
/// T tokens, blocks in order whatever T (batch-independent). Views of
/// whole blocks only.
template <int R, int T>
FTP_AVX2 void q6_k_int(const Q8KInts& a, int u0, int k, const std::uint8_t* const* rows, float* out, int ldo,
                       std::ptrdiff_t pf) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  const int nb = k / 256;
  const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  for (int b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 210;
      if (pf) prefetch<4>(blk + pf);
      const float d = half_at(blk + 208);
      // The 16 scales as int16: groups 0-7 (the first 128 weights) in the low lane.
      const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      __m256i sumi[T];
      for (int u = 0; u < T; ++u) sumi[u] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i sc = h == 0 ? _mm256_permute2x128_si256(s16, s16, 0x00) : _mm256_permute2x128_si256(s16, s16, 0x11);
        const __m256i a0 = load256(blk + 64 * h), a1 = load256(blk + 64 * h + 32), hb = load256(blk + 128 + 32 * h);
        // Weights 128h + 32i + l, i = 0..3: low nibbles of a0, a1, high nibbles
        // of a0, a1; their high 2 bits at bits 2i, 2i + 1 of hb byte l.
        __m256i w[4];
        w[0] = _mm256_or_si256(_mm256_and_si256(a0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        w[1] = _mm256_or_si256(_mm256_and_si256(a1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a0, 4), m4), _mm256_and_si256(hb, m30));
        w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a1, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        for (int i = 0; i < 4; ++i) {
          const __m256i s = _mm256_shuffle_epi8(sc, load256(kPair[i]));
          for (int u = 0; u < T; ++u) {
            const std::int8_t* xq = a.q.data() + static_cast<std::ptrdiff_t>(u0 + u) * k + b * 256 + 128 * h + 32 * i;
            sumi[u] = _mm256_add_epi32(sumi[u], _mm256_madd_epi16(_mm256_maddubs_epi16(w[i], load256(xq)), s));
          }
        }
      }
      for (int u = 0; u < T; ++u) {
        const std::size_t xb = static_cast<std::size_t>(u0 + u) * static_cast<std::size_t>(nb) + static_cast<std::size_t>(b);
        const __m256i corr = _mm256_madd_epi16(s16, load256(a.bsums16.data() + xb * 16));
        const __m256i s = _mm256_sub_epi32(sumi[u], _mm256_slli_epi32(corr, 5));
        acc[r][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d[xb]), _mm256_cvtepi32_ps(s), acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]);
}

/// A K-quant (Q4_K, Q6_K) over whole super-blocks: the activations as
/// Q8_K integers once, then rows by 4 (then 1), tokens by up to 3.
template <template <int, int> class K>
void matmul_k_int(const float* x, const MatView& w, const Decoder& d, float* out, int t) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  thread_local Q8KInts a;
  q8_k_ints(x, t, k, a);
  using Fn = void (*)(const Q8KInts&, int, int, const std::uint8_t* const*, float*, int, std::ptrdiff_t);
  static constexpr Fn four[4] = {nullptr, K<4, 1>::run, K<4, 2>::run, K<4, 3>::run};
  static constexpr Fn one[4] = {nullptr, K<1, 1>::run, K<1, 2>::run, K<1, 3>::run};
  for_each_tile(w, d, t, [&](const std::uint8_t* const* wr, int rows, int u, int g, int i, std::ptrdiff_t pf) {
    (rows == 4 ? four : one)[g](a, u, k, wr, out + static_cast<std::ptrdiff_t>(u) * n + i, n, pf);
  });
}

template <int R, int T>
struct Q4KInt {
  static void run(const Q8KInts& a, int u0, int k, const std::uint8_t* const* rows, float* out, int ldo, std::ptrdiff_t pf) {
    q4_k_int<R, T>(a, u0, k, rows, out, ldo, pf);
  }
};
template <int R, int T>
struct Q6KInt {
  static void run(const Q8KInts& a, int u0, int k, const std::uint8_t* const* rows, float* out, int ldo, std::ptrdiff_t pf) {
    q6_k_int<R, T>(a, u0, k, rows, out, ldo, pf);
  }
};

// ---------------------------------------------------------------------------
// AVX-512 (BW, VL, VNNI) forms of the Q4_0, Q4_K and Q6_K kernels, where
// the CPU has them (ops::matmul checks). Each block's integer lanes are
// exactly those of q4_0_int / q4_k_int / q6_k_int -- a 512-bit vector
// holds two of the AVX2 kernel's 256-bit chunks, its halves added before
// the float step; Q4_0's dpbusd starts from the activations' -8 offset --
// and the float steps are the same, so the outputs are bit for bit the
// AVX2 kernels' (Matmul.IntegerKernelsAreBitIdenticalAcrossTheX86Families).
// What changes is the instructions per block: dpwssd / dpbusd in place of
// madd + add or the sign tricks, 64 weights a vector for the K-quants, the
// activations stored once per call in the order the weight vectors need,
// Q4_K's 12 scale bytes decoded in vector lanes. Zen 4 runs a 512-bit
// operation as two 256-bit halves, so what counts there is the number of
// operations, not their width: measured on one Zen 4 core from L2
// (interleaved with the AVX2 kernels, best of 3000 products of 256 x 2048),
// Q4_0 x1.5, Q6_K x1.2, Q4_K x1.0-1.1.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define FTP_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))

/// The Q8_K quants of t tokens with each super-block's eight chunks of 32
/// in the order `order` (chunk c of the result is chunk order[c] of a.q).
void permute_chunks(const Q8KInts& a, int t, int k, const int (&order)[8], std::vector<std::int8_t>& out) {
  out.resize(a.q.size());
  const std::size_t n = static_cast<std::size_t>(t) * static_cast<std::size_t>(k);
  for (std::size_t o = 0; o < n; o += 256)
    for (int c = 0; c < 8; ++c) std::memcpy(out.data() + o + 32 * c, a.q.data() + o + 32 * order[c], 32);
}

/// Q4_K's chunks for q4_k_512: the vector of bytes qs[64j, 64j + 64) holds
/// groups 4j (low nibbles, first 32 bytes), 4j + 1 (high nibbles, first
/// 32), 4j + 2 (low, last 32) and 4j + 3 (high, last 32); its low nibbles
/// meet chunks 4j and 4j + 2, its high nibbles chunks 4j + 1 and 4j + 3.
constexpr int kQ4KOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
/// Q6_K's for q6_k_512: weight vector i holds weights 32i + l (l < 32, the
/// first half of the super-block) and 128 + 32i + l.
constexpr int kQ6KOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/// scales_mins_k4 in vector lanes: the same 16 bytes (scales 0-7 | mins 0-7).
FTP_AVX512 inline __m128i scales_mins_k4_v(const std::uint8_t* s) {
  // Bytes 12-15 of the load are the first quants: never used.
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));  // v0 v2 v1 v2
  const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // v0 v0 v1 v1
  const __m128i lo = _mm_and_si128(b, _mm_set1_epi32(0x3f3f3f3f));
  const __m128i nib = _mm_and_si128(_mm_srlv_epi32(b, _mm_setr_epi32(0, 0, 0, 4)), _mm_set1_epi32(0x0f0f0f0f));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(c, 2), _mm_set1_epi32(0x30303030));
  return _mm_blend_epi32(lo, _mm_or_si128(nib, top), 0b1010);
}

/// pshufb controls over four copies of eight int16 scales: in 128-bit lane
/// L, word w[L] in every pair of bytes.
constexpr std::array<std::uint8_t, 64> lane_words(int w0, int w1, int w2, int w3) {
  std::array<std::uint8_t, 64> c{};
  const int w[4] = {w0, w1, w2, w3};
  for (int i = 0; i < 64; ++i) c[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(2 * w[i / 16] + (i & 1));
  return c;
}
/// The same over four copies of eight unsigned scale bytes: byte w[L]
/// zero-extended to 16 bits (a control byte 0x80 gives 0).
constexpr std::array<std::uint8_t, 64> lane_bytes(int w0, int w1, int w2, int w3) {
  std::array<std::uint8_t, 64> c{};
  const int w[4] = {w0, w1, w2, w3};
  for (int i = 0; i < 64; ++i) c[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i & 1 ? 0x80 : w[i / 16]);
  return c;
}
alignas(64) constexpr std::array<std::uint8_t, 64> kQ4KWords[4] = {lane_bytes(0, 0, 2, 2), lane_bytes(1, 1, 3, 3),
                                                                  lane_bytes(4, 4, 6, 6), lane_bytes(5, 5, 7, 7)};
alignas(64) constexpr std::array<std::uint8_t, 64> kQ6KWords[4] = {lane_words(0, 1, 0, 1), lane_words(2, 3, 2, 3),
                                                                  lane_words(4, 5, 4, 5), lane_words(6, 7, 6, 7)};

FTP_AVX512 inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
FTP_AVX512 inline __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/// A super-block's integer dots: the four weight vectors (unsigned) with
/// 256 activation quants in their order, each pair of products times its
/// int16 scale, summed in int32 and folded to the AVX2 kernels' 8 lanes.
FTP_AVX512 inline __m256i dots_512(const __m512i (&w)[4], const __m512i (&s)[4], const std::int8_t* xq) {
        __m512i p0 = _mm512_madd_epi16(_mm512_maddubs_epi16(w[0], load512(xq)), s[0]);
        __m512i p1 = _mm512_madd_epi16(_mm512_maddubs_epi16(w[1], load512(xq + 64)), s[1]);
        p0 = _mm512_dpwssd_epi32(p0, _mm512_maddubs_epi16(w[2], load512(xq + 128)), s[2]);
        p1 = _mm512_dpwssd_epi32(p1, _mm512_maddubs_epi16(w[3], load512(xq + 192)), s[3]);
  return fold(_mm512_add_epi32(p0, p1));
}

/// q4_k_int with 512-bit vectors and VNNI; xp: the quants in kQ4KOrder.
/// The float step packs what q4_k_int keeps in two accumulators into one
/// vector: lanes 0-7 the groups' sums (x d x d_x), lanes 8-11 the mins'
/// (x d_min x d_x), each lane the same operation as there.
template <int R, int T>
FTP_AVX512 void q4_k_512(const Q8KInts& a, const std::int8_t* xp, int u0, int k, const std::uint8_t* const* rows,
                         float* out, int ldo, std::ptrdiff_t pf) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm512_setzero_ps();
  const int nb = k / 256;
  const __m512i low = _mm512_set1_epi8(0x0f);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2);
  __m512i ctl[4];
  for (int i = 0; i < 4; ++i) ctl[i] = load512(kQ4KWords[i].data());
  for (int b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 144;
      if (pf) prefetch<3>(blk + pf);
      // d, d_min as floats (lanes 0, 1).
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*reinterpret_cast<const std::int32_t*>(blk)));
      const __m128i sm = scales_mins_k4_v(blk + 4);  // 8 scales | 8 mins, bytes
      const __m512i scl = _mm512_broadcast_i32x4(sm);
      const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
      const __m512i q0 = load512(blk + 16), q1 = load512(blk + 80);
      const __m512i w[4] = {_mm512_and_si512(q0, low), _mm512_and_si512(_mm512_srli_epi16(q0, 4), low),
                            _mm512_and_si512(q1, low), _mm512_and_si512(_mm512_srli_epi16(q1, 4), low)};
      __m512i s[4];
      for (int i = 0; i < 4; ++i) s[i] = _mm512_shuffle_epi8(scl, ctl[i]);
      for (int u = 0; u < T; ++u) {
        const std::int8_t* xq = xp + static_cast<std::ptrdiff_t>(u0 + u) * k + b * 256;
        const std::size_t xb = static_cast<std::size_t>(u0 + u) * static_cast<std::size_t>(nb) + static_cast<std::size_t>(b);
        // min_j x (the quant sum of group j), exact in int32, four lanes of pairs.
        const __m128i m = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.bsums32.data() + xb * 8)));
        const __m512i sumi = _mm512_inserti32x4(_mm512_castsi256_si512(dots_512(w, s, xq)), m, 2);
        // d x d_x in lanes 0-7, d_min x d_x in 8-11 (12-15 unused).
        const __m512 f = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dd, _mm_set1_ps(a.d[xb]))));
        acc[r][u] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sumi), acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) {
      __m128 m = _mm512_extractf32x4_ps(acc[r][u], 2);
      m = _mm_add_ps(m, _mm_movehl_ps(m, m));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(_mm512_castps512_ps256(acc[r][u])) - _mm_cvtss_f32(m);
    }
}

/// q6_k_int with 512-bit vectors and VNNI; xp: the quants in kQ6KOrder.
template <int R, int T>
FTP_AVX512 void q6_k_512(const Q8KInts& a, const std::int8_t* xp, int u0, int k, const std::uint8_t* const* rows,
                         float* out, int ldo, std::ptrdiff_t pf) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  const int nb = k / 256;
  const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
  const __m512i spread = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
  __m512i ctl[4];
  for (int i = 0; i < 4; ++i) ctl[i] = load512(kQ6KWords[i].data());
  for (int b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 210;
      if (pf) prefetch<4>(blk + pf);
      const float d = half_at(blk + 208);
      const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      // Scales 0-7 in lanes 0 and 1, 8-15 in lanes 2 and 3.
      const __m512i sc = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(s16));
      // ql[0, 32) | ql[64, 96) and ql[32, 64) | ql[96, 128): the two halves' a0 and a1.
      const __m512i z0 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(blk)), load256(blk + 64), 1);
      const __m512i z1 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(blk + 32)), load256(blk + 96), 1);
      const __m512i hh = load512(blk + 128);
      // (a & 0x0f) | (h & 0x30): ternary logic 0xf8 is A | (B & C).
      const __m512i w[4] = {
          _mm512_ternarylogic_epi32(_mm512_and_si512(z0, m4), _mm512_slli_epi16(hh, 4), m30, 0xf8),
          _mm512_ternarylogic_epi32(_mm512_and_si512(z1, m4), _mm512_slli_epi16(hh, 2), m30, 0xf8),
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(z0, 4), m4), hh, m30, 0xf8),
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(z1, 4), m4), _mm512_srli_epi16(hh, 2), m30, 0xf8)};
      __m512i s[4];
      for (int i = 0; i < 4; ++i) s[i] = _mm512_shuffle_epi8(sc, ctl[i]);
      for (int u = 0; u < T; ++u) {
        const std::int8_t* xq = xp + static_cast<std::ptrdiff_t>(u0 + u) * k + b * 256;
        const __m256i sumi = dots_512(w, s, xq);
        const std::size_t xb = static_cast<std::size_t>(u0 + u) * static_cast<std::size_t>(nb) + static_cast<std::size_t>(b);
        const __m256i corr = _mm256_madd_epi16(s16, load256(a.bsums16.data() + xb * 16));
        const __m256i sv = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        acc[r][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d[xb]), _mm256_cvtepi32_ps(sv), acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]);
}

/// The first 16-bit word at `offset` of each of the R rows, in words 0..R-1
/// (the rest 0). _mm_insert_epi16 takes its word index as a constant: the
/// index sequence unrolls the R inserts (a loop counter is one only for GCC
/// after unrolling; clang refuses it). Stores and one 128-bit load instead
/// would stall on store forwarding.
template <int R>
inline __m128i block_halves(const std::uint8_t* const* rows, std::ptrdiff_t offset) {
  __m128i h = _mm_setzero_si128();
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((h = _mm_insert_epi16(h, [&] {
        std::uint16_t v;
        std::memcpy(&v, rows[I] + offset, 2);
        return static_cast<short>(v);
      }(), I)),
     ...);
  }(std::make_integer_sequence<int, R>{});
  return h;
}

/// q4_0_int with AVX-512 VL and VNNI: the nibbles unsigned (0..15, a
/// broadcast load of the 16 bytes shifted by 0 and 4 per 64-bit lane) into
/// dpbusd with the activations' int8 quants, the accumulator started at
/// ncorr (-8 x the sum of each lane's 4 quants), so each block's 8 int32
/// lanes are exactly q4_0_int's (sum of (q - 8) x_q over the lane's 4
/// weights); then the same float steps. About half q4_0_int's
/// instructions per block: no sign tricks, no madd, the scale broadcast
/// by the load.
template <int R, int T>
FTP_AVX512 void q4_0_vl(const std::int8_t* xq, const float* xd, const std::int32_t* ncorr, int k,
                        const std::uint8_t* const* rows, float* out, int ldo, std::ptrdiff_t pf) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps();
  const int nb = k / 32;
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i shift = _mm256_setr_epi64x(0, 0, 4, 4);
  for (int b = 0; b < nb; ++b) {
    // The R rows' scales d_w x d_x, each the product q4_0_int forms in its
    // lanes: one conversion of the R halves and one multiply per token.
    const __m128i h4 = block_halves<R>(rows, static_cast<std::ptrdiff_t>(b) * 18);
    const __m256 dw4 = _mm256_castps128_ps256(_mm_cvtph_ps(h4));
    __m256 dd[T];
    for (int u = 0; u < T; ++u) dd[u] = _mm256_mul_ps(dw4, _mm256_set1_ps(xd[static_cast<std::ptrdiff_t>(u) * nb + b]));
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 18;
      if (pf && (b & 3) == 0) prefetch<2>(blk + pf);  // 72 bytes every 4 blocks
      // Weights 0..15 (low nibbles) in the low lane, 16..31 (high) in the high lane.
      const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
      const __m256i w = _mm256_and_si256(_mm256_srlv_epi64(q, shift), low);
      const __m256i lane = _mm256_set1_epi32(r);
      for (int u = 0; u < T; ++u) {
        const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(u) * nb + b;
        const __m256i p = _mm256_dpbusd_epi32(load256(ncorr + 8 * o), w,
                                              load256(xq + static_cast<std::ptrdiff_t>(u) * k + b * 32));
        acc[r][u] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd[u], lane), _mm256_cvtepi32_ps(p), acc[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]);
}

/// matmul_q4_0_int with q4_0_vl.
FTP_AVX512 void matmul_q4_0_vl(const float* x, const MatView& w, const Decoder& d, float* out, int t) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  thread_local Q8Ints a;
  thread_local std::vector<std::int32_t> ncorr;
  q8_0_ints(x, t, k, a);
  const int nb = k / 32;
  ncorr.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(nb) * 8);
  const __m256i eight = _mm256_set1_epi8(8);
  for (std::size_t o = 0; o < static_cast<std::size_t>(t) * static_cast<std::size_t>(nb); ++o) {
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, load256(a.q.data() + 32 * o));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ncorr.data() + 8 * o), _mm256_sub_epi32(_mm256_setzero_si256(), s));
  }
  using Fn = void (*)(const std::int8_t*, const float*, const std::int32_t*, int, const std::uint8_t* const*, float*, int,
                      std::ptrdiff_t);
  static constexpr Fn k4[4] = {nullptr, q4_0_vl<4, 1>, q4_0_vl<4, 2>, q4_0_vl<4, 3>};
  static constexpr Fn k1[4] = {nullptr, q4_0_vl<1, 1>, q4_0_vl<1, 2>, q4_0_vl<1, 3>};
  for_each_tile(w, d, t, [&](const std::uint8_t* const* wr, int rows, int u, int g, int i, std::ptrdiff_t pf) {
    const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(u) * nb;
    (rows == 4 ? k4 : k1)[g](a.q.data() + static_cast<std::ptrdiff_t>(u) * k, a.d.data() + o, ncorr.data() + 8 * o, k, wr,
                             out + static_cast<std::ptrdiff_t>(u) * n + i, n, pf);
  });
}

/// matmul_k_int with the 512-bit kernels.
template <template <int, int> class K>
void matmul_k_512(const float* x, const MatView& w, const Decoder& d, float* out, int t) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  thread_local Q8KInts a;
  thread_local std::vector<std::int8_t> xp;
  q8_k_ints(x, t, k, a);
  permute_chunks(a, t, k, K<1, 1>::order, xp);
  using Fn = void (*)(const Q8KInts&, const std::int8_t*, int, int, const std::uint8_t* const*, float*, int, std::ptrdiff_t);
  static constexpr Fn four[4] = {nullptr, K<4, 1>::run, K<4, 2>::run, K<4, 3>::run};
  static constexpr Fn one[4] = {nullptr, K<1, 1>::run, K<1, 2>::run, K<1, 3>::run};
  for_each_tile(w, d, t, [&](const std::uint8_t* const* wr, int rows, int u, int g, int i, std::ptrdiff_t pf) {
    (rows == 4 ? four : one)[g](a, xp.data(), u, k, wr, out + static_cast<std::ptrdiff_t>(u) * n + i, n, pf);
  });
}

template <int R, int T>
struct Q4K512 {
  static constexpr const int (&order)[8] = kQ4KOrder;
  static void run(const Q8KInts& a, const std::int8_t* xp, int u0, int k, const std::uint8_t* const* rows, float* out,
                  int ldo, std::ptrdiff_t pf) {
    q4_k_512<R, T>(a, xp, u0, k, rows, out, ldo, pf);
  }
};
template <int R, int T>
struct Q6K512 {
  static constexpr const int (&order)[8] = kQ6KOrder;
  static void run(const Q8KInts& a, const std::int8_t* xp, int u0, int k, const std::uint8_t* const* rows, float* out,
                  int ldo, std::ptrdiff_t pf) {
    q6_k_512<R, T>(a, xp, u0, k, rows, out, ldo, pf);
  }
};

#pragma GCC diagnostic pop
#endif

const float* quantized_activations(const MatView& w, const float* x, int t) {
  thread_local std::vector<float> xq;
  const int k = static_cast<int>(w.cols);
  xq.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k));
  quantize_activations(w.t->dtype, x, t, k, xq.data());
  return xq.data();
}

}  // namespace

void quantize_activations(model::DType w, const float* x, int t, int k, float* out) {
  const int B = model::dtype_block(w);
  const bool k_quant = B == 256;
  for (int u = 0; u < t; ++u)
    for (int j = 0; j < k; j += B) {
      const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(u) * k + j;
      const int n = std::min(B, k - j);
      if (k_quant) q8_k_values(x + o, n, out + o);
      else q8_0_values(x + o, n, out + o);
    }
}

#if defined(__x86_64__)
void matmul_quant(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const Decoder d(w);
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  if (w.t->dtype == model::DType::q4_0 && d.lead == 0 && k % 32 == 0) return matmul_q4_0_int(x, w, d, out, t);
  if (w.t->dtype == model::DType::q4_k && d.lead == 0 && k % 256 == 0) return matmul_k_int<Q4KInt>(x, w, d, out, t);
  if (w.t->dtype == model::DType::q6_k && d.lead == 0 && k % 256 == 0) return matmul_k_int<Q6KInt>(x, w, d, out, t);
  x = quantized_activations(w, x, t);
  float* buf = buffer(kRows * d.ld).data();
  for (std::int64_t i = 0; i < n; i += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, n - i));
    d.decode(i, rows, buf);
    const float* wr[kRows];
    for (int r = 0; r < rows; ++r) wr[r] = buf + r * d.ld + d.lead;
    for (int u = 0; u < t; ++u) {
      const float* xu = x + static_cast<std::ptrdiff_t>(u) * k;
      float* ou = out + static_cast<std::ptrdiff_t>(u) * n + i;
      if (rows == kRows) {
        dots<kRows>(xu, wr, k, ou, 1);
      } else {
        for (int r = 0; r < rows; ++r) dots<1>(xu, wr + r, k, ou + r, 1);
      }
    }
  }
}

void matmul_quant512(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const Decoder d(w);
  const std::int64_t k = w.cols;
  if (w.t->dtype == model::DType::q4_0 && d.lead == 0 && k % 32 == 0) return matmul_q4_0_vl(x, w, d, out, t);
  if (d.lead == 0 && k % 256 == 0) {
    if (w.t->dtype == model::DType::q4_k) return matmul_k_512<Q4K512>(x, w, d, out, t);
    if (w.t->dtype == model::DType::q6_k) return matmul_k_512<Q6K512>(x, w, d, out, t);
  }
  matmul_quant(x, w, out, t);
}
#else
void matmul_quant(const float* x, const MatView& w, float* out, int t) { matmul_quant_scalar(x, w, out, t); }
void matmul_quant512(const float* x, const MatView& w, float* out, int t) { matmul_quant_scalar(x, w, out, t); }
#endif

void matmul_quant_scalar(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const Decoder d(w);
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  x = quantized_activations(w, x, t);
  float* buf = buffer(d.ld).data();
  for (std::int64_t i = 0; i < n; ++i) {
    d.decode(i, 1, buf);
    const float* wr = buf + d.lead;
    for (int u = 0; u < t; ++u) {
      const float* xu = x + static_cast<std::ptrdiff_t>(u) * k;
      float v = 0;
      for (int j = 0; j < k; ++j) v += wr[j] * xu[j];
      out[static_cast<std::ptrdiff_t>(u) * n + i] = v;
    }
  }
}

}  // namespace ftp::engine::ops
