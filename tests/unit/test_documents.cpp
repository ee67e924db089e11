// SPDX-License-Identifier: Apache-2.0
// Round trips and validation of the JSON documents (lib/doc).
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "doc/cluster.hpp"
#include "doc/control.hpp"
#include "doc/gear_table.hpp"
#include "doc/kinds.hpp"
#include "doc/topology.hpp"

using namespace ftp::doc;
using ftp::json::Json;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ftp::InputError& e) {
    return e.what();
  }
  return "<no error>";
}

Topology sample_topology() {
  Topology t;
  t.source = "probe";
  t.name = "box";
  t.nodes.push_back(Host{"node0", "box", "Xeon", 8, 1, 32ull << 30});
  for (int i = 0; i < 2; ++i) {
    Device d;
    d.id = "vd" + std::to_string(i);
    d.type = "virtual";
    d.name = "Xeon / 2";
    d.node = "node0";
    d.parent = "cpu0";
    d.memory_bytes = 16ull << 30;
    d.compute_units = 4;
    d.gemm_tflop_s = 0.25;
    d.gemm_dtype = "f32";
    d.memory_bandwidth_gb_s = 9.5;
    d.perf_source = "measured";
    d.numa_node = 0;
    t.devices.push_back(d);
  }
  t.fabrics.push_back(Fabric{"shm0", "shared-memory", {"vd0", "vd1"}, 5.0, 3.0});
  t.links.push_back(Link{"vd0", "vd1", "shared-memory", 6.0, 2.0});
  AllReduce a{2, 1 << 20, 100.0, 10.5, allreduce_busbw(10.5, 2), 4.0, "inproc"};
  t.islands.push_back(Island{"island0", {"vd0", "vd1"}, a});
  return t;
}

Json sample_gear_table_json() {
  return Json::parse(R"({
    "kind": "ftp.gear-table/v1",
    "model": {"name": "stories260K", "n_layers": 5, "n_heads": 8, "n_kv_heads": 4},
    "topology": "box",
    "gears": [
      {"name": "economy", "tp": 1, "pp": 1, "dp": 1,
       "replicas": [{"stages": [{"layers": [0, 5], "devices": ["vd0"]}]}],
       "estimated": {"max_rps": 10, "source": "estimate"}},
      {"name": "standard", "tp": 2, "pp": 1, "dp": 1, "weight_mode": "release",
       "replicas": [{"stages": [{"layers": [0, 5], "devices": ["vd0", "vd1"]}]}]},
      {"name": "performance", "tp": 1, "pp": 2, "dp": 2, "micro_batches": 2,
       "replicas": [{"stages": [{"layers": [0, 3], "devices": ["vd0"]}, {"layers": [3, 5], "devices": ["vd1"]}]},
                    {"stages": [{"layers": [0, 2], "devices": ["vd2"]}, {"layers": [2, 5], "devices": ["vd3"]}]}],
       "future_field": {"ignored": true}}
    ],
    "unknown_top_level": 1
  })");
}

}  // namespace

TEST(Topology, RoundTrip) {
  Topology t = sample_topology();
  Json j = to_json(t);
  EXPECT_EQ(j["kind"], "ftp.topology/v1");
  Topology back = topology_from_json(j);
  EXPECT_EQ(to_json(back), j);
  EXPECT_EQ(back.devices[1].numa_node, 0);
  EXPECT_NEAR(back.islands[0].allreduce->busbw_gb_s, 10.5, 1e-12);  // 2(n-1)/n = 1 for n = 2
  EXPECT_EQ(back.link_between("vd1", "vd0")->bandwidth_gb_s, 6.0);  // the faster of link and fabric
}

TEST(Topology, BusbwFormula) {
  EXPECT_DOUBLE_EQ(allreduce_busbw(10, 4), 15);  // 10 x 2 x 3 / 4
  EXPECT_DOUBLE_EQ(allreduce_busbw(10, 8), 17.5);
  EXPECT_DOUBLE_EQ(allreduce_busbw(10, 1), 0);
}

