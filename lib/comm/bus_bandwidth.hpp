// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <string>

#include "doc/topology.hpp"

namespace ftp::comm {

/// One all-reduce measurement, with nccl-tests' definitions:
///
///   algbw = bytes / time                         (GB/s, 1 GB = 1e9 bytes)
///   busbw = algbw x 2 (n - 1) / n                (GB/s)
///
/// `bytes` is the size of each rank's buffer, `time` the mean time of one
/// all-reduce over the timed iterations. busbw is the rate each link would
/// carry in a ring all-reduce (2 (n-1)/n x bytes cross each link), which
/// makes it comparable across rank counts and with the hardware peak.
/// With n = 1 nothing crosses a link and busbw is 0.
struct AllReduceMeasurement {
  int n_ranks = 0;
  std::size_t bytes = 0;     ///< per rank, bytes
  double time_us = 0;        ///< mean time of one all-reduce, microseconds
  double algbw_gb_s = 0;     ///< bytes / time, GB/s
  double busbw_gb_s = 0;     ///< algbw x 2(n-1)/n, GB/s
  int iterations = 0;        ///< timed iterations (after warm-up)
  std::string method;        ///< "inproc float32 sum" or "nccl float32 sum"
};

/// busbw = algbw x 2 (n - 1) / n (nccl-tests' all-reduce factor); 0 for n <= 1.
/// One definition for measurements and documents: doc::allreduce_busbw.
using doc::allreduce_busbw;

/// Fills time, algbw and busbw from the total seconds of `iterations` runs.
inline void finish_allreduce_measurement(AllReduceMeasurement& m, double total_seconds) {
  double t = total_seconds / m.iterations;
  m.time_us = t * 1e6;
  m.algbw_gb_s = t > 0 ? static_cast<double>(m.bytes) / t / 1e9 : 0.0;
  m.busbw_gb_s = allreduce_busbw(m.algbw_gb_s, m.n_ranks);
}

}  // namespace ftp::comm
