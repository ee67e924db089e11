// SPDX-License-Identifier: Apache-2.0
// Trace readers (Azure LLM 2023 CSV, Mooncake JSONL), synthetic arrivals and
// the replay of ftp-plan simulate.
#include <gtest/gtest.h>

#include <cmath>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "control/replay.hpp"
#include "control/trace.hpp"
#include "core/error.hpp"
#include "fixtures.hpp"
#include "test_data.hpp"

namespace fs = std::filesystem;
using namespace ftp::control;

namespace {

fs::path data_dir() { return ftp::test::data_dir(); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ftp::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

Trace azure(const std::string& text) {
  std::istringstream in(text);
  return read_azure_csv(in, "t.csv");
}

Trace mooncake(const std::string& text) {
  std::istringstream in(text);
  return read_mooncake_jsonl(in, "t.jsonl");
}

}  // namespace

TEST(AzureCsv, ParsesAndRebasesTimes) {
  Trace t = azure("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                  "2023-11-16 18:17:03.9799600,4808,10\r\n"
                  "2023-11-16 18:17:04.0319600,3180,8\r\n"
                  "\n"
                  "2023-11-16 18:18:04,1,2\n");
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.format, "azure-csv");
  EXPECT_EQ(t.requests[0].t_ms, 0);
  EXPECT_EQ(t.requests[1].t_ms, 52);
  EXPECT_EQ(t.requests[2].t_ms, 60020);
  EXPECT_EQ(t.requests[0].prompt_tokens, 4808);
  EXPECT_EQ(t.requests[1].output_tokens, 8);
}

TEST(AzureCsv, CrossesMidnight) {
  Trace t = azure("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-12-31 23:59:59.5,1,1\n2024-01-01 00:00:00.5,1,1\n");
  EXPECT_EQ(t.requests[1].t_ms, 1000);
}

TEST(AzureCsv, MalformedLinesNameFileLineAndField) {
  const std::string h = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  EXPECT_EQ(error_of([] { azure("time,in,out\n"); }),
            "t.csv:1: expected the header TIMESTAMP,ContextTokens,GeneratedTokens, got \"time,in,out\"");
  EXPECT_EQ(error_of([&] { azure(h + "2023-11-16 18:17:03.1,1,1\n2023-11-16 18:17:04.1,12\n"); }),
            "t.csv:3: expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), got 2");
  EXPECT_EQ(error_of([&] { azure(h + "16/11/2023 18:17,1,1\n"); }),
            "t.csv:2: TIMESTAMP: expected YYYY-MM-DD HH:MM:SS[.fffffff], got \"16/11/2023 18:17\"");
  EXPECT_EQ(error_of([&] { azure(h + "2023-11-16 18:17:03.1,x,1\n"); }),
            "t.csv:2: ContextTokens: expected a non-negative integer, got \"x\"");
  EXPECT_EQ(error_of([&] { azure(h + "2023-11-16 18:17:03.1,5,-1\n"); }),
            "t.csv:2: GeneratedTokens: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(error_of([&] { azure(h + "2023-11-16 18:17:03,1,1\n2023-11-16 18:17:02,1,1\n"); }),
            "t.csv:3: TIMESTAMP: must not go back in time, got 1700158622000 after 1700158623000");
  EXPECT_EQ(error_of([&] { azure(h); }), "t.csv: no requests");
  EXPECT_EQ(error_of([] { azure(""); }), "t.csv: empty, expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
}

TEST(MooncakeJsonl, ParsesAndIgnoresOtherFields) {
  Trace t = mooncake("{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [1, 2]}\n"
                     "\n"
                     "{\"timestamp\": 30535, \"input_length\": 6472, \"output_length\": 26, \"hash_ids\": []}\n");
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.format, "mooncake-jsonl");
  EXPECT_EQ(t.requests[1].t_ms, 30535 - 27482);
  EXPECT_EQ(t.requests[0].prompt_tokens, 6955);
  EXPECT_EQ(t.requests[1].output_tokens, 26);
}

TEST(MooncakeJsonl, MalformedLinesNameFileLineAndField) {
  const std::string ok = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n";
  EXPECT_EQ(error_of([&] { mooncake(ok + "{\"timestamp\": 5, \"output_length\": 1}\n"); }),
            "t.jsonl:2: input_length: missing required field");
  EXPECT_EQ(error_of([&] { mooncake(ok + "\n{\"timestamp\": 5, \"input_length\": -3, \"output_length\": 1}\n"); }),
            "t.jsonl:3: input_length: must not be negative, got -3");
  EXPECT_EQ(error_of([&] { mooncake(ok + "[1, 2]\n"); }).substr(0, 11), "t.jsonl:2: ");
  const std::string bad = error_of([&] { mooncake(ok + "{\"timestamp\": 5,\n"); });
  EXPECT_EQ(bad.rfind("t.jsonl:2: malformed JSON: syntax error", 0), 0u) << bad;
  EXPECT_EQ(error_of([&] { mooncake(ok + "{\"timestamp\": 1e400, \"input_length\": 1, \"output_length\": 1}\n"); }),
            "t.jsonl:2: malformed JSON: number overflow parsing '1e400'");
  EXPECT_EQ(error_of([&] { mooncake("{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 1}\n" + ok); }),
            "t.jsonl:2: timestamp: must not go back in time, got 0 after 9");
}

