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
  doms[0].queued_prompt_tokens = 300;
  doms[1].queued_prompt_tokens = 45;
  auto o = t.observe(1000, "standard", true, doms);
  EXPECT_EQ(o.queue_depth, 5);
  EXPECT_EQ(o.queued_prompt_tokens, 345) << "the token backlog of every domain";
  EXPECT_EQ(o.kv_watermark, 0.5);
  EXPECT_EQ(o.bubble_ratio, 0.3);
  EXPECT_TRUE(o.shifting);
  ASSERT_EQ(o.domains.size(), 2u);
  ASSERT_EQ(o.devices.size(), 2u);  // vd0 once, though two domains hold it
  ftp::doc::ShiftEvent e;
  e.trigger = "policy:gear-shifter";
  e.phase = ftp::doc::ShiftPhase::rollback;
  e.phase_ms = 1500;  // in the (1, 2.5] s bucket
  t.shift_event(e);
  e.phase = ftp::doc::ShiftPhase::done;
  e.outcome = ftp::doc::ShiftOutcome::rolled_back;
  t.shift_event(e);
  t.refused(ftp::serve::RefusalReason::domain_queue_tokens);
  ftp::serve::ServiceSample svc;
  svc.gear = "standard";
  svc.devices_leased = 3;
  const std::string m = t.prometheus(svc, doms);
  auto has = [&](const std::string& line) { EXPECT_NE(m.find("\n" + line + "\n"), std::string::npos) << line << "\n" << m; };
  has("flextp:shifts_total{model_name=\"\",outcome=\"rolled-back\",trigger=\"policy:gear-shifter\"} 1");
  has("flextp:shifts_total{model_name=\"\",outcome=\"committed\",trigger=\"manual\"} 0");
  has("flextp:shift_rollbacks_total{model_name=\"\"} 1");
  has("flextp:shift_phase_duration_seconds_bucket{model_name=\"\",phase=\"rollback\",le=\"1\"} 0");
  has("flextp:shift_phase_duration_seconds_bucket{model_name=\"\",phase=\"rollback\",le=\"2.5\"} 1");
  has("flextp:shift_phase_duration_seconds_count{model_name=\"\",phase=\"reserve\"} 0");
  has("flextp:domains{model_name=\"\",state=\"draining\"} 1");
  has("flextp:domains{model_name=\"\",state=\"warming\"} 0");
  has("flextp:devices_leased{model_name=\"\"} 3");
  has("flextp:requests_refused_total{model_name=\"\",reason=\"domain_queue_tokens\"} 1");
  has("flextp:requests_refused_total{model_name=\"\",reason=\"draining\"} 0");
  has("vllm:num_requests_waiting{model_name=\"\"} 5");
  has("vllm:gpu_cache_usage_perc{model_name=\"\"} 0.5");
  has("flextp:gear_info{model_name=\"\",gear=\"standard\"} 1");
}

// Issue 17: NVML's GPU signals as flextp:gpu_*, or why there are none.
TEST(Telemetry, GpuSignalsOrWhyNot) {
  ftp::serve::Telemetry t;
  ftp::serve::ServiceSample svc;
  svc.gear = "g";
  svc.gpu_signals_unavailable = "no GPU in the device pool (cpu devices)";
  std::string m = t.prometheus(svc, {});
  EXPECT_NE(m.find("\nflextp:gpu_signals_available{model_name=\"\",reason=\"no GPU in the device pool (cpu devices)\"} 0\n"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("flextp:gpu_utilization"), std::string::npos);
  svc.gpu_signals_unavailable.clear();
  ftp::doc::GpuLoad g;
  g.id = "gpu0";
  g.uuid = "GPU-aaaa";
  g.utilization = 0.75;
  g.other_memory = 1024;
  g.other_compute = 0.25;
  g.available = false;
  svc.gpus.push_back(g);
  m = t.prometheus(svc, {});
  auto has = [&](const std::string& line) { EXPECT_NE(m.find("\n" + line + "\n"), std::string::npos) << line << "\n" << m; };
  has("flextp:gpu_signals_available{model_name=\"\"} 1");
  has("flextp:gpu_utilization{model_name=\"\",gpu=\"gpu0\",uuid=\"GPU-aaaa\"} 0.75");
  has("flextp:gpu_other_memory_bytes{model_name=\"\",gpu=\"gpu0\",uuid=\"GPU-aaaa\"} 1024");
  has("flextp:gpu_other_compute{model_name=\"\",gpu=\"gpu0\",uuid=\"GPU-aaaa\"} 0.25");
  has("flextp:gpu_available{model_name=\"\",gpu=\"gpu0\",uuid=\"GPU-aaaa\"} 0");
}

TEST(Telemetry, VllmHistogramsUseItsBucketsAndFinishReasons) {
  Telemetry t("tiny", 100);
  t.request_accepted(0, 12);
  t.first_token(10, 30.0);  // 0.03 s: in (0.02, 0.04]
  t.queued(400.0);          // 0.4 s: in (0.3, 0.5]
  t.request_finished(1000, 12, 7, 1000.0, 5.0, ftp::engine::FinishReason::length);
  t.request_accepted(0, 3);
  t.request_finished(1000, 3, 0, 5.0, std::nullopt, ftp::engine::FinishReason::cancelled);
  const std::string m = t.prometheus({}, {});
  auto has = [&](const std::string& line) { EXPECT_NE(m.find("\n" + line + "\n"), std::string::npos) << line << "\n" << m; };
  has("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.02\"} 0");
  has("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.04\"} 1");
  has("vllm:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"0.3\"} 0");
  has("vllm:request_queue_time_seconds_bucket{model_name=\"tiny\",le=\"0.5\"} 1");
  // 1-2-5 buckets up to max_model_len (100): 12 and 3 prompt tokens.
  has("vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"2\"} 0");
  has("vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"5\"} 1");
  has("vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"20\"} 2");
  has("vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"100\"} 2");
  EXPECT_EQ(m.find("vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"200\"}"), std::string::npos);
  has("vllm:request_prompt_tokens_sum{model_name=\"tiny\"} 15");
  has("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1");
  has("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 1");
  has("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 0");
  has("vllm:prompt_tokens_total{model_name=\"tiny\"} 15");
}
