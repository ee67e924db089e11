// SPDX-License-Identifier: Apache-2.0
// ftp-plan simulate on the engine model (sim::replay_engine): a request's
// latencies are the cost model's step times, the same inputs give the same
// bytes (also through the gear shifter, its stagger and a shift, on two
// threads at once), KV pressure preempts and fires the memory guard, a
// shift costs its phases with old and new domains held together, and a
// request longer than the context is refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "control/policy.hpp"
#include "control/replay.hpp"
#include "control/trace.hpp"
#include "core/error.hpp"
#include "doc/cluster.hpp"
#include "plan/cost_model.hpp"
#include "plan/planner.hpp"
#include "sim/engine_replay.hpp"
#include "sim/simulate.hpp"

using namespace ftp;

namespace {

std::string source_root() {
  const char* s = std::getenv("FTP_SOURCE_ROOT");
  return s ? s : ".";
}

/// One node of `n` A100s with `memory_gib` each on NVSwitch.
doc::Topology cluster(int n, int memory_gib = 80) {
  json::Json dev = {{"id", "gpu"},   {"count", n},   {"type", "gpu"}, {"name", "A100"}, {"memory_gib", memory_gib},
                    {"tflop_s", 312}, {"dtype", "bf16"}, {"memory_bandwidth_gb_s", 2039}};
  json::Json spec = {{"kind", "ftp.cluster/v1"},
                     {"name", "test"},
                     {"nodes", json::Json::array({{{"id", "n0"}, {"devices", json::Json::array({dev})}}})}};
  if (n > 1)
    spec["fabrics"] = json::Json::array({{{"id", "nvs"}, {"type", "nvswitch"}, {"nodes", json::Json::array({"n0"})},
                                          {"bandwidth_gb_s", 300}, {"latency_us", 2}}});
  return doc::topology_from_cluster_spec(spec);
}

plan::ModelShape llama7b() { return plan::read_model_shape(source_root() + "/examples/models/llama-7b.json"); }

doc::GearTable table(const doc::Topology& topo, const plan::ModelShape& m, std::vector<std::string> layouts,
                     plan::PlanOptions o = {}) {
  for (const auto& l : layouts) o.layouts.push_back(plan::parse_layout(l));
  return plan::plan(topo, m, o).table;
}

struct Replayed {
  json::Json summary;
  std::vector<json::Json> intervals;
};

Replayed replay(const control::Trace& trace, const doc::GearTable& t, const doc::Topology& topo, const std::string& policy,
           const std::string& start, control::ReplayConfig rc = {}, sim::EngineReplayConfig ec = {}) {
  ec.shape = llama7b();
  ec.topology = topo;
  auto spec = control::parse_policy_spec(policy);
  auto p = control::make_replay_policy(spec, t, control::PolicyConfig{});
  Replayed r;
  r.summary = sim::replay_engine(trace, *p, policy, t, start, rc, ec, [&](const json::Json& j) { r.intervals.push_back(j); });
  return r;
}

control::Trace one_request(std::int64_t t_ms, int prompt, int output) {
  control::Trace tr{"test", "synthetic", {}};
  tr.requests.push_back({t_ms, prompt, output});
  return tr;
}

}  // namespace

