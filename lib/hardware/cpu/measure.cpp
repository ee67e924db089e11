// SPDX-License-Identifier: Apache-2.0
#include "hardware/cpu/measure.hpp"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "hardware/cpu/cpu_info.hpp"
#include "core/error.hpp"

namespace ftp::hardware {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check_threads(int threads, const char* what) {
  if (threads < 1)
    throw BackendError(std::string(what) + ": threads must be >= 1, got " + std::to_string(threads));
}

/// Restores OpenBLAS' global thread count on scope exit.
class BlasThreads {
 public:
  explicit BlasThreads(int threads) : saved_(openblas_get_num_threads()) { openblas_set_num_threads(threads); }
  ~BlasThreads() { openblas_set_num_threads(saved_); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int saved_;
};

#if defined(__x86_64__)
#define FTP_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// GCC 12's AVX-512 headers trip its own -W(maybe-)uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Where the int8 loops' results go, so that they are computed.
volatile std::int64_t g_int8_sink = 0;

/// `iters` x 16 vpdpbusd (zmm) on 16 independent accumulators; returns a
/// value depending on all of them so that nothing is optimised away.
FTP_VNNI std::int64_t dpbusd_loop(std::int64_t iters, int seed) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(seed + i);
  __m512i a = _mm512_set1_epi8(static_cast<char>(seed | 1)), b = _mm512_set1_epi8(static_cast<char>(-3));
  // Opaque operands: the compiler cannot fold the loop into a multiplication.
  __asm__ volatile("" : "+v"(a), "+v"(b));
  for (std::int64_t n = 0; n < iters; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s);
}
#pragma GCC diagnostic pop
#endif

}  // namespace

Measurement measure_cpu_int8_tops(int threads, bool quick) {
  check_threads(threads, "cpu int8");
  Measurement m;
  m.unit = "TOP/s";
#if defined(__x86_64__)
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))) {
    m.method = "none: the CPU has no AVX-512 VNNI";
    return m;
  }
  const int reps = quick ? 3 : 5;
  // ~0.05 s (quick) or ~0.2 s per run at one instruction per cycle at 3 GHz.
  const std::int64_t iters = (quick ? 150'000'000 : 600'000'000) / 16;
  std::vector<double> run_s(static_cast<std::size_t>(reps) + 1, 0.0);
  std::vector<std::int64_t> sink(static_cast<std::size_t>(threads), 0);
  Clock::time_point t0;
  std::barrier<> sync(threads);
  auto work = [&](int t) {
    for (int r = 0; r <= reps; ++r) {
      sync.arrive_and_wait();
      if (t == 0) t0 = Clock::now();
      sync.arrive_and_wait();
      sink[static_cast<std::size_t>(t)] += dpbusd_loop(iters, r + t);
      sync.arrive_and_wait();
      if (t == 0) run_s[static_cast<std::size_t>(r)] = seconds_since(t0);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  const double ops = 2.0 * 64.0 * 16.0 * static_cast<double>(iters) * threads;
  double best = 0, total = 0;
  for (int r = 1; r <= reps; ++r) {
    total += run_s[static_cast<std::size_t>(r)];
    best = std::max(best, ops / run_s[static_cast<std::size_t>(r)] / 1e12);
  }
  m.value = best;
  m.mean = ops * reps / total / 1e12;
  m.seconds = total;
  m.repetitions = reps;
  m.method = "avx512 vnni vpdpbusd zmm x16 independent, 2 ops per int8 multiply-add, threads=" + std::to_string(threads);
  for (std::int64_t v : sink) g_int8_sink = g_int8_sink + v;
#else
  (void)quick;
  m.method = "none: not an x86-64 CPU";
#endif
  return m;
}

Measurement measure_cpu_gemm_tflops(int threads, bool quick) {
  check_threads(threads, "cpu gemm");
  const int n = quick ? 1024 : 2048;
  const int reps = quick ? 3 : 5;
  const std::size_t elems = static_cast<std::size_t>(n) * n;
  std::vector<float> a(elems), b(elems), c(elems, 0.0f);
  // Small non-trivial values: denormals or zeros would flatter or slow the
  // measurement depending on the micro-architecture.
  for (std::size_t i = 0; i < elems; ++i) {
    a[i] = static_cast<float>((i * 7 + 3) % 17) * 0.0625f - 0.5f;
    b[i] = static_cast<float>((i * 5 + 1) % 13) * 0.0625f - 0.375f;
  }
  BlasThreads guard(threads);
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
  };
  gemm();  // warm-up: thread pool start, page faults on C
  const double flops = 2.0 * n * static_cast<double>(n) * n;
  Measurement m;
  m.unit = "TFLOP/s";
  m.repetitions = reps;
  double best = 0, total = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    gemm();
    double s = seconds_since(t0);
    total += s;
    best = std::max(best, flops / s / 1e12);
  }
  m.value = best;
  m.seconds = total;
  m.mean = flops * reps / total / 1e12;
  m.method = "openblas sgemm fp32 m=n=k=" + std::to_string(n) + " threads=" + std::to_string(threads);
  return m;
}

