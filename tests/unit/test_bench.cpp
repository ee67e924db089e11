// SPDX-License-Identifier: Apache-2.0
// ftp-gear-bench's math (lib/bench): percentiles, TPOT, goodput, the
// sustain rule, capacity, arrivals, option parsing.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "bench/bench.hpp"
#include "core/error.hpp"

using namespace ftp::bench;

namespace {

Sample ok_sample(double ttft, double e2e, int out, std::vector<double> itl = {}) {
  Sample s;
  s.ok = true;
  s.ttft_ms = ttft;
  s.e2e_ms = e2e;
  s.output_tokens = out;
  s.prompt_tokens = 10;
  s.itl_ms = std::move(itl);
  return s;
}

}  // namespace

TEST(Bench, PercentileInterpolatesLikeNumpy) {
  std::vector<double> v{4, 1, 3, 2};  // sorted 1 2 3 4
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);  // numpy.percentile([1,2,3,4], 90)
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
}

TEST(Bench, StatsOrdered) {
  std::vector<double> v(101);
  std::iota(v.begin(), v.end(), 0.0);
  Stats s = stats(v);
  EXPECT_EQ(s.n, 101);
  EXPECT_DOUBLE_EQ(s.mean, 50);
  EXPECT_DOUBLE_EQ(s.p50, 50);
  EXPECT_DOUBLE_EQ(s.p90, 90);
  EXPECT_DOUBLE_EQ(s.p99, 99);
}

TEST(Bench, TpotIsVllms) {
  EXPECT_DOUBLE_EQ(*ok_sample(100, 1000, 10).tpot_ms(), 100);  // (1000-100)/9
  EXPECT_FALSE(ok_sample(100, 100, 1).tpot_ms());
  Sample bad = ok_sample(1, 2, 5);
  bad.ok = false;
  EXPECT_FALSE(bad.tpot_ms());
}

TEST(Bench, MeetsEverySlo) {
  Slo slo{.ttft_ms = 50, .tpot_ms = 10, .e2e_ms = 0};
  EXPECT_TRUE(meets(ok_sample(50, 140, 10), slo));   // tpot 10
  EXPECT_FALSE(meets(ok_sample(51, 140, 10), slo));  // ttft over
  EXPECT_FALSE(meets(ok_sample(10, 200, 10), slo));  // tpot 21.1
  EXPECT_TRUE(meets(ok_sample(10, 500, 1), slo));    // one token: tpot 0
  EXPECT_TRUE(meets(ok_sample(1e6, 1e7, 3), Slo{}));  // no bounds
  Sample failed = ok_sample(1, 2, 3);
  failed.ok = false;
  EXPECT_FALSE(meets(failed, Slo{}));
}

