// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/measure.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "hardware/gpu.hpp"
#include "ftp_config.h"

using namespace ftp::hardware;

TEST(CpuInfo, Sane) {
  CpuInfo cpu = discover_cpu();
  EXPECT_FALSE(cpu.model.empty());
  EXPECT_GE(cpu.logical_cpus, 1);
  EXPECT_GE(cpu.physical_cores, 1);
  EXPECT_LE(cpu.physical_cores, cpu.logical_cpus);
  EXPECT_GE(cpu.sockets, 1);
  EXPECT_GE(cpu.usable_cpus, 1);
  EXPECT_EQ(cpu.usable_cpus, static_cast<int>(cpu.usable_cpu_ids.size()));
  EXPECT_GE(cpu.numa_nodes, 1);
  EXPECT_EQ(cpu.numa_nodes, static_cast<int>(cpu.numa_memory_bytes.size()));
  EXPECT_GT(cpu.memory_bytes, 0u);
  EXPECT_LE(cpu.available_bytes, cpu.memory_bytes);
  std::uint64_t numa_total = 0;
  for (auto b : cpu.numa_memory_bytes) numa_total += b;
  EXPECT_GT(numa_total, 0u);
}

TEST(CpuMeasure, GemmQuickPositive) {
  Measurement m = measure_cpu_gemm_tflops(discover_cpu().usable_cpus, true);
  EXPECT_GT(m.value, 0.0);
  EXPECT_GE(m.value, m.mean * 0.999);
  EXPECT_EQ(m.unit, "TFLOP/s");
  EXPECT_EQ(m.repetitions, 3);
  EXPECT_LT(m.value, 1000.0);  // a CPU, not a datacenter
  EXPECT_NE(m.method.find("sgemm"), std::string::npos);
}

TEST(CpuMeasure, TriadQuickPositive) {
  Measurement m = measure_cpu_triad_gbs(discover_cpu().usable_cpus, true);
  EXPECT_GT(m.value, 0.0);
  EXPECT_EQ(m.unit, "GB/s");
  EXPECT_EQ(m.repetitions, 4);
  EXPECT_LT(m.value, 100000.0);
}

TEST(CpuMeasure, TriadOddSizeAndMoreThreadsThanElements) {
  EXPECT_GT(measure_cpu_triad_gbs(3, 7, 2).value, 0.0);
  EXPECT_GT(measure_cpu_triad_gbs(1, 1, 1).value, 0.0);
}

TEST(CpuMeasure, BadThreadCountIsBackendError) {
  EXPECT_THROW(measure_cpu_gemm_tflops(0, true), ftp::BackendError);
  EXPECT_THROW(measure_cpu_triad_gbs(0, true), ftp::BackendError);
}

TEST(VirtualDevices, SplitFourOverEightCpus) {
  std::vector<int> cpus{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto devs = split_cpu(4, 4000, cpus);
  ASSERT_EQ(devs.size(), 4u);
  int threads = 0;
  std::vector<int> seen;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(devs[i]->id(), i);
    EXPECT_EQ(devs[i]->name(), "cpu:" + std::to_string(i));
    EXPECT_TRUE(devs[i]->threads() == 2 || devs[i]->threads() == 3);
    EXPECT_EQ(devs[i]->threads(), static_cast<int>(devs[i]->cpus().size()));
    EXPECT_EQ(devs[i]->memory_budget(), 1000u);
    EXPECT_FALSE(devs[i]->oversubscribed());
    threads += devs[i]->threads();
    seen.insert(seen.end(), devs[i]->cpus().begin(), devs[i]->cpus().end());
  }
  EXPECT_EQ(threads, 10);
  EXPECT_EQ(seen, cpus);  // every CPU exactly once, in order
}

TEST(VirtualDevices, MoreDevicesThanCpusOversubscribe) {
  auto devs = split_cpu(5, 5u << 20, {3, 7});
  ASSERT_EQ(devs.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(devs[i]->threads(), 1);
    EXPECT_TRUE(devs[i]->oversubscribed());
    EXPECT_EQ(devs[i]->cpus(), std::vector<int>{i % 2 == 0 ? 3 : 7});
  }
}