TEST(Topology, ValidationNamesPath) {
  Json j = to_json(sample_topology());
  Json bad = j;
  bad["links"][0]["b"] = "gpu9";
  EXPECT_EQ(error_of([&] { topology_from_json(bad); }), "links[0].b: unknown device \"gpu9\"");
  bad = j;
  bad["devices"][1]["memory_bytes"] = -5;
  EXPECT_EQ(error_of([&] { topology_from_json(bad); }), "devices[1].memory_bytes: must be positive, got -5");
  bad = j;
  bad["devices"][1]["id"] = "vd0";
  EXPECT_EQ(error_of([&] { topology_from_json(bad); }), "devices[1].id: duplicate device \"vd0\"");
  bad = j;
  bad["kind"] = "ftp.gear-table/v1";
  EXPECT_EQ(error_of([&] { topology_from_json(bad); }),
            "kind: expected \"ftp.topology/v1\", got \"ftp.gear-table/v1\"");
  bad = j;
  bad["islands"].push_back(Json{{"id", "island1"}, {"devices", {"vd1"}}});
  EXPECT_EQ(error_of([&] { topology_from_json(bad); }),
            "islands[1].devices[0]: device \"vd1\" is already in island \"island0\"");
  bad = j;
  bad["devices"][0].erase("node");
  EXPECT_EQ(error_of([&] { topology_from_json(bad); }), "devices[0].node: missing required field");
}

TEST(GearTable, RoundTripIgnoresUnknownFields) {
  Json j = sample_gear_table_json();
  GearTable t = gear_table_from_json(j);
  ASSERT_EQ(t.gears.size(), 3u);
  EXPECT_EQ(t.gears[1].weight_mode, "release");
  EXPECT_EQ(t.gears[2].replicas[1].stages[1].first_layer, 2);
  EXPECT_EQ(t.gears[2].replicas[1].stages[1].n_layers, 3);
  EXPECT_DOUBLE_EQ(t.gears[0].estimated->safe_rps, 0.0);  // absent: 0, the policy's safe_fraction applies
  EXPECT_EQ(t.index_of("performance"), 2);
  Json out = to_json(t);
  EXPECT_FALSE(out["gears"][2].contains("future_field"));
  EXPECT_EQ(to_json(gear_table_from_json(out)), out);
  EXPECT_EQ(t.gears[2].devices(), (std::vector<std::string>{"vd0", "vd1", "vd2", "vd3"}));
}

TEST(GearTable, ValidationNamesPath) {
  Json j = sample_gear_table_json();
  Json bad = j;
  // A layer bound past INT_MAX does not wrap into range (4294967301 = 2^32 + 5).
  bad["gears"][0]["replicas"][0]["stages"][0]["layers"] = Json::array({0, 4294967301LL});
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "gears[0].replicas[0].stages[0].layers: expected 0 <= first < end <= 2147483647, got [0, 4294967301]",
                      error_of([&] { gear_table_from_json(bad); }));
  bad = j;
  bad["gears"][2]["tp"] = 3;
  // n_heads = 8 is checked first: 3 does not divide it.
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }), "gears[2].tp: must divide n_heads (8), got 3");
  bad = j;
  bad["model"]["n_heads"] = 12;
  bad["model"]["n_kv_heads"] = 4;
  bad["gears"][2]["tp"] = 3;
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }), "gears[2].tp: must divide n_kv_heads (4), got 3");
  bad = j;
  bad["model"]["n_heads"] = 12;
  bad["model"]["n_kv_heads"] = 4;
  bad["gears"][2]["tp"] = 6;
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }),
            "gears[2].tp: must divide n_kv_heads (4) or be a multiple of it, got 6");
  bad = j;
  bad["gears"][1]["name"] = "economy";
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }), "gears[1].name: duplicate gear \"economy\"");
  bad = j;
  bad["gears"][2]["replicas"][1]["stages"][1]["layers"] = Json::array({3, 5});
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }),
            "gears[2].replicas[1].stages[1].layers: must start at layer 2 (stages are contiguous), got 3");
  bad = j;
  bad["gears"][2]["replicas"][1]["stages"][1]["layers"] = Json::array({2, 4});
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }),
            "gears[2].replicas[1].stages: layers end at 4, the model has 5");
  bad = j;
  bad["gears"][2]["dp"] = 3;
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }), "gears[2].replicas: expected dp (3) replicas, got 2");
  bad = j;
  bad["gears"][1]["replicas"][0]["stages"][0]["devices"] = Json::array({"vd0", "vd0"});
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }),
            "gears[1].replicas[0].stages[0].devices[1]: device \"vd0\" already serves another rank of this gear");
  bad = j;
  bad["gears"][0]["kv_cache_cap"] = 1.5;
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }), "gears[0].kv_cache_cap: must be in (0, 1], got 1.5");
  bad = j;
  bad["gears"][0]["estimated"]["safe_rps"] = 20;
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }),
            "gears[0].estimated.safe_rps: must not exceed max_rps (10.0), got 20.0");
  bad = j;
  bad["gears"][0]["weight_mode"] = "copy";
  EXPECT_EQ(error_of([&] { gear_table_from_json(bad); }),
            "gears[0].weight_mode: must be one of resident, release, got \"copy\"");
}

