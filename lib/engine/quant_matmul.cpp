// SPDX-License-Identifier: Apache-2.0
#include "engine/quant_matmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

/// Q4_0 with the activations as Q8_0 integers, llama.cpp's scheme: per
/// block of 32, the int8 dot of the weights' (q - 8) and the activations'
/// quants (maddubs on |w| and the sign-adjusted x, exact in int32), scaled
/// by d_w x d_x in float. R rows x T tokens; each output sums its blocks in
/// order in 8 lanes whatever T, so a token's result does not depend on the
/// batch. Views of whole blocks only.
template <int R, int T>
FTP_AVX2 void q4_0_int(const std::int8_t* xq, const float* xd, int k, const std::uint8_t* const* rows, float* out,
                       int ldo) {
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
/// by up to 3; fn(the rows' first blocks, rows, first token, tokens, first row).
template <class Fn>
void for_each_tile(const MatView& w, const Decoder& d, int t, Fn&& fn) {
  const int n = static_cast<int>(w.rows);
  const auto* base = static_cast<const std::uint8_t*>(w.t->data) + static_cast<std::size_t>(d.b0) * d.b.bytes;
  for (int i = 0; i < n;) {
    const int rows = n - i >= 4 ? 4 : 1;
    const std::uint8_t* wr[4];
    for (int r = 0; r < rows; ++r) wr[r] = base + static_cast<std::size_t>(w.r0 + i + r) * d.row_bytes;
    for (int u = 0; u < t; u += 3) fn(wr, rows, u, std::min(3, t - u), i);
    i += rows;
  }
}

/// Q4_0 over whole blocks: rows by 4 (then 1), tokens by up to 3.
void matmul_q4_0_int(const float* x, const MatView& w, const Decoder& d, float* out, int t) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  thread_local Q8Ints a;
  q8_0_ints(x, t, k, a);
  using Fn = void (*)(const std::int8_t*, const float*, int, const std::uint8_t* const*, float*, int);
  static constexpr Fn k4[4] = {nullptr, q4_0_int<4, 1>, q4_0_int<4, 2>, q4_0_int<4, 3>};
  static constexpr Fn k1[4] = {nullptr, q4_0_int<1, 1>, q4_0_int<1, 2>, q4_0_int<1, 3>};
  const int nb = k / 32;
  for_each_tile(w, d, t, [&](const std::uint8_t* const* wr, int rows, int u, int g, int i) {
    (rows == 4 ? k4 : k1)[g](a.q.data() + static_cast<std::ptrdiff_t>(u) * k, a.d.data() + static_cast<std::ptrdiff_t>(u) * nb,
                             k, wr, out + static_cast<std::ptrdiff_t>(u) * n + i, n);
  });
}

/// The activations of t tokens as Q8_K integers, the values q8_k_values
/// gives (q x d): q [t][k], d [t][k / 256] in float, and the sums of each
/// 32 quants [t][k / 32] in int16 (at most 32 x 127; llama.cpp's bsums
/// pairwise), for Q4_K's mins.
struct Q8KInts {
  std::vector<std::int8_t> q;
  std::vector<float> d;
  std::vector<std::int16_t> bsums32;
};

void q8_k_ints(const float* x, int t, int k, Q8KInts& a) {
  const int nb = k / 256;
  a.q.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k));
  a.d.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(nb));
  a.bsums32.resize(static_cast<std::size_t>(t) * static_cast<std::size_t>(k / 32));
  for (int u = 0; u < t; ++u)
    for (int b = 0; b < nb; ++b) {
      const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(u) * k + b * 256;
      const float* p = x + o;
      float amax = 0, max = 0;
      for (int j = 0; j < 256; ++j)
        if (std::fabs(p[j]) > amax) amax = std::fabs(p[j]), max = p[j];
      std::int8_t* q = a.q.data() + o;
      if (amax == 0.0f) {
        std::fill_n(q, 256, std::int8_t{0});
        a.d[static_cast<std::size_t>(u) * nb + b] = 0.0f;
      } else {
        const float iscale = -127.0f / max;
        for (int j = 0; j < 256; ++j) q[j] = static_cast<std::int8_t>(std::min(127.0f, std::nearbyint(iscale * p[j])));
        a.d[static_cast<std::size_t>(u) * nb + b] = 1.0f / iscale;
      }
      std::int16_t* b32 = a.bsums32.data() + o / 32;
      for (int g = 0; g < 8; ++g) {
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += q[32 * g + j];
        b32[g] = static_cast<std::int16_t>(sum);
      }
    }
}