TEST(EngineReplay, OneRequestTakesTheCostModelStepTimes) {
  const doc::Topology topo = cluster(1);
  const plan::ModelShape m = llama7b();
  const doc::GearTable t = table(topo, m, {"tp1:tp=1"});
  control::ReplayConfig rc;
  rc.duration_s = 20;
  Replayed r = replay(one_request(0, 100, 4), t, topo, "static:tp1", "tp1", rc);
  // The expected times from the cost model directly: one prefill step of
  // 100 tokens (it gives the first token), then three decode steps.
  const plan::GroupPerf g = plan::group_perf(topo, {topo.devices.at(0).id});
  const plan::StageSpan span{m.n_layers, true, true};
  const double prefill = plan::step_time_s(m, span, g, plan::StepWork{100, 100 * 101 / 2.0, 100, 1});
  double e2e = prefill;
  for (int k = 0; k < 3; ++k) {
    const double s = 100 + k;  // positions before the decoded token
    e2e += plan::step_time_s(m, span, g, plan::StepWork{1, s + 1, s + 1, 1});
  }
  const json::Json& s = r.summary;
  EXPECT_EQ(s.at("service"), "simulated-engine");
  EXPECT_EQ(s.at("requests"), 1);
  EXPECT_EQ(s.at("finished"), 1);
  EXPECT_DOUBLE_EQ(s.at("sla_attainment").get<double>(), 1.0);
  EXPECT_NEAR(s.at("p50").at("ttft_ms").get<double>(), prefill * 1000, 1e-3);
  EXPECT_NEAR(s.at("p50").at("e2e_ms").get<double>(), e2e * 1000, 1e-3);
  EXPECT_NEAR(s.at("p50").at("tpot_ms").get<double>(), (e2e - prefill) / 3 * 1000, 1e-3);
  EXPECT_EQ(s.at("prompt_tokens"), 100);
  EXPECT_EQ(s.at("decode_tokens"), 4);
  EXPECT_EQ(s.at("shifts"), 0);
  // One device for the 20 s of the slice; two records of 10 s.
  EXPECT_NEAR(s.at("gpu_hours").get<double>(), 20.0 / 3600, 1e-4);
  ASSERT_EQ(r.intervals.size(), 2u);
  EXPECT_EQ(r.intervals[0].at("requests"), 1);
  EXPECT_EQ(r.intervals[0].at("finished"), 1);
}

TEST(EngineReplay, SameInputsGiveTheSameBytes) {
  const doc::Topology topo = cluster(4);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "tp2:tp=2", "dp4:tp=1,dp=4"});
  control::SyntheticConfig sc;
  sc.pattern = "steps:2,40,2@120";
  sc.burstiness = 2;
  sc.seed = 5;
  sc.prompt = control::parse_length_dist("lognormal:800,1", "p");
  sc.output = control::parse_length_dist("uniform:20,300", "o");
  const control::Trace tr = control::synthesize(sc);
  auto dump = [&] {
    Replayed r = replay(tr, t, topo, "naive", "tp1");
    std::string out;
    for (const auto& j : r.intervals) out += json::dump(j, json::Style::short_) + "\n";
    return out + json::dump(r.summary, json::Style::short_);
  };
  const std::string a = dump();
  EXPECT_EQ(a, dump());
  EXPECT_NE(a.find("\"shifts\":"), std::string::npos);
  Replayed r = replay(tr, t, topo, "naive", "tp1");
  EXPECT_GE(r.summary.at("shifts").get<int>(), 1) << "the surge should move the naive policy";
}

TEST(EngineReplay, KvPressurePreemptsAndFiresTheMemoryGuard) {
  // 7 B in bf16 (13.5 GB) on 18 GiB devices: one device holds a few
  // thousand KV positions once the planner has set aside its CUDA graphs
  // and NCCL buffers (plan::GpuOverheads, 2.9 GB; 16 GiB before they were
  // counted); the memory-guard gear (tp2) holds many more.
  const doc::Topology topo = cluster(2, 18);
  plan::PlanOptions po;
  po.workload.concurrency = 1;
  po.workload.context = 2200;
  doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "guard:tp=2"}, po);
  t.gears[1].role = "memory-guard";
  control::SyntheticConfig sc;
  sc.pattern = "const:1";
  sc.duration_s = 300;
  sc.prompt = control::parse_length_dist("1500", "p");
  sc.output = control::parse_length_dist("600", "o");
  const control::Trace tr = control::synthesize(sc);
  Replayed fixed = replay(tr, t, topo, "static:tp1", "tp1");
  EXPECT_GT(fixed.summary.at("preemptions").get<int>(), 0);
  EXPECT_GT(fixed.summary.at("kv_usage").at("max").get<double>(), 0.9);
  Replayed gs = replay(tr, t, topo, "gear-shifter", "tp1");
  EXPECT_GE(gs.summary.at("shifts").get<int>(), 1);
  EXPECT_TRUE(gs.summary.at("gear_time_s").contains("guard")) << json::dump(gs.summary, json::Style::short_);
}