TEST(Bench, SummaryThroughputAndGoodput) {
  std::vector<Sample> s{ok_sample(10, 100, 10, {10, 10}), ok_sample(20, 200, 10, {20}), ok_sample(100, 300, 10)};
  Sample f;
  f.error = "HTTP 503";
  s.push_back(f);
  RunSummary r = summarize(s, 2.0, 2.0, 2.0, Slo{.ttft_ms = 50}, Sustain{});
  EXPECT_EQ(r.requests, 4);
  EXPECT_EQ(r.completed, 3);
  EXPECT_EQ(r.failed, 1);
  EXPECT_DOUBLE_EQ(r.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(r.output_throughput, 15);
  EXPECT_DOUBLE_EQ(r.total_token_throughput, 30);
  EXPECT_DOUBLE_EQ(r.goodput, 1.0);  // two meet TTFT <= 50
  EXPECT_DOUBLE_EQ(r.slo_attainment, 0.5);
  EXPECT_DOUBLE_EQ(r.keep_up, 0.75);  // 3 of 4 finished, on time: 2 s last arrival + 0.2 s median E2E >= 2 s
  EXPECT_FALSE(r.sustainable);
  EXPECT_EQ(r.itl_ms.n, 3);
  EXPECT_LE(r.goodput, r.request_throughput);
  EXPECT_LE(r.ttft_ms.p50, r.ttft_ms.p90);
  EXPECT_LE(r.ttft_ms.p90, r.ttft_ms.p99);
}

TEST(Bench, CapacityFromBestSustainedRun) {
  // A run shows its completions over its length less a typical request's
  // time to finish (the last ones' tail), at most its offered rate.
  RunSummary a, b, c;
  a.sustainable = true, a.offered_rps = 4, a.completed = 40, a.duration_s = 10.5, a.e2e_ms.p50 = 500;
  a.request_throughput = 40 / 10.5, a.output_throughput = 400 / 10.5;
  b.sustainable = true, b.offered_rps = 8, b.completed = 80, b.duration_s = 11, b.e2e_ms.p50 = 1000;
  b.request_throughput = 80 / 11.0, b.output_throughput = 7000 / 11.0;
  c.sustainable = false, c.offered_rps = 9, c.completed = 80, c.duration_s = 10, c.request_throughput = 8;
  auto cap = capacity_from_runs({a, b, c}, "economy", 1234);
  ASSERT_TRUE(cap);
  EXPECT_DOUBLE_EQ(cap->max_rps, 8);  // 80 / (11 - 1), not 80 / 11
  EXPECT_DOUBLE_EQ(cap->safe_rps, 6.4);
  EXPECT_DOUBLE_EQ(cap->max_tokens_s, 700);  // 87.5 tokens a request at 8 req/s
  EXPECT_DOUBLE_EQ(cap->safe_tokens_s, 560);
  EXPECT_EQ(cap->source, "bench");
  EXPECT_EQ(cap->gear, "economy");
  EXPECT_EQ(cap->t_ms, 1234);
  EXPECT_DOUBLE_EQ(cap->window_s, 11);
  EXPECT_FALSE(capacity_from_runs({c}, "economy", 0));
  // A burst (every request at t = 0) offers no rate: no capacity from it.
  RunSummary burst = b;
  burst.offered_rps = 0;
  EXPECT_FALSE(capacity_from_runs({burst}, "economy", 0));
}

// An idle server answering slow requests keeps up: the run ends a typical
// request's E2E after the last arrival (1 s apart, 1.8 s each).
TEST(Bench, SlowRequestsOnAnIdleServerKeepUp) {
  std::vector<Sample> s;
  for (int i = 0; i < 4; ++i) s.push_back(ok_sample(60, 1800, 64));
  RunSummary r = summarize(s, 0.5, 7.8, 6.0, Slo{}, Sustain{});
  EXPECT_DOUBLE_EQ(r.keep_up, 1.0);
  EXPECT_TRUE(r.sustainable);
  // Falling behind: the run ends far past that.
  r = summarize(s, 0.5, 20.0, 6.0, Slo{}, Sustain{});
  EXPECT_NEAR(r.keep_up, 7.8 / 20.0, 1e-12);
  EXPECT_FALSE(r.sustainable);
}

TEST(Bench, ArrivalsSeededWithTheRightMean) {
  Arrivals p{.process = "poisson", .burstiness = 1, .seed = 7};
  auto a = arrival_times(10, p, 20000, 0);
  ASSERT_EQ(a.size(), 20000u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_GT(a.front(), 0);
  EXPECT_NEAR(a.back() / a.size(), 0.1, 0.005);
  EXPECT_EQ(a, arrival_times(10, p, 20000, 0));
  Arrivals g{.process = "gamma", .burstiness = 0.5, .seed = 7};
  auto b = arrival_times(10, g, 20000, 0);
  EXPECT_NEAR(b.back() / b.size(), 0.1, 0.006);
  auto c = arrival_times(4, Arrivals{.process = "constant"}, 0, 1.0);
  ASSERT_EQ(c.size(), 3u);  // 0.25 0.5 0.75; 1.0 is not before the end
  EXPECT_DOUBLE_EQ(c[2], 0.75);
  EXPECT_THROW(arrival_times(0, p, 1, 0), ftp::InputError);
}

TEST(Bench, ParseOptions) {
  EXPECT_DOUBLE_EQ(parse_duration_s("30"), 30);
  EXPECT_DOUBLE_EQ(parse_duration_s("30s"), 30);
  EXPECT_DOUBLE_EQ(parse_duration_s("500ms"), 0.5);
  EXPECT_DOUBLE_EQ(parse_duration_s("2m"), 120);
  EXPECT_THROW(parse_duration_s("soon"), ftp::InputError);
  EXPECT_THROW(parse_duration_s("3h"), ftp::InputError);
  EXPECT_THROW(parse_duration_s("-1"), ftp::InputError);
  EXPECT_EQ(parse_rates("1,2,4.5"), (std::vector<double>{1, 2, 4.5}));
  EXPECT_THROW(parse_rates("2,1"), ftp::InputError);
  EXPECT_THROW(parse_rates("1,x"), ftp::InputError);
  EXPECT_THROW(parse_rates(""), ftp::InputError);
}