TEST(VirtualDevices, SplitOfThisMachine) {
  CpuInfo cpu = discover_cpu();
  auto devs = split_cpu(4, cpu.memory_bytes);
  ASSERT_EQ(devs.size(), 4u);
  int threads = 0;
  for (auto& d : devs) threads += d->threads();
  EXPECT_EQ(threads, std::max(4, cpu.usable_cpus));
  // Binding may be refused in a container, but must not crash.
  std::thread([&] { devs[1]->bind_current_thread(); }).join();
}

TEST(VirtualDevices, LowerPriorityOfOneThreadOnly) {
  // The calling thread's nice goes up by the delta; another thread's stays.
  auto nice_of_this_thread = [] { return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))); };
  const int before = nice_of_this_thread();
  if (before > 16) GTEST_SKIP() << "already at nice " << before;
  int after = 0;
  bool ok = false;
  std::thread([&] {
    ok = lower_current_thread_priority(3);
    after = nice_of_this_thread();
  }).join();
  ASSERT_TRUE(ok);
  EXPECT_EQ(after, before + 3);
  EXPECT_EQ(nice_of_this_thread(), before);
}

TEST(VirtualDevices, BadCount) {
  EXPECT_THROW(split_cpu(0, 100, {0}), ftp::InputError);
  EXPECT_THROW(split_cpu(1, 100, {}), ftp::InputError);
}

TEST(VirtualDevices, MemoryAccounting) {
  auto devs = split_cpu(4, 4096, {0, 1, 2, 3});
  VirtualDevice& d = *devs[2];
  EXPECT_EQ(d.memory_budget(), 1024u);
  d.reserve(600, "weights");
  d.reserve(400, "kv cache");
  EXPECT_EQ(d.memory_used(), 1000u);
  EXPECT_EQ(d.memory_available(), 24u);
  try {
    d.reserve(100, "activations");
    FAIL() << "no error over budget";
  } catch (const OutOfDeviceMemory& e) {
    EXPECT_STREQ(e.what(), "cpu:2: activations of 100 bytes does not fit: 1000 of 1024 bytes in use");
    EXPECT_EQ(e.exit(), ftp::Exit::failure);
  }
  EXPECT_EQ(d.memory_used(), 1000u);  // a failed reserve changes nothing
  d.release(400);
  EXPECT_EQ(d.memory_used(), 600u);
  EXPECT_EQ(d.memory_peak(), 1000u);
  EXPECT_THROW(d.release(601), ftp::Error);
  d.release(600);
  EXPECT_EQ(d.memory_used(), 0u);
  EXPECT_EQ(devs[0]->memory_used(), 0u);  // devices account separately
}

TEST(VirtualDevices, ConcurrentAccounting) {
  VirtualDevice d(0, 4, {0}, 1u << 30);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        d.reserve(16);
        d.release(16);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(d.memory_used(), 0u);
  EXPECT_LE(d.memory_peak(), 64u);
}

TEST(Gpu, InterfaceWithoutGpuIsEmptyNotACrash) {
  EXPECT_EQ(cuda_built(), FTP_HAVE_CUDA == 1);
  auto gpus = discover_gpus();
  EXPECT_FALSE(gpu_runtime_status().empty());
  if (!gpus.empty()) GTEST_SKIP() << "GPUs present: covered by suite gpu";
  if (!cuda_built()) {
    EXPECT_TRUE(gpu_p2p_matrix({}).empty());
    EXPECT_THROW(measure_gpu_gemm_tflops(0, true), ftp::BackendError);
    EXPECT_THROW(measure_gpu_triad_gbs(0, true), ftp::BackendError);
  } else {
    // Built with CUDA, no device: a measurement names the missing device.
    try {
      measure_gpu_triad_gbs(0, true);
      FAIL() << "no error without a GPU";
    } catch (const ftp::BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device 0"), std::string::npos) << e.what();
    }
  }
}