TEST(EngineReplay, AShiftHoldsBothGearsUntilTheOldDrains) {
  // static:tp2 from tp1 shifts at the first observation (10 s): reserve
  // 0.5 s, warm 2 s (and the warm-up request), ramp 10 % and 50 % with 1 s
  // waits, then 100 %; tp1's device is held until it retires, tp2's two
  // from the reservation on.
  const doc::Topology topo = cluster(2);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "tp2:tp=2"});
  control::ReplayConfig rc;
  rc.duration_s = 60;
  rc.interval_s = 1;
  rc.observation_period_s = 10;
  Replayed r = replay(one_request(50000, 10, 2), t, topo, "static:tp2", "tp1", rc);
  EXPECT_EQ(r.summary.at("shifts"), 1);
  EXPECT_EQ(r.summary.at("final_gear"), "tp2");
  // Shifting from 10 s to 14.5 s (+ the warm-up's few ms).
  for (const auto& iv : r.intervals) {
    const double ts = iv.at("t_s").get<double>();
    if (ts <= 10 || ts >= 15) {
      EXPECT_FALSE(iv.at("shifting").get<bool>()) << ts;
    }
    if (ts >= 11 && ts <= 14) {
      EXPECT_TRUE(iv.at("shifting").get<bool>()) << ts;
      EXPECT_EQ(iv.at("devices"), 2) << ts;  // gpu0 (both gears) and gpu1
    }
  }
  const double gpu_s = r.summary.at("gpu_hours").get<double>() * 3600;
  // gpu0 all 60 s, gpu1 from 10 s.
  EXPECT_NEAR(gpu_s, 60 + 50, 0.5);
  EXPECT_NEAR(r.summary.at("gear_time_s").at("tp1").get<double>(), 14.5, 0.1);
}

TEST(EngineReplay, TheDrainGivesBackUnstartedRequestsToTheNewGear) {
  // 80 prompts of 2000 tokens arrive at 9 s on tp1, a queue tp1 alone
  // takes seconds to prefill. static:tp2 shifts at 10 s, at 100 % at
  // 14.5 s: as the daemon's drain (issue 20), tp1 then keeps only what it
  // has begun and gives the rest to tp2, so the shift (its drain) ends soon
  // after, long before tp1 would have worked through the queue.
  const doc::Topology topo = cluster(2);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "tp2:tp=2"});
  control::Trace tr{"test", "synthetic", {}};
  for (int i = 0; i < 80; ++i) tr.requests.push_back({9000 + i, 2000, 2});
  control::ReplayConfig rc;
  rc.duration_s = 60;
  rc.interval_s = 0.5;
  auto last_busy = [](const Replayed& r, const char* field) {
    double last = 0;
    for (const auto& iv : r.intervals)
      if (field ? iv.at(field).get<bool>() : iv.at("running").get<int>() + iv.at("queue_depth").get<double>() > 0)
        last = iv.at("t_s").get<double>();
    return last;
  };
  const Replayed alone = replay(tr, t, topo, "static:tp1", "tp1", rc);
  const Replayed shifted = replay(tr, t, topo, "static:tp2", "tp1", rc);
  const double tp1_done = last_busy(alone, nullptr), drain_done = last_busy(shifted, "shifting");
  EXPECT_GT(tp1_done, 20) << "the queue on tp1 alone";
  EXPECT_LT(drain_done, 16.5) << "the shift ends within 2 s of its 100 % at 14.5 s; tp1 alone works until " << tp1_done;
  EXPECT_EQ(shifted.summary.at("finished"), 80);
}

TEST(EngineReplay, ReleaseModeReloadsWeights) {
  const plan::ModelShape m = llama7b();
  const doc::Topology topo = cluster(2);
  doc::GearTable t = table(topo, m, {"tp1:tp=1", "tp2:tp=2"});
  plan::ShiftCostConfig c;
  EXPECT_EQ(plan::weight_load_s(m, t.gears[0], t.gears[1], c), 0);  // resident
  t.gears[1].weight_mode = "release";
  // gpu1 is new: half of the whole model at 25 GB/s; gpu0 keeps its weights.
  EXPECT_NEAR(plan::weight_load_s(m, t.gears[0], t.gears[1], c), m.weight_bytes() / 2 / 25e9, 0.02);
  EXPECT_NEAR(plan::reserve_phase_s(m, t.gears[0], t.gears[1], c), 0.5 + m.weight_bytes() / 2 / 25e9, 0.02);
}

TEST(EngineReplay, LongerThanTheContextIsRefused) {
  const doc::Topology topo = cluster(1);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1"});
  control::ReplayConfig rc;
  rc.duration_s = 10;
  Replayed r = replay(one_request(0, 5000, 4), t, topo, "static:tp1", "tp1", rc);
  EXPECT_EQ(r.summary.at("rejected"), 1);
  EXPECT_EQ(r.summary.at("sla_attainment").get<double>(), 0);
}

