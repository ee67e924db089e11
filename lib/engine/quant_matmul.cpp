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

/// w x x for 8 weights into acc: w = float(q) * d - m as the block decoder
/// computes them (a product, then a difference: the same bits).
FTP_AVX2 inline __m256 fma_weights(__m256i q, __m256 d, __m256 m, const float* x, __m256 acc) {
  const __m256 w = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m);
  return _mm256_fmadd_ps(w, _mm256_loadu_ps(x), acc);
}

/// One token against R rows of Q4_0 / Q4_K decoded in registers: the
/// weights are those model::quant::dequantize writes, and each lands in the
/// accumulator and in the order dots<R> would use for the decoded row
/// (columns 16m..16m+7 in a[r][0], 16m+8..16m+15 in a[r][1], m rising), so
/// the result is bit-identical to decoding into the buffer and dotting:
/// t = 1 (this path) and t > 1 (the buffer) agree. Whole blocks only.
template <int R>
FTP_AVX2 void q4_0_rows(const float* x, const std::uint8_t* const* rows, std::int64_t nb, float* out) {
  __m256 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + b * 18;
      const __m256 d = _mm256_set1_ps(half_at(blk));
      for (int l = 0; l < 16; l += 8) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + l)));
        const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(v, low), eight);
        const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight);
        a[r][l / 8] = fma_weights(lo, d, zero, xb + l, a[r][l / 8]);
        a[r][l / 8] = fma_weights(hi, d, zero, xb + 16 + l, a[r][l / 8]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(a[r][0], a[r][1]));
}

template <int R>
FTP_AVX2 void q4_k_rows(const float* x, const std::uint8_t* const* rows, std::int64_t nb, float* out) {
  __m256 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi32(0x0f);
  for (std::int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 256;
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* blk = rows[r] + b * 144;
      const float d = half_at(blk), dmin = half_at(blk + 2);
      const std::uint8_t* sc = blk + 4;
      for (int c = 0; c < 4; ++c) {
        // The 6-bit scale and min of groups 2c and 2c + 1 (model/quant.cpp's scale_min_k4).
        int s1, m1, s2, m2;
        const int j = 2 * c;
        if (j < 4) {
          s1 = sc[j] & 63, m1 = sc[j + 4] & 63;
          s2 = sc[j + 1] & 63, m2 = sc[j + 5] & 63;
        } else {
          s1 = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4), m1 = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
          s2 = (sc[j + 5] & 0x0f) | ((sc[j - 3] >> 6) << 4), m2 = (sc[j + 5] >> 4) | ((sc[j + 1] >> 6) << 4);
        }
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(s1)), n1 = _mm256_set1_ps(dmin * static_cast<float>(m1));
        const __m256 d2 = _mm256_set1_ps(d * static_cast<float>(s2)), n2 = _mm256_set1_ps(dmin * static_cast<float>(m2));
        const std::uint8_t* q = blk + 16 + 32 * c;
        const float* xc = xb + 64 * c;
        __m256i v[4];
        for (int l = 0; l < 4; ++l) v[l] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * l)));
        for (int l = 0; l < 4; ++l) a[r][l & 1] = fma_weights(_mm256_and_si256(v[l], low), d1, n1, xc + 8 * l, a[r][l & 1]);
        for (int l = 0; l < 4; ++l) a[r][l & 1] = fma_weights(_mm256_srli_epi32(v[l], 4), d2, n2, xc + 32 + 8 * l, a[r][l & 1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(a[r][0], a[r][1]));
}

using RowsFn = void (*)(const float*, const std::uint8_t* const*, std::int64_t, float*);

/// The register-decoding kernels for one token, where there is one.
bool fused_rows(model::DType t, RowsFn& four, RowsFn& one) {
  switch (t) {
    case model::DType::q4_0: four = q4_0_rows<4>, one = q4_0_rows<1>; return true;
    case model::DType::q4_k: four = q4_k_rows<4>, one = q4_k_rows<1>; return true;
    default: return false;
  }
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
  x = quantized_activations(w, x, t);
  RowsFn four = nullptr, one = nullptr;
  if (t == 1 && d.lead == 0 && k % d.b.elems == 0 && fused_rows(w.t->dtype, four, one)) {
    // One token (decode at batch 1, bound by memory): no buffer round trip.
    const auto* base = static_cast<const std::uint8_t*>(w.t->data) + static_cast<std::size_t>(d.b0) * d.b.bytes;
    const std::uint8_t* rows[kRows];
    for (std::int64_t i = 0; i < n; i += kRows) {
      const int r = static_cast<int>(std::min<std::int64_t>(kRows, n - i));
      for (int j = 0; j < r; ++j) rows[j] = base + static_cast<std::size_t>(w.r0 + i + j) * d.row_bytes;
      if (r == kRows) {
        four(x, rows, d.nblk, out + i);
      } else {
        for (int j = 0; j < r; ++j) one(x, rows + j, d.nblk, out + i + j);
      }
    }
    return;
  }
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