Measurement measure_cpu_triad_gbs(int threads, std::size_t elements, int repetitions) {
  check_threads(threads, "cpu triad");
  if (elements == 0 || repetitions < 1)
    throw BackendError("cpu triad: elements and repetitions must be >= 1");
  // Plain new[] (no value-initialisation) so that each thread first-touches
  // its own slice: on NUMA machines the pages land next to the thread.
  std::unique_ptr<double[]> a(new double[elements]), b(new double[elements]), c(new double[elements]);
  const double scalar = 3.0;
  const int passes = repetitions + 1;  // pass 0 is the warm-up
  std::vector<double> pass_seconds(passes, 0.0);
  Clock::time_point t0;
  // Thread 0 times each pass between two barrier phases.
  std::barrier<> sync(threads);
  auto work = [&](int t) {
    const std::size_t begin = elements * t / threads, end = elements * (t + 1) / threads;
    double* pa = a.get();
    const double* pb = b.get();
    const double* pc = c.get();
    for (std::size_t i = begin; i < end; ++i) {
      a[i] = 0.0;
      b[i] = 1.0;
      c[i] = 2.0;
    }
    for (int p = 0; p < passes; ++p) {
      sync.arrive_and_wait();
      if (t == 0) t0 = Clock::now();
      sync.arrive_and_wait();
      for (std::size_t i = begin; i < end; ++i) pa[i] = pb[i] + scalar * pc[i];
      sync.arrive_and_wait();
      if (t == 0) pass_seconds[p] = seconds_since(t0);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  if (a[elements / 2] != 1.0 + scalar * 2.0) throw BackendError("cpu triad: wrong result in a[]");

  const double bytes = 3.0 * sizeof(double) * static_cast<double>(elements);
  Measurement m;
  m.unit = "GB/s";
  m.repetitions = repetitions;
  double best = 0, total = 0;
  for (int p = 1; p < passes; ++p) {
    total += pass_seconds[p];
    best = std::max(best, bytes / pass_seconds[p] / 1e9);
  }
  m.value = best;
  m.seconds = total;
  m.mean = bytes * repetitions / total / 1e9;
  m.method = "stream triad fp64 3x" + std::to_string(elements * sizeof(double) >> 20) + " MiB threads=" +
             std::to_string(threads) + " bytes=3*8*N";
  return m;
}

Measurement measure_cpu_triad_gbs(int threads, bool quick) {
  const std::size_t mib = quick ? 32 : 64;
  return measure_cpu_triad_gbs(threads, mib * (std::size_t{1} << 20) / sizeof(double), quick ? 4 : 10);
}

void cpu_triad(float* a, const float* b, const float* c, float scalar, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
}

CpuStalls measure_cpu_stalls(double seconds) {
  if (!(seconds > 0)) throw BackendError("measure_cpu_stalls: seconds must be positive");
  const std::vector<int> cpus = usable_cpu_ids();
  struct PerCpu {
    long long over_1ms = 0;
    double lost_s = 0, max_s = 0;
  };
  std::vector<PerCpu> per(cpus.size());
  std::vector<std::thread> threads;
  const auto span = std::chrono::duration<double>(seconds);
  for (std::size_t i = 0; i < cpus.size(); ++i)
    threads.emplace_back([&, i] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[i], &set);
      sched_setaffinity(0, sizeof(set), &set);  // best effort: unpinned, it measures the process's share
      PerCpu& me = per[i];
      const auto t0 = std::chrono::steady_clock::now();
      auto last = t0;
      for (;;) {
        const auto t = std::chrono::steady_clock::now();
        const double gap = std::chrono::duration<double>(t - last).count();
        last = t;
        if (gap > 100e-6) me.lost_s += gap;
        if (gap > 1e-3) ++me.over_1ms;
        me.max_s = std::max(me.max_s, gap);
        if (t - t0 >= span) break;
      }
    });
  for (auto& t : threads) t.join();
  CpuStalls r;
  r.seconds = seconds;
  r.cpus = static_cast<int>(cpus.size());
  for (const PerCpu& p : per) {
    r.stalls_per_s += static_cast<double>(p.over_1ms) / seconds / static_cast<double>(cpus.size());
    r.lost_share += p.lost_s / seconds / static_cast<double>(cpus.size());
    r.max_ms = std::max(r.max_ms, p.max_s * 1e3);
  }
  return r;
}

}  // namespace ftp::hardware