TEST(EngineReplay, BadInputIsNamed) {
  sim::SimulateOptions o;
  o.synth.pattern = "const:1";
  o.replay.duration_s = 10;
  try {
    sim::simulate(o, [](const json::Json&) {});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the engine model needs --topology and --model"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sim::service_from_name("mm1"), InputError);
  EXPECT_THROW(control::parse_length_dist("uniform:5,2", "--prompt-lengths"), InputError);
  EXPECT_THROW(control::parse_length_dist("lognormal:0,1", "--prompt-lengths"), InputError);
  plan::ShiftCostConfig c;
  c.ramp = {0.5, 0.2, 1.0};
  EXPECT_THROW(plan::validate(c), InputError);
}

namespace {

/// Holds, and keeps what it saw.
class Recorder final : public control::Policy {
 public:
  doc::Decision observe(const doc::Observation& o) override {
    seen.push_back(o);
    doc::Decision d;
    d.t_ms = o.t_ms;
    d.from = o.gear;
    return d;
  }
  std::string_view name() const noexcept override { return "recorder"; }
  std::vector<doc::Observation> seen;
};

}  // namespace

namespace {

/// Shifts to `to` at its first observation, with the decision's own ramp.
class RampedShift final : public control::Policy {
 public:
  RampedShift(std::string to, std::vector<double> ramp, std::int64_t step_ms)
      : to_(std::move(to)), ramp_(std::move(ramp)), step_ms_(step_ms) {}
  doc::Decision observe(const doc::Observation& o) override {
    doc::Decision d;
    d.t_ms = o.t_ms;
    d.from = o.gear;
    if (o.gear != to_ && !o.shifting && !sent_) {
      d.action = "shift";
      d.to = to_;
      d.ramp = ramp_;
      d.ramp_step_ms = step_ms_;
      sent_ = true;
    }
    return d;
  }
  std::string_view name() const noexcept override { return "ramped"; }

 private:
  std::string to_;
  std::vector<double> ramp_;
  std::int64_t step_ms_;
  bool sent_ = false;
};

}  // namespace

TEST(EngineReplay, ADecisionsOwnRampReplacesTheConfigs) {
  // As AShiftHoldsBothGearsUntilTheOldDrains (first observation at 10 s,
  // reserve 0.5 s, warm 2 s and the warm-up request), but the decision asks
  // for its own ramp: straight to 100 % ends the shift at 12.5 s instead of
  // 14.5 s; 50 % for 0.25 s at 12.75 s; none of its own: the config's.
  const doc::Topology topo = cluster(2);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "tp2:tp=2"});
  auto tp1_time = [&](std::vector<double> ramp, std::int64_t step_ms) {
    sim::EngineReplayConfig ec;
    ec.shape = llama7b();
    ec.topology = topo;
    control::ReplayConfig rc;
    rc.duration_s = 60;
    rc.observation_period_s = 10;
    RampedShift p("tp2", std::move(ramp), step_ms);
    json::Json s = sim::replay_engine(one_request(50000, 10, 2), p, "ramped", t, "tp1", rc, ec, [](const json::Json&) {});
    EXPECT_EQ(s.at("shifts"), 1);
    return s.at("gear_time_s").at("tp1").get<double>();
  };
  EXPECT_NEAR(tp1_time({1.0}, -1), 12.5, 0.1);
  EXPECT_NEAR(tp1_time({0.5, 1.0}, 250), 12.75, 0.1);
  EXPECT_NEAR(tp1_time({}, -1), 14.5, 0.1);
}

