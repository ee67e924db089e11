// SPDX-License-Identifier: Apache-2.0
#include "sim/calibrate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace ftp::sim {

namespace {

// layer overhead, GEMM, attention, weight reads, rows, kernel passes, KV reads
constexpr int kTerms = 7;
constexpr double kTileGain = 0.01;  // the share of the error a row tile must remove to be kept
using Vec = std::array<double, kTerms>;
using Mat = std::array<Vec, kTerms>;
enum class At { free, lower, upper };

// split_kv false: the KV reads at the weights' efficiency (term 3), term 6 unused.
Vec regressors(const plan::ModelShape& m, const plan::GroupPerf& g, const plan::StepWork& w, int row_tile,
               bool split_kv) {
  const plan::StageSpan span{m.n_layers, true, true};
  const double p = plan::stage_compute_params(m, span);
  const double flop_s = g.tp * g.tflop_s * 1e12;
  const double kv = w.kv_positions * m.n_layers * m.kv_bytes_per_token_layer(g.tp) / (g.gb_s * 1e9);
  return {double(m.n_layers),
          2.0 * p * w.tokens / flop_s,
          4.0 * w.attention_pairs * m.n_heads * m.head_dim * m.n_layers / flop_s,
          p * m.bytes_per_param / g.tp / (g.gb_s * 1e9) + (split_kv ? 0.0 : kv),
          w.logit_rows,
          plan::pass_bytes(m, span, g.tp, w, row_tile) / (g.gb_s * 1e9),
          split_kv ? kv : 0.0};
}

// Solves g[F][F] x[F] = rhs[F] over the free terms F (Gauss-Jordan with
// partial pivoting); a free term without a pivot (the data cannot tell it
// from the others) gets 0.
void solve_free(Mat g, Vec rhs, const std::array<At, kTerms>& at, Vec& x) {
  std::array<int, kTerms> idx{};
  int n = 0;
  for (int i = 0; i < kTerms; ++i)
    if (at[i] == At::free) idx[n++] = i;
  std::array<std::array<double, kTerms + 1>, kTerms> a{};
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) a[r][c] = g[idx[r]][idx[c]];
    a[r][n] = rhs[idx[r]];
  }
  for (int c = 0; c < n; ++c) {
    int piv = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    std::swap(a[c], a[piv]);
    if (std::abs(a[c][c]) < 1e-300) continue;
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  for (int r = 0; r < n; ++r) x[idx[r]] = std::abs(a[r][r]) > 1e-300 ? a[r][n] / a[r][r] : 0;
}

constexpr const char* kNames[kTerms] = {"layer_overhead_s", "compute_efficiency", "attention_efficiency",
                                        "memory_efficiency", "row_overhead_s", "pass_efficiency", "kv_efficiency"};

}  // namespace

