// SPDX-License-Identifier: Apache-2.0
// GPU signals through a fake NVML function table (no driver in CI): the
// mapping of utilization, memory, other processes, ECC and lost GPUs into
// ftp.observation/v1's gpus[], and open() without libnvml.so.1.
#include <gtest/gtest.h>

#include <cstring>

#include "hardware/nvml.hpp"
#include "doc/control.hpp"

namespace nvml = ftp::hardware::nvml;

namespace {

constexpr unsigned kSelf = 4242;

/// What the fake NVML answers, per GPU.
struct FakeGpu {
  std::string uuid;
  unsigned util = 0, mem_util = 0;
  unsigned long long total = 0, used = 0;
  std::vector<nvml::ProcessInfo> procs;
  std::vector<nvml::ProcessUtilizationSample> samples;
  unsigned long long ecc = 0;
  bool lost = false;
};

struct Fake {
  std::vector<FakeGpu> gpus;
  int init_rc = nvml::success;
  int inits = 0, shutdowns = 0;
  std::vector<unsigned long long> since;  // lastSeenTimeStamp each process_utilization call got
} g_fake;

FakeGpu& gpu(nvml::Device d) { return g_fake.gpus[reinterpret_cast<std::uintptr_t>(d) - 1]; }

nvml::Api fake_api() {
  nvml::Api a;
  a.init = [] { return ++g_fake.inits, g_fake.init_rc; };
  a.shutdown = [] { return ++g_fake.shutdowns, 0; };
  a.error_string = [](int rc) { return rc == 9 ? "Driver Not Loaded" : "fake error"; };
  a.device_count = [](unsigned* n) { return *n = static_cast<unsigned>(g_fake.gpus.size()), 0; };
  a.handle_by_index = [](unsigned i, nvml::Device* d) {
    *d = reinterpret_cast<nvml::Device>(static_cast<std::uintptr_t>(i) + 1);
    return 0;
  };
  a.uuid = [](nvml::Device d, char* out, unsigned len) {
    if (gpu(d).lost) return int{nvml::gpu_is_lost};
    std::strncpy(out, gpu(d).uuid.c_str(), len - 1);
    return 0;
  };
  a.utilization = [](nvml::Device d, nvml::Utilization* u) {
    if (gpu(d).lost) return int{nvml::gpu_is_lost};
    *u = {gpu(d).util, gpu(d).mem_util};
    return 0;
  };
  a.memory = [](nvml::Device d, nvml::Memory* m) {
    if (gpu(d).lost) return int{nvml::gpu_is_lost};
    *m = {gpu(d).total, gpu(d).total - gpu(d).used, gpu(d).used};
    return 0;
  };
  a.compute_processes = [](nvml::Device d, unsigned* n, nvml::ProcessInfo* p) {
    const auto& ps = gpu(d).procs;
    if (!p || *n < ps.size()) {
      *n = static_cast<unsigned>(ps.size());
      return ps.empty() ? 0 : int{nvml::insufficient_size};
    }
    std::copy(ps.begin(), ps.end(), p);
    *n = static_cast<unsigned>(ps.size());
    return 0;
  };
  a.process_utilization = [](nvml::Device d, nvml::ProcessUtilizationSample* s, unsigned* n, unsigned long long since) {
    g_fake.since.push_back(since);
    std::vector<nvml::ProcessUtilizationSample> newer;
    for (const auto& x : gpu(d).samples)
      if (x.time_stamp > since) newer.push_back(x);
    if (newer.empty()) return int{nvml::not_found};
    if (!s || *n < newer.size()) {
      *n = static_cast<unsigned>(newer.size());
      return int{nvml::insufficient_size};
    }
    std::copy(newer.begin(), newer.end(), s);
    *n = static_cast<unsigned>(newer.size());
    return 0;
  };
  a.total_ecc_errors = [](nvml::Device d, int type, int counter, unsigned long long* c) {
    if (type != 1 || counter != 0) return int{nvml::not_supported};  // only uncorrected, volatile is asked
    *c = gpu(d).ecc;
    return 0;
  };
  return a;
}

class Nvml : public ::testing::Test {
 protected:
  void SetUp() override { g_fake = Fake{}; }
};

}  // namespace

