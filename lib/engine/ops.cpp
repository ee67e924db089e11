// SPDX-License-Identifier: Apache-2.0
#include "engine/ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace ftp::engine::ops {

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  ss = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

void matmul(const float* x, const MatView& w, float* out, int t) {
  if (t == 0 || w.rows == 0) return;
  const model::TensorView& tv = *w.t;
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  if (tv.dtype == model::DType::f32) {
    const float* base = static_cast<const float*>(tv.data) + w.r0 * tv.cols + w.c0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, n, k, 1.0f, x, k, base, static_cast<int>(tv.cols), 0.0f,
                out, n);
    return;
  }
  constexpr int kTile = 64;
  thread_local std::vector<float> tile, row;
  tile.resize(static_cast<std::size_t>(kTile) * k);
  // Q8_0 converts whole blocks of 32: start at the block holding c0.
  const std::int64_t lead = tv.dtype == model::DType::q8_0 ? w.c0 % 32 : 0;
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

void rope(float* v, int n_heads, int head_dim, int n_rot, int pos, float theta) {
  for (int h = 0; h < n_heads; ++h) {
    float* p = v + static_cast<std::ptrdiff_t>(h) * head_dim;
    for (int i = 0; i + 1 < n_rot; i += 2) {
      float freq = 1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(n_rot));
      float a = static_cast<float>(pos) * freq;
      float c = std::cos(a), s = std::sin(a);
      float v0 = p[i], v1 = p[i + 1];
      p[i] = v0 * c - v1 * s;
      p[i + 1] = v0 * s + v1 * c;
    }
  }
}

void silu_mul(float* g, const float* u, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void softmax(float* x, int n) {
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
