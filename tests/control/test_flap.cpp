// SPDX-License-Identifier: Apache-2.0
// The flap test (ARCHITECTURE.md §4): the design's load pattern, 100 -> 600
// -> 100 req/s steps with noise, served by QueueingModelSim (a simulated
// service, until the simulated engine exists) under the naive threshold
// policy and under the gear shifter, one virtual day each. It prints shifts
// per 10 min and per day and SLA attainment, and checks the orderings the
// design reports (2.3 shifts per 10 min -> 3.2 per day, 91 % -> 98.7 % SLA),
// never absolute numbers.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "control/clock.hpp"
#include "control/policy.hpp"
#include "control/queueing_model.hpp"
#include "fixtures.hpp"

using namespace ftp::control;

namespace {

constexpr std::int64_t kDayMs = 24LL * 3600 * 1000;
constexpr std::int64_t kNoiseBlockMs = 10000;

/// 8 h at 100 req/s, 8 h at 600, 8 h at 100; each 10 s block scaled by
/// 1 + 0.1 N(0, 1) from a seeded std::mt19937_64.
struct FlapLoad {
  std::vector<double> noise;
  explicit FlapLoad(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n(0.0, 0.10);
    noise.resize(kDayMs / kNoiseBlockMs + 1);
    for (auto& x : noise) x = n(rng);
  }
  double operator()(std::int64_t t_ms) const {
    double base = (t_ms >= kDayMs / 3 && t_ms < 2 * kDayMs / 3) ? 600 : 100;
    return std::max(0.0, base * (1 + noise[static_cast<std::size_t>(t_ms / kNoiseBlockMs)]));
  }
};

SimulationReport run(const std::string& policy_name, std::uint64_t seed) {
  auto table = ftp::test::sample_gears();
  PolicyConfig config;
  auto policy = make_policy(policy_name, table, config);
  VirtualClock clock;
  QueueingModelSim sim(table, "economy", clock);
  return simulate(*policy, sim, clock, FlapLoad(seed), kDayMs);
}

}  // namespace

TEST(Flap, GearShifterShiftsFarLessAndMeetsTheSlaMoreOftenThanNaive) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    SimulationReport naive = run("naive", seed);
    SimulationReport shifter = run("gear-shifter", seed);
    std::printf("flap seed %llu (24 h virtual, 100 -> 600 -> 100 req/s +- 10 %%, QueueingModelSim):\n",
                static_cast<unsigned long long>(seed));
    std::printf("  %-13s %6d shifts  %7.2f per 10 min  %8.1f per day  SLA %6.2f %%\n", "naive", naive.shifts,
                naive.shifts_per_10min(), naive.shifts_per_day(), 100 * naive.sla_attainment);
    std::printf("  %-13s %6d shifts  %7.2f per 10 min  %8.1f per day  SLA %6.2f %%\n", "gear-shifter", shifter.shifts,
                shifter.shifts_per_10min(), shifter.shifts_per_day(), 100 * shifter.sla_attainment);
    std::printf("  (design: naive 2.3 per 10 min, 91 %%; gear shifter 3.2 per day, 98.7 %%)\n");
    EXPECT_GE(shifter.shifts, 2) << "it follows the steps";
    EXPECT_LT(shifter.shifts * 10, naive.shifts) << "far fewer shifts";
    EXPECT_GT(shifter.sla_attainment, naive.sla_attainment);
  }
}

TEST(QueueingModelSim, ErlangCAndLatencyBehaveLikeAQueue) {
  EXPECT_NEAR(erlang_c(1, 0.5), 0.5, 1e-12) << "M/M/1: P(wait) = rho";
  EXPECT_NEAR(erlang_c(2, 1.0), 1.0 / 3, 1e-12);
  EXPECT_EQ(erlang_c(4, 4.0), 1.0);
  auto table = ftp::test::sample_gears();
  VirtualClock clock;
  QueueingModelSim sim(table, "economy", clock);
  for (int i = 0; i < 60; ++i) sim.step(100);
  auto light = sim.observe();
  EXPECT_EQ(light.t_ms, 60000) << "time is the virtual clock";
  EXPECT_NEAR(light.request_rate, 100, 1e-9);
  EXPECT_GT(sim.sla_attainment(), 0.999);
  for (int i = 0; i < 60; ++i) sim.step(200);  // over economy's 150 req/s
  auto heavy = sim.observe();
  EXPECT_GT(heavy.queue_depth, light.queue_depth);
  EXPECT_GT(heavy.e2e_ms.p99, light.e2e_ms.p99);
  EXPECT_LT(sim.sla_attainment(), 0.9);
  EXPECT_TRUE(sim.start_shift("performance"));
  EXPECT_FALSE(sim.start_shift("standard")) << "one shift at a time";
  EXPECT_TRUE(sim.observe().shifting);
  for (int i = 0; i < 45; ++i) sim.step(100);
  EXPECT_FALSE(sim.shifting());
  EXPECT_EQ(sim.gear(), "performance");
  EXPECT_EQ(sim.shifts(), 1);
}
