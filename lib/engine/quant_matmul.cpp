// SPDX-License-Identifier: Apache-2.0
#include "engine/quant_matmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "model/quant.hpp"

namespace ftp::engine::ops {

namespace {

constexpr int kRows = 4;  // rows decoded and dotted together

/// The rows [i, i + rows) of the view decoded into buf (row r at r x ld);
/// returns the offset of the view's first column in each decoded row.
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
void fake_q8_0(const float* x, int n, float* out) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = model::quant::f16_to_f32(model::quant::f32_to_f16(amax / 127.0f));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < n; ++j) out[j] = std::nearbyint(x[j] * id) * d;
}

/// One block of n activations as Q8_K values.
void fake_q8_k(const float* x, int n, float* out) {
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
#define FTP_AVX2 __attribute__((target("avx2,fma")))

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
      if (k_quant) fake_q8_k(x + o, n, out + o);
      else fake_q8_0(x + o, n, out + o);
    }
}

#if defined(__x86_64__)
void matmul_quant(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const Decoder d(w);
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
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