TEST(GearTable, AgainstTopology) {
  Topology topo = sample_topology();
  Json j = sample_gear_table_json();
  j["gears"].erase(2);  // the performance gear names vd2 and vd3, which this topology lacks
  GearTable t = gear_table_from_json(j);
  EXPECT_NO_THROW(validate_against(t, topo));
  GearTable full = gear_table_from_json(sample_gear_table_json());
  EXPECT_EQ(error_of([&] { validate_against(full, topo); }),
            "gears[2].replicas[1].stages[0].devices[0]: unknown device \"vd2\" in topology \"box\"");
  topo.islands[0].devices = {"vd0"};
  topo.islands.push_back(Island{"island1", {"vd1"}, std::nullopt});
  EXPECT_EQ(error_of([&] { validate_against(t, topo); }),
            "gears[1].replicas[0].stages[0].devices: the tensor-parallel group must stay inside one island, "
            "\"vd1\" is in island \"island1\"");
}

TEST(Capacity, RoundTrip) {
  Capacity c{"standard", 12.5, 10.0, 900, 720, 5000, 1200, "bench", 42000, 300};
  Json j = to_json(c);
  EXPECT_EQ(j["kind"], "ftp.capacity/v1");
  EXPECT_EQ(to_json(capacity_from_json(j)), j);
  j.erase("gear");
  EXPECT_EQ(error_of([&] { capacity_from_json(j); }), "gear: missing required field");
}