TEST(RealTraces, AzureCodeAndConv) {
  const fs::path dir = data_dir() / "traces" / "azure-llm-2023";
  if (!fs::exists(dir / "AzureLLMInferenceTrace_code.csv"))
    GTEST_SKIP() << "no Azure traces at " << dir << " (set FTP_TEST_DATA)";
  Trace code = read_trace((dir / "AzureLLMInferenceTrace_code.csv").string());
  EXPECT_EQ(code.format, "azure-csv");
  EXPECT_EQ(code.requests.size(), 8819u);
  EXPECT_NEAR(code.span_s(), 3435.9, 0.1);
  Trace conv = read_trace((dir / "AzureLLMInferenceTrace_conv.csv").string());
  EXPECT_EQ(conv.requests.size(), 19366u);
  EXPECT_NEAR(conv.span_s(), 3501.7, 0.1);
  double ctx = 0;
  for (const auto& r : conv.requests) ctx += r.prompt_tokens;
  EXPECT_NEAR(ctx / static_cast<double>(conv.requests.size()), 1155, 1);
}

TEST(RealTraces, Mooncake) {
  const fs::path f = data_dir() / "traces" / "mooncake-fast25" / "synthetic_trace.jsonl";
  if (!fs::exists(f)) GTEST_SKIP() << "no Mooncake trace at " << f << " (set FTP_TEST_DATA)";
  Trace t = read_trace(f.string());
  EXPECT_EQ(t.format, "mooncake-jsonl");
  EXPECT_EQ(t.requests.size(), 3993u);
  EXPECT_EQ(t.requests.back().t_ms, 1022025);
}

TEST(Synthetic, PatternsAndErrors) {
  EXPECT_DOUBLE_EQ(pattern_rate("const:7", 99), 7);
  EXPECT_DOUBLE_EQ(pattern_rate("steps:1,5,2@60", 59), 1);
  EXPECT_DOUBLE_EQ(pattern_rate("steps:1,5,2@60", 60), 5);
  EXPECT_DOUBLE_EQ(pattern_rate("steps:1,5,2@60", 1e6), 2);
  EXPECT_DOUBLE_EQ(pattern_length_s("steps:1,5,2@60"), 180);
  EXPECT_DOUBLE_EQ(pattern_rate("day:10,30@100", 0), 10);
  EXPECT_DOUBLE_EQ(pattern_rate("day:10,30@100", 50), 30);
  EXPECT_EQ(error_of([] { pattern_rate("ramp:1", 0); }),
            "--rate-pattern: unknown pattern \"ramp\" in \"ramp:1\" (expected const:R, steps:R1,R2,...@SECONDS or day:MIN,MAX@PERIOD_S)");
  EXPECT_EQ(error_of([] { pattern_rate("steps:1,x@5", 0); }),
            "--rate-pattern: rate \"x\" is not a number >= 0 in \"steps:1,x@5\" (expected const:R, steps:R1,R2,...@SECONDS "
            "or day:MIN,MAX@PERIOD_S)");
  EXPECT_EQ(error_of([] { synthesize({.pattern = "const:5"}); }), "--duration: a const rate pattern needs a duration");
  // An infinite period would never end a simulation.
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "period must be a finite number > 0",
                      error_of([] { pattern_rate("day:1,2@inf", 0); }));
}

TEST(Synthetic, RatesFollowThePatternAndSeedIsDeterministic) {
  SyntheticConfig c{.pattern = "steps:20,80@500", .seed = 3};
  Trace a = synthesize(c), b = synthesize(c);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  EXPECT_EQ(a.requests.back().t_ms, b.requests.back().t_ms);
  long first = 0, second = 0;
  for (const auto& r : a.requests) (r.t_ms < 500000 ? first : second)++;
  EXPECT_NEAR(first, 10000, 400);   // 20 req/s x 500 s, Poisson: sd 100
  EXPECT_NEAR(second, 40000, 800);
  c.burstiness = 3;  // gamma, burstier: same mean rate
  Trace g = synthesize(c);
  EXPECT_NEAR(static_cast<double>(g.requests.size()), 50000, 3000);
  c.seed = 4;
  EXPECT_NE(synthesize(c).requests.size(), g.requests.size());
}

