// SPDX-License-Identifier: Apache-2.0
#pragma once

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

/// Fits the cost model's constants to measured steps of a one-stage domain
/// whose device has the probed speeds `perf` (ftp-probe: GEMM TFLOP/s, triad
/// GB/s). With overlap = false (a CPU does compute and memory traffic on the
/// same cores) a step's time is linear in the constants' inverses:
///   t = n_layers x layer_overhead_s + gemm_flop / (TFLOP/s x compute_efficiency)
///       + attention_flop / (TFLOP/s x attention_efficiency) + bytes / (GB/s x memory_efficiency)
///       + logit_rows x row_overhead_s
/// solved by least squares on relative error (each sample weighted 1/t), with
/// no term negative: a term the data gives no cost gets efficiency 1e9 (free)
/// or overhead 0. Throws InputError with fewer than 5 samples.
plan::Calibration calibrate(const plan::ModelShape& shape, const plan::GroupPerf& perf,
                            const std::vector<StepSample>& samples);

/// Root mean square of the relative error of the calibrated model on `samples`.
double calibration_rms_error(const plan::ModelShape& shape, const plan::GroupPerf& perf, const plan::Calibration& c,
                             const std::vector<StepSample>& samples);

}  // namespace ftp::sim