TEST(Observation, RoundTrip) {
  Observation o;
  o.t_ms = 123456;
  o.gear = "standard";
  o.shifting = true;
  o.queue_depth = 3;
  o.queue_depth_mean = 2.5;
  o.est_queue_time_ms = 40;
  o.request_rate = 7.5;
  o.predicted_rate = 8.25;
  o.prompt_token_rate = 3840;
  o.decode_token_rate = 960;
  o.mean_prompt_tokens = 512;
  o.mean_output_tokens = 128;
  o.bubble_ratio = 0.125;
  o.contention_index = 0.0625;
  o.kv_watermark = 0.5;
  o.ttft_ms = {100, 400};
  o.tpot_ms = {20, 35};
  o.e2e_ms = {2000, 6000};
  o.devices = {{"vd0", 0.75}, {"vd1", 0.5}};
  o.domains = {{"d1", "standard", ftp::doc::DomainState::serving, {"vd0", "vd1"}, 0.9, 4, 1},
               {"d2", "performance", ftp::doc::DomainState::warming, {"vd2", "vd3"}, 0.1, 0, 0}};
  Json j = to_json(o);
  EXPECT_EQ(to_json(observation_from_json(j)), j);
  EXPECT_EQ(observation_from_json(j).prompt_token_rate, 3840);
  Json old = j;  // an observation from before the token rates: they read 0
  old.erase("prompt_token_rate");
  old.erase("decode_token_rate");
  EXPECT_EQ(observation_from_json(old).decode_token_rate, 0);
  EXPECT_FALSE(j.contains("lost_devices")) << "only while a device is lost";
  o.lost_devices = {{"n2/vd0", "member n2 lost (connection closed)"}};
  const Json lost = to_json(o);
  EXPECT_EQ(lost["lost_devices"][0]["id"], "n2/vd0");
  EXPECT_EQ(observation_from_json(lost).lost_devices.at(0).why, "member n2 lost (connection closed)");
  EXPECT_EQ(to_json(observation_from_json(lost)), lost);
  Json bad = j;
  bad["kv_watermark"] = 1.25;
  EXPECT_EQ(error_of([&] { observation_from_json(bad); }), "kv_watermark: must be a ratio in [0, 1], got 1.25");
  bad = j;
  bad["domains"][1]["state"] = "sleeping";
  EXPECT_EQ(error_of([&] { observation_from_json(bad); }),
            "domains[1].state: must be one of warming, serving, draining, retired, got \"sleeping\"");
  bad = j;
  bad["ttft_ms"]["p99"] = 50;
  EXPECT_EQ(error_of([&] { observation_from_json(bad); }), "ttft_ms.p99: must not be below p50");
}

TEST(Decision, RoundTrip) {
  Decision d;
  d.t_ms = 5000;
  d.action = "shift";
  d.from = "standard";
  d.to = "performance";
  d.policy = "gear-shifter";
  d.reason = "forecast 0.92 of safe capacity for 3 observations";
  d.signals = {{"forecast_load", 0.92, 0.85, true}, {"queue_time", 120, 100, true}, {"kv_watermark", 0.4, 0.9, false}};
  d.not_before_ms = 65000;
  Json j = to_json(d);
  EXPECT_EQ(to_json(decision_from_json(j)), j);
  Json bad = j;
  bad.erase("to");
  EXPECT_EQ(error_of([&] { decision_from_json(bad); }), "to: missing required field");
  bad = j;
  bad["action"] = "jump";
  EXPECT_EQ(error_of([&] { decision_from_json(bad); }), "action: must be one of hold, shift, got \"jump\"");
  Decision hold;
  hold.t_ms = 1;
  hold.from = "standard";
  hold.policy = "tp-planner";
  Json hj = to_json(hold);
  EXPECT_FALSE(hj.contains("to"));
  EXPECT_FALSE(hj.contains("ramp"));
  EXPECT_FALSE(hj.contains("ramp_step_ms"));
  EXPECT_EQ(to_json(decision_from_json(hj)), hj);
  // A decision's own ramp (the gear shifter's urgent path).
  d.ramp = {0.5, 1.0};
  d.ramp_step_ms = 500;
  j = to_json(d);
  EXPECT_EQ(j.at("ramp"), Json::array({0.5, 1.0}));
  EXPECT_EQ(j.at("ramp_step_ms"), 500);
  const Decision back = decision_from_json(j);
  EXPECT_EQ(back.ramp, d.ramp);
  EXPECT_EQ(back.ramp_step_ms, 500);
  bad = j;
  bad["ramp"] = Json::array({0.5, 0.4, 1.0});
  EXPECT_EQ(error_of([&] { decision_from_json(bad); }), "ramp[1]: a ramp's shares increase within (0, 1], got 0.4");
  bad["ramp"] = Json::array({0.5});
  EXPECT_EQ(error_of([&] { decision_from_json(bad); }), "ramp: a ramp ends at 1 (100 %)");
}

