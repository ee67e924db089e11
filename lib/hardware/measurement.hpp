// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace ftp::hardware {

/// One measured rate of a device (GEMM TFLOP/s, memory GB/s).
/// `value` is the best repetition's rate, the one ftp-probe reports:
/// on a quiet machine the best run is the least disturbed estimate.
struct Measurement {
  double value = 0;         ///< best rate, in `unit`
  double mean = 0;          ///< mean rate over the timed repetitions, in `unit`
  std::string unit;         ///< "TFLOP/s" or "GB/s" (1 GB = 1e9 bytes)
  double seconds = 0;       ///< total timed wall time, s (warm-up excluded)
  int repetitions = 0;      ///< timed repetitions
  std::string method;       ///< what was run, e.g. "openblas sgemm m=n=k=2048 threads=2"
};

}  // namespace ftp::hardware
