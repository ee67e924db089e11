// SPDX-License-Identifier: Apache-2.0
#include "sim/calibrate.hpp"

#include <array>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace ftp::sim {

namespace {

constexpr int kTerms = 5;  // layer overhead, GEMM, attention, memory, rows
constexpr double kFree = 1e9;

std::array<double, kTerms> regressors(const plan::ModelShape& m, const plan::GroupPerf& g, const plan::StepWork& w) {
  const plan::StageSpan span{m.n_layers, true, true};
  const double p = plan::stage_compute_params(m, span);
  const double flop_s = g.tp * g.tflop_s * 1e12;
  const double bytes = p * m.bytes_per_param / g.tp + w.kv_positions * m.n_layers * m.kv_bytes_per_token_layer(g.tp);
  return {double(m.n_layers), 2.0 * p * w.tokens / flop_s,
          4.0 * w.attention_pairs * m.n_heads * m.head_dim * m.n_layers / flop_s, bytes / (g.gb_s * 1e9), w.logit_rows};
}

// Least squares over the active terms (normal equations, Gaussian elimination).
std::array<double, kTerms> solve(const std::vector<std::array<double, kTerms>>& x, const std::vector<double>& y,
                                 const std::array<bool, kTerms>& active) {
  std::array<std::array<double, kTerms + 1>, kTerms> a{};
  for (std::size_t r = 0; r < x.size(); ++r)
    for (int i = 0; i < kTerms; ++i) {
      if (!active[i]) continue;
      for (int j = 0; j < kTerms; ++j)
        if (active[j]) a[i][j] += x[r][i] * x[r][j];
      a[i][kTerms] += x[r][i] * y[r];
    }
  for (int i = 0; i < kTerms; ++i)
    if (!active[i]) a[i][i] = 1;
  for (int c = 0; c < kTerms; ++c) {
    int piv = c;
    for (int r = c + 1; r < kTerms; ++r)
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    std::swap(a[c], a[piv]);
    if (std::abs(a[c][c]) < 1e-300) continue;
    for (int r = 0; r < kTerms; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= kTerms; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::array<double, kTerms> out{};
  for (int i = 0; i < kTerms; ++i) out[i] = active[i] && std::abs(a[i][i]) > 1e-300 ? a[i][kTerms] / a[i][i] : 0;
  return out;
}

}  // namespace

plan::Calibration calibrate(const plan::ModelShape& shape, const plan::GroupPerf& perf,
                            const std::vector<StepSample>& samples) {
  if (samples.size() < kTerms)
    throw InputError("calibration: " + std::to_string(samples.size()) + " samples, at least " + std::to_string(kTerms) +
                     " needed");
  if (!(perf.tflop_s > 0) || !(perf.gb_s > 0)) throw InputError("calibration: the device's tflop_s and gb_s must be positive");
  std::vector<std::array<double, kTerms>> x;
  std::vector<double> y;
  for (const auto& s : samples) {
    if (!(s.seconds > 0)) continue;
    auto r = regressors(shape, perf, s.work);
    for (auto& v : r) v /= s.seconds;  // relative error
    x.push_back(r);
    y.push_back(1.0);
  }
  std::array<bool, kTerms> active{true, true, true, true, true};
  std::array<double, kTerms> coef{};
  for (int round = 0; round < kTerms; ++round) {
    coef = solve(x, y, active);
    int worst = -1;
    for (int i = 0; i < kTerms; ++i)
      if (active[i] && coef[i] < 0 && (worst < 0 || coef[i] < coef[worst])) worst = i;
    if (worst < 0) break;
    active[worst] = false;
  }
  plan::Calibration c;
  c.overlap = false;
  c.layer_overhead_s = active[0] ? coef[0] : 0;
  c.compute_efficiency = active[1] && coef[1] > 0 ? 1.0 / coef[1] : kFree;
  c.attention_efficiency = active[2] && coef[2] > 0 ? 1.0 / coef[2] : kFree;
  c.memory_efficiency = active[3] && coef[3] > 0 ? 1.0 / coef[3] : kFree;
  c.row_overhead_s = active[4] ? coef[4] : 0;
  return c;
}

double calibration_rms_error(const plan::ModelShape& shape, const plan::GroupPerf& perf, const plan::Calibration& c,
                             const std::vector<StepSample>& samples) {
  const plan::StageSpan span{shape.n_layers, true, true};
  double sum = 0;
  int n = 0;
  for (const auto& s : samples) {
    if (!(s.seconds > 0)) continue;
    const double e = plan::step_time_s(shape, span, perf, s.work, c) / s.seconds - 1.0;
    sum += e * e;
    ++n;
  }
  return n ? std::sqrt(sum / n) : 0;
}

}  // namespace ftp::sim