CalibrationFit fit_calibration(const plan::ModelShape& shape, const plan::GroupPerf& perf,
                               const std::vector<StepSample>& samples, const CalibrationBounds& b) {
  constexpr std::size_t kMinSamples = 6;
  if (samples.size() < kMinSamples)
    throw InputError("calibration: " + std::to_string(samples.size()) + " samples, at least " + std::to_string(kMinSamples) +
                     " needed");
  if (!(perf.tflop_s > 0) || !(perf.gb_s > 0)) throw InputError("calibration: the device's tflop_s and gb_s must be positive");
  // The coefficients are the overheads and the inverse efficiencies; their
  // ranges (a pass may cost nothing: its coefficient's lower bound is 0):
  const double max_memory = std::max(b.max_memory_efficiency, b.resident_gb_s / perf.gb_s);
  // A pass re-reads weights from cache: where they fit in one (resident_gb_s
  // measured above the triad), no slower than that cache reads them.
  const double min_pass = std::max(b.min_pass_efficiency, b.resident_gb_s / perf.gb_s);
  const Vec lo{0, 1.0 / b.max_compute_efficiency, 1.0 / b.max_attention_efficiency, 1.0 / max_memory, 0, 0,
               1.0 / max_memory};
  const Vec hi{b.max_layer_overhead_s, 1.0 / b.min_compute_efficiency, 1.0 / b.min_attention_efficiency,
               1.0 / b.min_memory_efficiency, b.max_row_overhead_s, 1.0 / min_pass,
               1.0 / b.min_kv_efficiency};
  std::vector<const StepSample*> used;
  std::vector<double> t;
  for (const auto& s : samples) {
    if (!(s.seconds > 0)) continue;
    used.push_back(&s);
    t.push_back(s.seconds);
  }
  // Weighted least squares of `x_rows` on t: each step's error relative to `scale`.
  // Terms in `unused` (no regressor) are only tried at their lower bound.
  auto bounded_fit = [&](const std::vector<Vec>& x_rows, const std::vector<double>& scale,
                         const std::array<bool, kTerms>& unused, std::array<At, kTerms>& best_at) {
    Mat g{};
    Vec rhs{};
    double yy = 0;
    for (std::size_t k = 0; k < x_rows.size(); ++k) {
      Vec r = x_rows[k];
      for (auto& v : r) v /= scale[k];
      const double y = t[k] / scale[k];
      for (int i = 0; i < kTerms; ++i) {
        for (int j = 0; j < kTerms; ++j) g[i][j] += r[i] * r[j];
        rhs[i] += r[i] * y;
      }
      yy += y * y;
    }
    // Box-constrained: the optimum holds some terms at a bound and solves
    // the rest freely, so try all 3^7 choices and keep the best feasible one
    // (sum of squares = yy - 2 x.rhs + x.G.x).
    Vec best{};
    double best_ss = std::numeric_limits<double>::infinity();
    int states = 1;
    for (int i = 0; i < kTerms; ++i) states *= 3;
    for (int st = 0; st < states; ++st) {
      std::array<At, kTerms> at{};
      Vec x{};
      bool skip = false;
      for (int i = 0, v = st; i < kTerms; ++i, v /= 3) {
        at[i] = static_cast<At>(v % 3);
        skip = skip || (unused[i] && at[i] != At::lower);
        if (at[i] == At::lower) x[i] = lo[i];
        if (at[i] == At::upper) x[i] = hi[i];
      }
      if (skip) continue;
      Vec r = rhs;  // the free terms' right-hand side, the held ones moved over
      for (int i = 0; i < kTerms; ++i)
        for (int j = 0; j < kTerms; ++j)
          if (at[j] != At::free) r[i] -= g[i][j] * x[j];
      solve_free(g, r, at, x);
      bool feasible = true;
      for (int i = 0; i < kTerms; ++i) {
        const double tol = 1e-12 * std::max(1.0, std::abs(hi[i]));
        feasible = feasible && std::isfinite(x[i]) && x[i] >= lo[i] - tol && x[i] <= hi[i] + tol;
      }
      if (!feasible) continue;
      double ss = yy;
      for (int i = 0; i < kTerms; ++i) {
        ss -= 2 * x[i] * rhs[i];
        for (int j = 0; j < kTerms; ++j) ss += x[i] * g[i][j] * x[j];
      }
      if (ss < best_ss - 1e-12 * yy) {
        best_ss = ss;
        best = x;
        best_at = at;
      }
    }
    return best;
  };
  auto predict = [](const Vec& x, const Vec& c) {
    double p = 0;
    for (int i = 0; i < kTerms; ++i) p += x[i] * c[i];
    return p;
  };
  // A step's time under `coef`: the sum of its terms, or (overlap) its fixed
  // terms plus the larger of its compute (GEMM, attention, passes) and
  // memory (weights, KV) terms.
  auto compute_part = [](const Vec& x, const Vec& c) { return x[1] * c[1] + x[2] * c[2] + x[5] * c[5]; };
  auto memory_part = [](const Vec& x, const Vec& c) { return x[3] * c[3] + x[6] * c[6]; };
  auto model_time = [&](const Vec& x, const Vec& c, bool overlap) {
    if (!overlap) return predict(x, c);
    return x[0] * c[0] + x[4] * c[4] + std::max(compute_part(x, c), memory_part(x, c));
  };
  // For each row tile, the KV reads at the weights' efficiency and then
  // (with bounds.split_kv) at their own: first relative to the measured
  // time; then, twice, relative to the model's own prediction. Weighting by
  // the measured time favours the steps that ran fast: one that other work
  // on the core stretched to 3x counts a ninth as much, so the fit ran 5-15 %
  // under the steps' total time (sim-fidelity --steps-out); weighted by the
  // prediction it does not. The tile whose fit has the least error relative
  // to its prediction wins (no pass term, row_tile 0, unless one does
  // clearly better). Then (bounds.try_overlap) the same without a tile with
  // compute and memory overlapped: each step's binding side (the larger
  // under the fit so far) is the one regressed on, in turn, 8 times.
  struct Candidate {
    int row_tile = 0;
    bool split_kv = false, overlap = false;
    Vec coef{};
    std::array<At, kTerms> at{};
    double rms = std::numeric_limits<double>::infinity();
  };
  Candidate win;
  std::vector<TileTry> tried;
  auto rms_of = [&](const std::vector<Vec>& x_rows, const Vec& coef, bool overlap) {
    double sum = 0;
    for (std::size_t k = 0; k < t.size(); ++k) {
      const double p = model_time(x_rows[k], coef, overlap);
      const double e = p > 0 ? (t[k] - p) / p : 1.0;
      sum += e * e;
    }
    return t.empty() ? 0 : std::sqrt(sum / double(t.size()));
  };
  auto consider = [&](Candidate c) {
    tried.push_back(TileTry{c.row_tile, c.split_kv, c.overlap, c.rms});
    if (c.row_tile > 0 && c.coef[5] <= 0) return;  // no pass cost: the same model as row_tile 0
    // A tile, the KV reads' own efficiency or the overlap must earn its
    // place: 1 % less error than the fit so far (and more than rounding),
    // else the smaller tile (or none, the KV tied, no overlap) stays.
    if (c.rms < win.rms * (1 - kTileGain) - 1e-6) win = c;
  };
  const std::vector<bool> kv_modes = b.split_kv ? std::vector<bool>{false, true} : std::vector<bool>{false};
  std::vector<Candidate> sums;  // the row tile 0 fits, where the overlapped ones start
  for (const bool split_kv : kv_modes)
    for (const int tile : b.row_tiles.empty() ? std::vector<int>{0} : b.row_tiles) {
      if (tile < 0) throw InputError("calibration: row tile " + std::to_string(tile) + " is negative");
      std::vector<Vec> x_rows;
      for (const auto* s : used) x_rows.push_back(regressors(shape, perf, s->work, tile, split_kv));
      std::array<bool, kTerms> unused{};
      unused[5] = tile == 0;
      unused[6] = !split_kv;
      Candidate c;
      c.row_tile = tile;
      c.split_kv = split_kv;
      c.coef = bounded_fit(x_rows, t, unused, c.at);
      std::vector<double> scale(t.size());
      for (int pass = 0; pass < 2; ++pass) {
        for (std::size_t k = 0; k < t.size(); ++k) {
          const double p = predict(x_rows[k], c.coef);
          scale[k] = p > 0 ? p : t[k];
        }
        c.coef = bounded_fit(x_rows, scale, unused, c.at);
      }
      c.rms = rms_of(x_rows, c.coef, false);
      if (tile == 0) sums.push_back(c);
      consider(c);
    }
  if (b.try_overlap)
    for (const auto& start : sums) {
      std::vector<Vec> x_rows;
      for (const auto* s : used) x_rows.push_back(regressors(shape, perf, s->work, 0, start.split_kv));
      std::array<bool, kTerms> unused{};
      unused[5] = true;
      unused[6] = !start.split_kv;
      Candidate c = start, best_c;
      c.overlap = true;
      std::vector<double> scale(t.size());
      for (int round = 0; round < 8; ++round) {
        std::vector<Vec> binding = x_rows;
        for (std::size_t k = 0; k < t.size(); ++k) {
          auto& r = binding[k];
          if (compute_part(r, c.coef) >= memory_part(r, c.coef))
            r[3] = r[6] = 0;
          else
            r[1] = r[2] = r[5] = 0;
          const double p = model_time(x_rows[k], c.coef, true);
          scale[k] = p > 0 ? p : t[k];
        }
        c.coef = bounded_fit(binding, scale, unused, c.at);
        c.rms = rms_of(x_rows, c.coef, true);
        if (c.rms < best_c.rms) best_c = c;
      }
      consider(best_c);
    }
  const Vec& best = win.coef;
  CalibrationFit f;
  auto& c = f.calibration;
  c.overlap = win.overlap;
  c.layer_overhead_s = std::clamp(best[0], lo[0], hi[0]);
  c.compute_efficiency = 1.0 / std::clamp(best[1], lo[1], hi[1]);
  c.attention_efficiency = 1.0 / std::clamp(best[2], lo[2], hi[2]);
  c.memory_efficiency = 1.0 / std::clamp(best[3], lo[3], hi[3]);
  c.row_overhead_s = std::clamp(best[4], lo[4], hi[4]);
  c.row_tile = win.row_tile;
  c.pass_efficiency = win.row_tile > 0 ? 1.0 / std::clamp(best[5], lo[5], hi[5]) : 1.0;
  c.kv_efficiency = win.split_kv ? 1.0 / std::clamp(best[6], lo[6], hi[6]) : 0.0;
  const Vec value{c.layer_overhead_s, c.compute_efficiency, c.attention_efficiency, c.memory_efficiency,
                  c.row_overhead_s, c.pass_efficiency, c.kv_efficiency};
  for (int i = 0; i < kTerms; ++i) {
    if (win.at[i] == At::free) continue;
    if (i == 5 && (win.row_tile == 0 || win.at[i] == At::lower)) continue;  // no pass term
    if (i == 6 && !win.split_kv) continue;                                  // the KV at the weights' efficiency
    // An efficiency's upper bound is its coefficient's lower one.
    const bool coef_upper = win.at[i] == At::upper;
    const bool efficiency = (i >= 1 && i <= 3) || i >= 5;
    f.at_bound.push_back(BoundHit{kNames[i], efficiency ? !coef_upper : coef_upper, value[i]});
  }
  f.rms_error = calibration_rms_error(shape, perf, c, samples);
  f.tiles = std::move(tried);
  return f;
}

plan::Calibration calibrate(const plan::ModelShape& shape, const plan::GroupPerf& perf,
                            const std::vector<StepSample>& samples) {
  return fit_calibration(shape, perf, samples).calibration;
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

std::string describe_bounds(const std::vector<BoundHit>& hits) {
  if (hits.empty()) return "none";
  std::string out;
  for (const auto& h : hits) {
    if (!out.empty()) out += ", ";
    char v[32];
    std::snprintf(v, sizeof v, "%g", h.value);
    out += h.term + " at its " + (h.upper ? "upper" : "lower") + " bound " + v;
  }
  return out;
}

}  // namespace ftp::sim
