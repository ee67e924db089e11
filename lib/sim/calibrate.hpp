// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"

namespace ftp::sim {

/// One measured forward of a real domain: its work and the seconds the whole
/// scheduler step took (forward, sampling, scheduling).
struct StepSample {
  plan::StepWork work;
  double seconds = 0;
};

/// The physically plausible range of each fitted constant. Efficiencies are
/// shares of the probed speeds (measured with the threads the engine runs
/// on): a kernel does not beat the probe's GEMM or triad, so at most 1; the
/// lower bounds are far below any kernel measured here (the CPU engine's
/// attention reaches about 1 % of the GEMM peak).
struct CalibrationBounds {
  double min_compute_efficiency = 0.01, max_compute_efficiency = 1.0;
  double min_attention_efficiency = 1e-3, max_attention_efficiency = 1.0;
  double min_memory_efficiency = 0.01, max_memory_efficiency = 1.0;
  /// The KV reads' share of GB/s (plan::Calibration::kv_efficiency): at
  /// least this, at most the weights' upper bound.
  double min_kv_efficiency = 0.01;
  /// The rate the device reads a footprint the size of the stage's weights
  /// (ftp-probe's triad over arrays of that total size), GB/s; 0: not
  /// measured. The triad's own arrays are far above the caches; weights
  /// that fit in one (stories260K's 1 MB) are read at the cache's rate, so
  /// the memory efficiency may then reach resident_gb_s / gb_s (when that
  /// exceeds max_memory_efficiency). Held at 1, a step's weight reads cost
  /// stories260K 35-85 us against 10-21 us measured for the whole fixed part.
  double resident_gb_s = 0;
  double max_layer_overhead_s = 0.01;  ///< per layer per forward
  double max_row_overhead_s = 0.1;     ///< per logits row
  /// A kernel pass re-reads weights the first pass brought into cache: not
  /// slower than the triad reads memory, nor, where resident_gb_s is
  /// measured above the triad, than that (at least resident_gb_s / gb_s).
  /// (At 0.1 the fit of stories260K's steps on a loaded VM took row tile 2
  /// at 0.16, the disturbed steps' noise, and its held-out error rose from
  /// 102 to 124 %; held at 1 with its 1 MB of weights in cache, a quiet
  /// run's fit took tile 2 at 1 and ran its queued TTFT 14-17 % slow.)
  double min_pass_efficiency = 1.0;
  /// The row tiles tried (plan::Calibration::row_tile; 0: no pass term).
  /// 1 is left out: its passes are the rows, the GEMM term's regressor.
  std::vector<int> row_tiles = {0, 2, 4, 8, 16};
  /// Also try the KV reads at an efficiency of their own
  /// (plan::Calibration::kv_efficiency), kept when it lowers the error by 1 %.
  bool split_kv = true;
  /// Also try compute and memory overlapped (plan::Calibration::overlap:
  /// a step costs the larger of the two, as a CPU whose kernels hide the
  /// weights' reads behind their arithmetic runs; the 1 B Q8_0 model's
  /// packed kernels: its decode step is flat in the rows up to 7, then
  /// grows), with no row tile; kept when it lowers the error by 1 %. Off by
  /// default: on the float models' steps (OpenBLAS, which adds) the fit of
  /// a loaded VM took it and its held-out error rose (stories260K 6.5 to
  /// 10.9 %, the synthetic model's 7.5 to 9.3 %).
  bool try_overlap = false;
};

/// A constant the fit left at one end of its range: the data would move it
/// further (an upper efficiency bound: the steps ran faster than the probe
/// says that term can, e.g. weights resident in cache, or a term the data
/// cannot tell apart from another), or, at a lower bound of 0 overhead, the
/// data gives that term no cost.
struct BoundHit {
  std::string term;  ///< "compute_efficiency", ..., "row_overhead_s", "pass_efficiency"
  bool upper = false;
  double value = 0;
};

/// One fit the calibration tried (a row tile, the KV apart or not, overlapped
/// or not): the error of its fit relative to its own
/// prediction (what the tiles are compared on).
struct TileTry {
  int row_tile = 0;
  bool split_kv = false;  ///< the KV reads at their own efficiency
  bool overlap = false;   ///< compute and memory overlapped
  double rms = 0;
};

struct CalibrationFit {
  plan::Calibration calibration;
  double rms_error = 0;            ///< calibration_rms_error on the samples
  std::vector<BoundHit> at_bound;  ///< the constants left at a bound, in term order
  std::vector<TileTry> tiles;      ///< every fit tried (row tile, KV apart, overlap), in order
};

/// Fits the cost model's constants to measured steps of a one-stage domain
/// whose device has the probed speeds `perf` (ftp-probe: GEMM TFLOP/s, triad
/// GB/s). With overlap = false (a CPU does compute and memory traffic on the
/// same cores) a step's time is linear in the constants' inverses:
///   t = n_layers x layer_overhead_s + gemm_flop / (TFLOP/s x compute_efficiency)
///       + attention_flop / (TFLOP/s x attention_efficiency) + weight_bytes / (GB/s x memory_efficiency)
///       + kv_bytes / (GB/s x kv_efficiency) + logit_rows x row_overhead_s
///       + pass_bytes(row_tile) / (GB/s x pass_efficiency)
/// solved by least squares on relative error with each constant inside
/// `bounds` (box-constrained: the best of every choice of constants held at
/// a bound, the others solved freely), once per row tile of
/// `bounds.row_tiles`, in order, first with the KV reads at the weights'
/// efficiency (kv_efficiency 0), then (bounds.split_kv) at their own; a fit
/// replaces the one before when its error relative to its prediction is
/// 1 % lower (0, no pass term, and the KV at the weights' efficiency,
/// unless a term clearly does better); then (bounds.try_overlap), with no
/// tile, compute and memory overlapped (t = the fixed terms + the larger of
/// the compute and the memory terms: each step's larger side under the fit
/// so far regressed on, 8 rounds). The error is relative to the
/// measured time in a first pass, then to the model's prediction (two
/// passes more), so steps that other processes stretched weigh as much as
/// the rest and the fit keeps the steps' total time. Throws InputError with
/// fewer than 6 samples.
CalibrationFit fit_calibration(const plan::ModelShape& shape, const plan::GroupPerf& perf,
                               const std::vector<StepSample>& samples, const CalibrationBounds& bounds = {});

/// fit_calibration's constants.
plan::Calibration calibrate(const plan::ModelShape& shape, const plan::GroupPerf& perf,
                            const std::vector<StepSample>& samples);

/// Root mean square of the relative error of the calibrated model on `samples`.
double calibration_rms_error(const plan::ModelShape& shape, const plan::GroupPerf& perf, const plan::Calibration& c,
                             const std::vector<StepSample>& samples);

/// "memory_efficiency at its upper bound 1, row_overhead_s at 0", or "none".
std::string describe_bounds(const std::vector<BoundHit>& hits);

}  // namespace ftp::sim