/// The 6-bit scale and min of group j of a Q4_K/Q5_K block (model/quant.cpp's scale_min_k4).
inline void scale_min_k4(int j, const std::uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// Q4_K with the activations as Q8_K integers, llama.cpp's
/// vec_dot_q4_K_q8_K: per super-block of 256, the int8 dots of each group
/// of 32 nibbles with the activations' quants (maddubs, exact in int16),
/// times the group's 6-bit scale (madd, exact in int32), summed in int32
/// and scaled by d_w x d_x in float; the mins as d_min x d_x x the integer
/// sum of min x the group's quant sum (bsums32, a vector madd). R rows x T tokens; each
/// output adds its blocks in order whatever T, so a token's result does not
/// depend on the batch. Views of whole blocks only.
template <int R, int T>
FTP_AVX2 void q4_k_int(const Q8KInts& a, int u0, int k, const std::uint8_t* const* rows, float* out, int ldo) {
  __m256 acc[R][T];
  float accm[R][T];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) acc[r][u] = _mm256_setzero_ps(), accm[r][u] = 0.0f;
  const int nb = k / 256;
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + static_cast<std::ptrdiff_t>(b) * 144;
      const float d = half_at(blk), dmin = half_at(blk + 2);
      int sc[8], mn[8];
      for (int j = 0; j < 8; ++j) scale_min_k4(j, blk + 4, sc[j], mn[j]);
      const __m128i mins = _mm_setr_epi16(static_cast<short>(mn[0]), static_cast<short>(mn[1]), static_cast<short>(mn[2]),
                                          static_cast<short>(mn[3]), static_cast<short>(mn[4]), static_cast<short>(mn[5]),
                                          static_cast<short>(mn[6]), static_cast<short>(mn[7]));
      __m256i sumi[T];
      for (int u = 0; u < T; ++u) sumi[u] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
        const __m256i lo = _mm256_and_si256(q4, low), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low);
        const __m256i s1 = _mm256_set1_epi16(static_cast<short>(sc[2 * c])), s2 = _mm256_set1_epi16(static_cast<short>(sc[2 * c + 1]));
        for (int u = 0; u < T; ++u) {
          const std::int8_t* xq = a.q.data() + static_cast<std::ptrdiff_t>(u0 + u) * k + b * 256 + 64 * c;
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
          const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
          const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s1);
          const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s2);
          sumi[u] = _mm256_add_epi32(sumi[u], _mm256_add_epi32(p0, p1));
        }
      }
      for (int u = 0; u < T; ++u) {
        const std::size_t xb = static_cast<std::size_t>(u0 + u) * static_cast<std::size_t>(nb) + static_cast<std::size_t>(b);
        const float dx = a.d[xb];
        // sum_j min_j x (the quant sum of group j), exact in int32.
        __m128i m = _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.bsums32.data() + xb * 8)));
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0x4e));
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xb1));
        const std::int32_t summ = _mm_cvtsi128_si32(m);
        acc[r][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[u]), acc[r][u]);
        accm[r][u] += dmin * dx * static_cast<float>(summ);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < T; ++u) out[static_cast<std::ptrdiff_t>(u) * ldo + r] = hsum(acc[r][u]) - accm[r][u];
}

/// Q4_K over whole super-blocks: rows by 4 (then 1), tokens by up to 3.
void matmul_q4_k_int(const float* x, const MatView& w, const Decoder& d, float* out, int t) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  thread_local Q8KInts a;
  q8_k_ints(x, t, k, a);
  using Fn = void (*)(const Q8KInts&, int, int, const std::uint8_t* const*, float*, int);
  static constexpr Fn four[4] = {nullptr, q4_k_int<4, 1>, q4_k_int<4, 2>, q4_k_int<4, 3>};
  static constexpr Fn one[4] = {nullptr, q4_k_int<1, 1>, q4_k_int<1, 2>, q4_k_int<1, 3>};
  for_each_tile(w, d, t, [&](const std::uint8_t* const* wr, int rows, int u, int g, int i) {
    (rows == 4 ? four : one)[g](a, u, k, wr, out + static_cast<std::ptrdiff_t>(u) * n + i, n);
  });
}
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
  if (w.t->dtype == model::DType::q4_k && d.lead == 0 && k % 256 == 0) return matmul_q4_k_int(x, w, d, out, t);
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
#else
void matmul_quant(const float* x, const MatView& w, float* out, int t) { matmul_quant_scalar(x, w, out, t); }
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