TEST(EngineReplay, ObservationsCarryTheLoadInTokens) {
  const doc::Topology topo = cluster(1);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1"});
  control::SyntheticConfig sc;
  sc.pattern = "const:2";
  sc.duration_s = 120;
  sc.prompt = control::parse_length_dist("300", "p");
  sc.output = control::parse_length_dist("50", "o");
  const control::Trace tr = control::synthesize(sc);
  sim::EngineReplayConfig ec;
  ec.shape = llama7b();
  ec.topology = topo;
  Recorder rec;
  control::ReplayConfig rc;
  rc.observation_period_s = 10;
  sim::replay_engine(tr, rec, "recorder", t, "tp1", rc, ec, [](const json::Json&) {});
  ASSERT_GE(rec.seen.size(), 11u);
  double prompt = 0, decode = 0, rate = 0;
  for (std::size_t i = 2; i < 11; ++i) {  // 20 s to 110 s: the steady part
    prompt += rec.seen[i].prompt_token_rate;
    decode += rec.seen[i].decode_token_rate;
    rate += rec.seen[i].request_rate;
    EXPECT_EQ(rec.seen[i].prompt_token_rate, 300 * rec.seen[i].request_rate);
    EXPECT_EQ(rec.seen[i].devices.size(), 1u);
  }
  // About 2 requests/s of 300 prompt and 50 output tokens (Poisson arrivals).
  EXPECT_NEAR(rate / 9, 2, 0.6);
  EXPECT_NEAR(decode / 9, 50 * rate / 9, 30);
  EXPECT_GT(prompt, 0);
}

TEST(EngineReplay, ARampCheckRollsBackASlowerGear) {
  // static:tp1 from tp2 at 300 req/s of tiny requests: tp1's steps take
  // about twice tp2's, so the new domain's P99 E2E in the first ramp step
  // is over 1.5 x the minute before; the shift rolls back, traffic returns
  // to tp2, and the static policy tries again (whose baseline, the minute
  // before, now holds the slower requests of the failed ramp).
  const doc::Topology topo = cluster(2);
  const doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "tp2:tp=2"});
  control::SyntheticConfig sc;
  sc.pattern = "const:300";
  sc.duration_s = 40;
  sc.prompt = control::parse_length_dist("32", "p");
  sc.output = control::parse_length_dist("2", "o");
  Replayed r = replay(control::synthesize(sc), t, topo, "static:tp1", "tp2");
  EXPECT_GE(r.summary.at("rollbacks").get<int>(), 1) << json::dump(r.summary, json::Style::short_);
  EXPECT_GT(r.summary.at("shifts").get<int>(), 1);  // tried again after the rollback
  EXPECT_EQ(r.summary.at("unfinished"), 0);
  // The same with a lenient check: the shift goes through.
  sim::EngineReplayConfig ec;
  ec.rollback_p99_factor = 100;
  Replayed ok = replay(control::synthesize(sc), t, topo, "static:tp1", "tp2", {}, ec);
  EXPECT_EQ(ok.summary.at("rollbacks"), 0);
  EXPECT_EQ(ok.summary.at("shifts"), 1);
  EXPECT_EQ(ok.summary.at("final_gear"), "tp1");
  EXPECT_LT(ok.summary.at("gear_time_s").at("tp2").get<double>(), r.summary.at("gear_time_s").at("tp2").get<double>());
}

TEST(EngineReplay, UnequalReplicasShareByCapacityAndTheBacklogIsInTokens) {
  // Two devices, the second at half the compute and memory bandwidth of
  // the first (same memory): a dp=2 gear's replica on the slow one can do
  // at most half, and a little more than half where fixed per-step costs
  // weigh in, so its traffic share is about 1/3, not 1/2.
  json::Json fast = {{"id", "fast"},   {"count", 1},   {"type", "gpu"}, {"name", "A100"}, {"memory_gib", 80},
                     {"tflop_s", 312}, {"dtype", "bf16"}, {"memory_bandwidth_gb_s", 2039}};
  json::Json slow = fast;
  slow["id"] = "slow";
  slow["name"] = "A100-half";
  slow["tflop_s"] = 156;
  slow["memory_bandwidth_gb_s"] = 1019.5;
  json::Json spec = {{"kind", "ftp.cluster/v1"},
                     {"name", "mixed"},
                     {"nodes", json::Json::array({{{"id", "n0"}, {"devices", json::Json::array({fast, slow})}}})}};
  const doc::Topology topo = doc::topology_from_cluster_spec(spec);
  const doc::GearTable t = table(topo, llama7b(), {"dp2:tp=1,dp=2"});
  ASSERT_EQ(t.gears.front().replicas.size(), 2u);
  control::SyntheticConfig sc;
  sc.pattern = "const:40";  // far beyond both: a queue forms
  sc.duration_s = 60;
  sc.prompt = control::parse_length_dist("2000", "p");
  sc.output = control::parse_length_dist("20", "o");
  const control::Trace tr = control::synthesize(sc);
  sim::EngineReplayConfig ec;
  ec.shape = llama7b();
  ec.topology = topo;
  ec.tail_s = 0;
  Recorder rec;
  sim::replay_engine(tr, rec, "recorder", t, t.gears.front().name, control::ReplayConfig{}, ec,
                     [](const json::Json&) {});
  ASSERT_FALSE(rec.seen.empty());
  const doc::Observation& o = rec.seen.back();
  ASSERT_EQ(o.domains.size(), 2u);
  double share_fast = 0, share_slow = 0;
  for (const auto& d : o.domains) (d.devices.front().find("slow") == std::string::npos ? share_fast : share_slow) = d.traffic_share;
  EXPECT_NEAR(share_fast + share_slow, 1, 1e-9);
  EXPECT_GT(share_fast, 0.6);
  EXPECT_LT(share_fast, 0.7);
  // Each request waiting holds 2000 prompt tokens of backlog; one partly
  // prefilled may count whole, so the backlog is 2000 x the waiting and
  // at most 2000 x (waiting + running).
  double waiting = 0, running = 0;
  for (const auto& d : o.domains) waiting += d.waiting, running += d.running;
  EXPECT_GT(waiting, 0);
  EXPECT_GE(o.queued_prompt_tokens, 2000 * waiting);
  EXPECT_LE(o.queued_prompt_tokens, 2000 * (waiting + running));
}