TEST(Synthetic, LengthsFollowTheirDistributionsWithoutMovingTheArrivals) {
  SyntheticConfig c{.pattern = "const:50", .duration_s = 400, .seed = 9};
  const Trace fixed = synthesize(c);
  for (const auto& r : fixed.requests) {
    ASSERT_EQ(r.prompt_tokens, 512);
    ASSERT_EQ(r.output_tokens, 128);
  }
  c.prompt = parse_length_dist("uniform:100,300", "--prompt-lengths");
  c.output = parse_length_dist("lognormal:200,1.5", "--output-lengths");
  const Trace drawn = synthesize(c);
  ASSERT_EQ(drawn.requests.size(), fixed.requests.size());
  double p = 0, o = 0, o2 = 0;
  int lo = 1 << 30, hi = 0;
  for (std::size_t i = 0; i < drawn.requests.size(); ++i) {
    const auto& r = drawn.requests[i];
    ASSERT_EQ(r.t_ms, fixed.requests[i].t_ms);  // the lengths' generator is a second one
    lo = std::min(lo, r.prompt_tokens);
    hi = std::max(hi, r.prompt_tokens);
    p += r.prompt_tokens;
    o += r.output_tokens;
    o2 += double(r.output_tokens) * r.output_tokens;
    ASSERT_GE(r.output_tokens, 1);
  }
  const double n = static_cast<double>(drawn.requests.size());  // about 20 000
  EXPECT_GE(lo, 100);
  EXPECT_LE(hi, 300);
  EXPECT_NEAR(p / n, 200, 2);
  EXPECT_NEAR(o / n, 200, 8);
  const double sd = std::sqrt(o2 / n - (o / n) * (o / n));
  EXPECT_NEAR(sd / (o / n), 1.5, 0.3);  // the coefficient of variation asked for
  EXPECT_EQ(parse_length_dist("64", "x").mean(), 64);
  EXPECT_EQ(parse_length_dist("uniform:10,30", "x").mean(), 20);
  EXPECT_EQ(error_of([] { parse_length_dist("pareto:1,2", "--output-lengths"); }),
            "--output-lengths: unknown distribution \"pareto\" in \"pareto:1,2\" (expected N, const:N, uniform:MIN,MAX or "
            "lognormal:MEAN,CV, tokens)");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "must be in [1, 1048576]",
                      error_of([] { parse_length_dist("0", "--prompt-lengths"); }));
}

TEST(PolicySpec, Parses) {
  auto s = parse_policy_spec("static:economy");
  EXPECT_EQ(s.name, "static");
  EXPECT_EQ(s.gear, "economy");
  EXPECT_EQ(parse_policy_spec("dynamic-tp").name, "tp-planner");
  EXPECT_EQ(parse_policy_spec("gear-shifter:p.json").config_path, "p.json");
  EXPECT_EQ(parse_policy_spec("static:economy:p.json").config_path, "p.json");
  EXPECT_EQ(error_of([] { parse_policy_spec("static"); }), "--policy: static needs a gear, as in static:economy");
  EXPECT_EQ(error_of([] { parse_policy_spec("bogus"); }).substr(0, 34), "--policy: unknown policy \"bogus\" (");
}

TEST(Replay, GearShifterBeatsStaticEconomyOnASurge) {
  auto table = ftp::test::sample_gears();  // economy 150 req/s max, standard 600, performance 1200
  Trace t = synthesize({.pattern = "steps:60,400,60@900", .seed = 1});
  ReplayConfig rc;
  auto run = [&](const std::string& spec, std::vector<ftp::json::Json>* lines) {
    auto p = parse_policy_spec(spec);
    auto policy = make_replay_policy(p, table, PolicyConfig{});
    return replay(t, *policy, spec, table, "economy", rc, [&](const ftp::json::Json& j) {
      if (lines) lines->push_back(j);
    });
  };
  std::vector<ftp::json::Json> lines;
  auto st = run("static:economy", &lines);
  auto gs = run("gear-shifter", nullptr);
  EXPECT_EQ(st["kind"], "ftp.sim-summary/v1");
  EXPECT_EQ(st["service"], "queueing-model");
  EXPECT_EQ(st["shifts"], 0);
  EXPECT_GE(gs["shifts"].get<int>(), 2);  // up for the surge, down after it
  EXPECT_GT(gs["sla_attainment"].get<double>(), st["sla_attainment"].get<double>() + 0.2);
  EXPECT_GT(gs["gpu_hours"].get<double>(), st["gpu_hours"].get<double>());
  EXPECT_EQ(lines.size(), 270u);  // 2700 s / 10 s
  EXPECT_EQ(lines.front()["kind"], "ftp.sim-interval/v1");
  EXPECT_NEAR(lines[50]["load_rps"].get<double>(), 60, 15);
  EXPECT_NEAR(lines[120]["load_rps"].get<double>(), 400, 40);
  EXPECT_EQ(lines[120]["gear"], "economy");
  EXPECT_LT(lines[120]["sla_attainment"].get<double>(), 0.1);
}