TEST_F(Nvml, MapsEveryGpuToThePoolsIdsAndCountsOtherProcesses) {
  FakeGpu a;
  a.uuid = "GPU-aaaa";
  a.util = 73;
  a.mem_util = 41;
  a.total = 80ull << 30;
  a.used = 30ull << 30;
  // This process and two others; one other without a known memory.
  a.procs = {{kSelf, 20ull << 30, 0, 0}, {7, 6ull << 30, 0, 0}, {8, nvml::kValueNotAvailable, 0, 0}};
  // pid 7: 40 % then 60 % (mean 50 %), pid 8: 25 %; ours is not counted.
  a.samples = {{7, 100, 40, 0, 0, 0}, {7, 200, 60, 0, 0, 0}, {8, 150, 25, 0, 0, 0}, {kSelf, 190, 90, 0, 0, 0}};
  FakeGpu b;
  b.uuid = "GPU-bbbb";
  b.total = 80ull << 30;
  g_fake.gpus = {a, b};
  {
    nvml::GpuSignals s(fake_api(), kSelf);
    EXPECT_EQ(s.unavailable(), "");
    const auto out = s.sample({{"GPU-aaaa", "gpu1"}});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].id, "gpu1");
    EXPECT_EQ(out[0].uuid, "GPU-aaaa");
    EXPECT_DOUBLE_EQ(out[0].utilization, 0.73);
    EXPECT_DOUBLE_EQ(out[0].memory_utilization, 0.41);
    EXPECT_EQ(out[0].memory_total, 80ull << 30);
    EXPECT_EQ(out[0].memory_used, 30ull << 30);
    EXPECT_EQ(out[0].other_processes, 2);
    EXPECT_EQ(out[0].other_memory, 6ull << 30);
    EXPECT_DOUBLE_EQ(out[0].other_compute, 0.75);
    EXPECT_TRUE(out[0].available);
    EXPECT_EQ(out[1].id, "nvml1");  // not the pool's
    EXPECT_EQ(out[1].other_processes, 0);
    EXPECT_DOUBLE_EQ(out[1].other_compute, 0);
    // The next sample asks only for what came after the last one seen.
    g_fake.since.clear();
    const auto again = s.sample({{"GPU-aaaa", "gpu1"}});
    ASSERT_EQ(g_fake.since.size(), 2u);
    EXPECT_EQ(g_fake.since[0], 200u);
    EXPECT_DOUBLE_EQ(again[0].other_compute, 0);  // nothing newer
  }
  EXPECT_EQ(g_fake.inits, 1);
  EXPECT_EQ(g_fake.shutdowns, 1);
}

TEST_F(Nvml, EccErrorsAndALostGpuMakeItUnavailable) {
  FakeGpu a;
  a.uuid = "GPU-aaaa";
  a.ecc = 3;
  FakeGpu b;
  b.uuid = "GPU-bbbb";
  b.lost = true;
  g_fake.gpus = {a, b};
  nvml::GpuSignals s(fake_api(), kSelf);
  const auto out = s.sample({{"GPU-aaaa", "gpu0"}, {"GPU-bbbb", "gpu1"}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_FALSE(out[0].available);
  EXPECT_EQ(out[0].ecc_uncorrected, 3u);
  EXPECT_EQ(out[0].unavailable_because, "3 uncorrected ECC errors");
  EXPECT_FALSE(out[1].available);
  EXPECT_EQ(out[1].id, "nvml1");  // its uuid could not be read any more
  EXPECT_NE(out[1].unavailable_because.find("GPU is lost"), std::string::npos);
}

TEST_F(Nvml, InitFailureOrNoLibrarySaysWhy) {
  g_fake.init_rc = 9;
  nvml::GpuSignals s(fake_api(), kSelf);
  EXPECT_EQ(s.unavailable(), "nvmlInit: Driver Not Loaded");
  EXPECT_TRUE(s.sample({}).empty());
  // On a machine without a driver (CI), open() never throws and says why.
  auto real = nvml::GpuSignals::open();
  ASSERT_NE(real, nullptr);
  if (!real->unavailable().empty()) {
    EXPECT_TRUE(real->sample({}).empty());
    EXPECT_FALSE(real->unavailable().empty());
  }
}

TEST_F(Nvml, TheObservationCarriesGpusOrWhyNot) {
  ftp::doc::Observation o;
  o.gear = "g";
  ftp::doc::GpuLoad g;
  g.id = "gpu0";
  g.uuid = "GPU-aaaa";
  g.utilization = 0.5;
  g.other_memory = 1024;
  g.other_compute = 0.25;
  g.other_processes = 1;
  g.available = false;
  g.unavailable_because = "3 uncorrected ECC errors";
  o.gpus.push_back(g);
  const auto j = ftp::doc::to_json(o);
  ASSERT_TRUE(j.contains("gpus"));
  EXPECT_FALSE(j.contains("gpu_signals_unavailable"));
  const auto back = ftp::doc::observation_from_json(j);
  ASSERT_EQ(back.gpus.size(), 1u);
  EXPECT_EQ(back.gpus[0].id, "gpu0");
  EXPECT_EQ(back.gpus[0].other_memory, 1024u);
  EXPECT_DOUBLE_EQ(back.gpus[0].other_compute, 0.25);
  EXPECT_FALSE(back.gpus[0].available);
  EXPECT_EQ(back.gpus[0].unavailable_because, "3 uncorrected ECC errors");
  ftp::doc::Observation none;
  none.gear = "g";
  none.gpu_signals_unavailable = "no GPU in the device pool (backend cpu)";
  const auto jn = ftp::doc::to_json(none);
  EXPECT_FALSE(jn.contains("gpus"));
  EXPECT_EQ(ftp::doc::observation_from_json(jn).gpu_signals_unavailable, none.gpu_signals_unavailable);
}