TEST(EngineReplay, GearShifterReplayIsTheSameBytesAcrossRunsAndThreads) {
  // The whole output (each interval record, then the summary) of one
  // replay through the gear shifter with its seeded stagger (replicas 2),
  // long prompts routed to the largest TP and a seeded bursty synthetic
  // trace with drawn lengths on 18 GiB devices (KV pressure once the
  // planner sets aside graphs and NCCL buffers, as above): three runs,
  // two of them at once on two threads, give the same bytes. The run
  // shifts and preempts, so the comparison covers a shift's phases and the
  // scheduler's recomputes. Another trace seed, or another stagger seed,
  // gives other bytes: the comparison sees what changes.
  const doc::Topology topo = cluster(4, 18);
  plan::PlanOptions po;
  po.workload.concurrency = 1;
  po.workload.context = 2200;
  doc::GearTable t = table(topo, llama7b(), {"tp1:tp=1", "tp2:tp=2", "tp4:tp=4"}, po);
  t.gears[2].role = "memory-guard";
  control::PolicyConfig pc;
  pc.gear_shifter.replicas = 2;
  pc.gear_shifter.stagger_max_s = 20;
  pc.gear_shifter.seed = 11;
  sim::EngineReplayConfig ec;
  ec.shape = llama7b();
  ec.topology = topo;
  ec.long_prompt_tokens = 1500;
  control::ReplayConfig rc;
  rc.interval_s = 5;
  auto trace = [](std::uint64_t seed) {
    control::SyntheticConfig sc;
    sc.pattern = "steps:1,6,1@150";
    sc.burstiness = 2;
    sc.seed = seed;
    sc.prompt = control::parse_length_dist("lognormal:600,1", "p");
    sc.output = control::parse_length_dist("uniform:20,400", "o");
    return control::synthesize(sc);
  };
  const control::Trace tr = trace(3), other = trace(4);
  auto run = [&](const control::Trace& x, json::Json* summary = nullptr) {
    auto p = control::make_replay_policy(control::parse_policy_spec("gear-shifter"), t, pc);
    std::string out;
    const json::Json s = sim::replay_engine(x, *p, "gear-shifter", t, "tp1", rc, ec,
                                            [&](const json::Json& j) { out += json::dump(j, json::Style::short_) + "\n"; });
    if (summary) *summary = s;
    return out + json::dump(s, json::Style::short_) + "\n";
  };
  json::Json s;
  const std::string a = run(tr, &s);
  EXPECT_GE(s.at("shifts").get<int>(), 1) << json::dump(s, json::Style::short_);
  EXPECT_GT(s.at("preemptions").get<int>(), 0) << json::dump(s, json::Style::short_);
  EXPECT_GT(s.at("rejected").get<int>() + s.at("finished").get<int>(), 500);
  std::string b, c;
  std::thread tb([&] { b = run(tr); });
  std::thread tc([&] { c = run(tr); });
  tb.join();
  tc.join();
  EXPECT_EQ(a, run(tr));
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_NE(a, run(other));
  pc.gear_shifter.seed = 12;  // the stagger's: another start of the shift
  EXPECT_NE(a, run(tr));
}
