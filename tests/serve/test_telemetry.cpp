// SPDX-License-Identifier: Apache-2.0
// Telemetry by itself, on times the test gives: rates over their windows,
// token counts, latency percentiles, shift outcomes in the metrics.
#include <gtest/gtest.h>

#include "serve/telemetry.hpp"

using ftp::serve::DomainSample;
using ftp::serve::Telemetry;

TEST(Telemetry, RequestAndTokenRatesOverTheLastTenSeconds) {
  Telemetry t;
  // Three requests of 100, 200 and 300 prompt tokens at 1 s; one of 50 at 12 s.
  for (int p : {100, 200, 300}) t.request_accepted(1000, p);
  for (int i = 0; i < 40; ++i) t.token(5000);  // 40 tokens in second 5
  for (int i = 0; i < 20; ++i) t.token(9500);  // 20 in second 9
  auto o = t.observe(10000, "g", false, {});
  EXPECT_DOUBLE_EQ(o.request_rate, 0.3);
  EXPECT_DOUBLE_EQ(o.prompt_token_rate, 60.0);  // 600 tokens / 10 s
  EXPECT_DOUBLE_EQ(o.decode_token_rate, 6.0);   // 60 tokens / 10 s
  t.request_accepted(12000, 50);
  o = t.observe(15500, "g", false, {});
  // The 1 s arrivals and second 5 have left the window; second 9 has not.
  EXPECT_DOUBLE_EQ(o.request_rate, 0.1);
  EXPECT_DOUBLE_EQ(o.prompt_token_rate, 5.0);
  EXPECT_DOUBLE_EQ(o.decode_token_rate, 2.0);
  o = t.observe(30000, "g", false, {});
  EXPECT_EQ(o.request_rate, 0);
  EXPECT_EQ(o.decode_token_rate, 0);
}

TEST(Telemetry, FinishedRequestsFeedPercentilesMeansAndCounters) {
  Telemetry t;
  for (int i = 1; i <= 100; ++i) {
    t.request_accepted(0, 10);
    t.request_finished(1000, 10, 4, static_cast<double>(i), 2.0, i == 100);
  }
  EXPECT_EQ(t.requests_total(), 100u);
  EXPECT_EQ(t.requests_failed(), 1u);
  auto p = t.e2e_since(0);
  EXPECT_EQ(p.p50, 50);  // nearest rank
  EXPECT_EQ(p.p99, 99);
  auto o = t.observe(2000, "g", false, {});
  EXPECT_DOUBLE_EQ(o.mean_prompt_tokens, 10);
  EXPECT_DOUBLE_EQ(o.mean_output_tokens, 4);
  EXPECT_EQ(o.tpot_ms.p99, 2.0);
}

TEST(Telemetry, ObservationSumsDomainsAndMetricsNameStatesAndOutcomes) {
  Telemetry t;
  std::vector<DomainSample> doms(2);
  doms[0].view.id = "d0";
  doms[0].view.state = ftp::doc::DomainState::serving;
  doms[0].view.waiting = 3;
  doms[0].view.devices = {"vd0"};
  doms[0].kv_usage = 0.25;
  doms[1].view.id = "d1";
  doms[1].view.state = ftp::doc::DomainState::draining;
  doms[1].view.waiting = 2;
  doms[1].view.devices = {"vd0", "vd1"};
  doms[1].kv_usage = 0.5;
  doms[1].bubble_ratio = 0.3;
  auto o = t.observe(1000, "standard", true, doms);
  EXPECT_EQ(o.queue_depth, 5);
  EXPECT_EQ(o.kv_watermark, 0.5);
  EXPECT_EQ(o.bubble_ratio, 0.3);
  EXPECT_TRUE(o.shifting);
  ASSERT_EQ(o.domains.size(), 2u);
  ASSERT_EQ(o.devices.size(), 2u);  // vd0 once, though two domains hold it
  t.shift_done(ftp::doc::ShiftOutcome::rolled_back);
  const std::string m = t.prometheus("standard", doms);
  EXPECT_NE(m.find("ftp_shifts_total{outcome=\"rolled-back\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("ftp_shifts_total{outcome=\"committed\"} 0"), std::string::npos);
  EXPECT_NE(m.find("ftp_domains{state=\"draining\"} 1"), std::string::npos);
  EXPECT_NE(m.find("ftp_domains{state=\"warming\"} 0"), std::string::npos);
  EXPECT_NE(m.find("ftp_requests_waiting 5"), std::string::npos);
  EXPECT_NE(m.find("ftp_gear_info{gear=\"standard\"} 1"), std::string::npos);
}