TEST(ShiftEvent, RoundTrip) {
  ShiftEvent e;
  e.shift_id = "shift-3";
  e.t_ms = 99000;
  e.phase = ftp::doc::ShiftPhase::done;
  e.from = "standard";
  e.to = "performance";
  e.trigger = "policy:gear-shifter";
  e.traffic_share = 1.0;
  e.phase_ms = 250;
  e.outcome = ftp::doc::ShiftOutcome::committed;
  e.message = "ok";
  e.before = Percentiles{2000, 9000};
  e.after = Percentiles{1500, 5000};
  Json j = to_json(e);
  EXPECT_EQ(to_json(shift_event_from_json(j)), j);
  Json bad = j;
  bad["phase"] = "ramp";
  EXPECT_EQ(error_of([&] { shift_event_from_json(bad); }),
            "outcome: only the \"done\" record carries an outcome, this is phase \"ramp\"");
  bad = j;
  bad.erase("outcome");
  EXPECT_EQ(error_of([&] { shift_event_from_json(bad); }), "outcome: missing required field");
}

// The warm record's warm-up facts (issue 17): kept through the journal's JSON;
// a batch size below 1 is refused by its index.
TEST(ShiftEvent, WarmRecordKeepsItsWarmUp) {
  ShiftEvent e;
  e.shift_id = "shift-4";
  e.phase = ftp::doc::ShiftPhase::warm;
  e.from = "economy";
  e.to = "standard";
  e.communicators_created = 0;
  e.communicator_ms = 0;
  e.warm_batch_sizes = std::vector<int>{1, 2, 4, 8};
  e.graphs_captured = 4;
  e.warmup_ms = 12.5;
  const Json j = to_json(e);
  EXPECT_EQ(j["warm_batch_sizes"], Json::parse("[1, 2, 4, 8]"));
  EXPECT_EQ(j["graphs_captured"], 4);
  const ShiftEvent back = shift_event_from_json(j);
  EXPECT_EQ(back.warm_batch_sizes, e.warm_batch_sizes);
  EXPECT_EQ(back.graphs_captured, e.graphs_captured);
  EXPECT_EQ(back.warmup_ms, e.warmup_ms);
  EXPECT_EQ(to_json(back), j);
  Json bad = j;
  bad["warm_batch_sizes"] = Json::parse("[1, 0]");
  EXPECT_EQ(error_of([&] { shift_event_from_json(bad); }),
            "warm_batch_sizes[1]: a batch size must be between 1 and 2147483647, got 0");
}

