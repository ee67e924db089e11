// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <vector>

#include "hardware/measurement.hpp"

namespace ftp::hardware {

/// Single-precision GEMM rate of the CPU with `threads` OpenBLAS threads:
/// C = A x B, square m = n = k (1024 with `quick`, 2048 otherwise), counted
/// as 2 m n k flops. One warm-up, then 3 (quick) or 5 timed repetitions.
///
/// OpenBLAS keeps one global thread count: the call sets it to `threads` and
/// restores the previous value before returning, so it must not run while
/// another thread of the process uses BLAS. ftp-probe measures virtual
/// devices one after another, each with its own thread share: the number is
/// what that device does alone, not what N devices do at once (they then
/// share caches and memory bandwidth). Throws ftp::BackendError if threads < 1.
Measurement measure_cpu_gemm_tflops(int threads, bool quick);

/// Peak int8 multiply-add rate of the CPU's AVX-512 VNNI instruction (the
/// one the CPU backend's packed Q8_0 kernel is built on): `threads` threads,
/// each running vpdpbusd on 512-bit registers into 16 independent
/// accumulators (no loads, no dependency stalls), counted as 2 ops per
/// int8 multiply-add (64 per instruction). Best of 3 (quick) or 5 timed
/// runs of ~0.05 s (quick) or ~0.2 s after one warm-up; unit "TOP/s"
/// (1e12 ops/s). Where the CPU has no AVX-512 VNNI: value 0 and a method
/// saying so. Throws ftp::BackendError if threads < 1.
Measurement measure_cpu_int8_tops(int threads, bool quick);

/// STREAM triad a[i] = b[i] + s * c[i] over doubles with `threads` threads
/// (each pinned to nothing, first-touching its own slice). Arrays are
/// 3 x 64 MiB (3 x 32 MiB with `quick`), far above the last-level caches of
/// the CPUs we run on. Bytes counted as in STREAM: 3 x 8 x N per pass (two
/// reads, one write; write-allocate traffic not counted). GB/s = 1e9 bytes/s,
/// best of 10 passes (4 with `quick`) after one warm-up.
Measurement measure_cpu_triad_gbs(int threads, bool quick);

/// The same triad on caller-chosen sizes; `elements` per array. Exposed for
/// tests and for ftp-probe's cluster-spec checks.
Measurement measure_cpu_triad_gbs(int threads, std::size_t elements, int repetitions);

/// How much of the CPUs' time this process does not get: the scheduling
/// noise a latency benchmark's tail sits on. One thread pinned to each CPU
/// of the process spins on the clock for `seconds`; a gap between two
/// readings of over 100 us is time the thread lost (another thread or
/// process ran, an interrupt, the hypervisor). On a quiet host of its own a
/// CPU loses next to nothing; a 2-core VM shared with other work loses
/// several 1-3 ms slices a second, and a step of a few hundred
/// microseconds that one of them hits takes ten times as long.
struct CpuStalls {
  double seconds = 0;            ///< measured wall time
  int cpus = 0;                  ///< CPUs measured (the process's affinity set)
  double stalls_per_s = 0;       ///< gaps of over 1 ms per second, per CPU (mean over CPUs)
  double lost_share = 0;         ///< share of the time lost in gaps of over 100 us (mean over CPUs)
  double max_ms = 0;             ///< the longest gap on any CPU, ms
};
CpuStalls measure_cpu_stalls(double seconds);

/// The reference triad used to check device kernels: a[i] = b[i] + s * c[i].
void cpu_triad(float* a, const float* b, const float* c, float scalar, std::size_t n);

}  // namespace ftp::hardware