TEST(ClusterSpec, FabricsIslandsAndMig) {
  Json spec = Json::parse(R"({
    "kind": "ftp.cluster/v1", "name": "mix",
    "nodes": [
      {"id": "a", "devices": [{"id": "gpu", "count": 4, "type": "gpu", "name": "A800", "memory_gib": 80,
                               "tflop_s": 312, "memory_bandwidth_gb_s": 2039, "compute_units": 108}]},
      {"id": "b", "devices": [
         {"id": "t4", "count": 2, "type": "gpu", "name": "T4", "memory_gib": 16, "tflop_s": 65, "memory_bandwidth_gb_s": 320},
         {"id": "a100", "type": "gpu", "name": "A100", "memory_gib": 40, "tflop_s": 312, "memory_bandwidth_gb_s": 1555,
          "compute_units": 108,
          "mig": [{"id": "mig0", "profile": "3g.20gb", "memory_gib": 20}, {"id": "mig1", "profile": "4g.20gb", "memory_gib": 20}]}]}
    ],
    "fabrics": [
      {"type": "nvlink", "nodes": ["a"], "bandwidth_gb_s": 200, "latency_us": 2},
      {"type": "pcie", "devices": ["b.t40", "b.t41"], "bandwidth_gb_s": 16, "latency_us": 5},
      {"type": "ethernet", "nodes": ["a", "b"], "bandwidth_gb_s": 3.125, "latency_us": 30}
    ]
  })");
  Topology t = topology_from_cluster_spec(spec);
  EXPECT_EQ(t.source, "cluster-spec");
  ASSERT_EQ(t.devices.size(), 8u);
  EXPECT_EQ(t.devices[0].id, "a.gpu0");
  EXPECT_EQ(t.devices[6].id, "b.a100.mig0");
  EXPECT_EQ(t.devices[6].type, "mig");
  EXPECT_EQ(t.devices[6].parent, "b.a100");
  EXPECT_NEAR(t.devices[6].gemm_tflop_s, 312 * 3.0 / 7.0, 1e-9);
  EXPECT_NEAR(t.devices[6].memory_bandwidth_gb_s, 1555 / 2.0, 1e-9);
  // Islands: the four A800s, the two T4s, and each MIG slice alone; ethernet joins none.
  ASSERT_EQ(t.islands.size(), 4u);
  EXPECT_EQ(t.islands[0].devices.size(), 4u);
  EXPECT_EQ(t.islands[1].devices, (std::vector<std::string>{"b.t40", "b.t41"}));
  EXPECT_NEAR(t.islands[0].allreduce->busbw_gb_s, 200, 1e-9);
  EXPECT_NEAR(t.islands[0].allreduce->algbw_gb_s, 200 * 4 / 6.0, 1e-9);
  EXPECT_FALSE(t.islands[2].allreduce.has_value());
  EXPECT_EQ(t.link_between("a.gpu0", "b.t41")->type, "ethernet");
  EXPECT_EQ(t.link_between("a.gpu0", "a.gpu3")->type, "nvlink");
  // The output is a valid topology document.
  EXPECT_EQ(to_json(topology_from_json(to_json(t))), to_json(t));
}

TEST(ClusterSpec, ErrorsNamePath) {
  Json base = Json::parse(R"({"kind": "ftp.cluster/v1", "nodes": [
      {"id": "n0", "devices": [{"id": "gpu", "count": 2, "type": "gpu", "name": "X", "memory_gib": 8,
                                "tflop_s": 10, "memory_bandwidth_gb_s": 100}]}],
      "fabrics": [{"type": "pcie", "nodes": ["n0"], "bandwidth_gb_s": 16, "latency_us": 5}]})");
  EXPECT_NO_THROW(topology_from_cluster_spec(base));
  Json bad = base;
  bad["nodes"][0]["devices"][0]["memory_gib"] = -8;
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }),
            "nodes[0].devices[0].memory_gib: must be positive, got -8");
  bad = base;
  bad["nodes"][0]["devices"][0].erase("tflop_s");
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }), "nodes[0].devices[0].tflop_s: missing required field");
  bad = base;
  bad["fabrics"][0] = Json::parse(R"({"type": "nvlink", "devices": ["n0.gpu0", "n0.gpu7"], "bandwidth_gb_s": 1, "latency_us": 1})");
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }), "fabrics[0].devices[1]: unknown device \"n0.gpu7\"");
  bad = base;
  bad["fabrics"][0]["nodes"] = Json::array({"n9"});
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }), "fabrics[0].nodes[0]: unknown node \"n9\"");
  bad = base;
  bad["nodes"][0]["devices"][0]["type"] = "tpu";
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }),
            "nodes[0].devices[0].type: must be one of gpu, cpu, got \"tpu\"");
  bad = base;
  bad["nodes"][0]["devices"][0]["mig"] = Json::parse(R"([{"id": "m", "profile": "9g.99gb", "memory_gib": 4}])");
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }),
            "nodes[0].devices[0].mig[0].profile: expected a MIG profile like \"3g.40gb\" (1..7 compute slices), got \"9g.99gb\"");
  bad = base;
  bad["links"] = Json::parse(R"([{"a": "n0.gpu0", "b": "n0.gpu5", "type": "pcie", "bandwidth_gb_s": 1, "latency_us": 1}])");
  EXPECT_EQ(error_of([&] { topology_from_cluster_spec(bad); }), "links[0].b: unknown device \"n0.gpu5\"");
}
