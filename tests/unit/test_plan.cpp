// SPDX-License-Identifier: Apache-2.0
// The planner (lib/plan): model shapes, cost-model formulas, layer split,
// gear enumeration and the chosen table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "core/error.hpp"
#include "doc/cluster.hpp"
#include "doc/gear_table.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"
#include "plan/planner.hpp"

using namespace ftp::plan;
using ftp::json::Json;

namespace {

std::string source_root() {
  const char* s = std::getenv("FTP_SOURCE_ROOT");
  return s ? s : ".";
}

ModelShape model(const std::string& name) { return read_model_shape(source_root() + "/examples/models/" + name + ".json"); }

ftp::doc::Topology cluster(const std::string& name) {
  return ftp::doc::topology_from_cluster_spec(ftp::json::read_file(source_root() + "/examples/clusters/" + name + ".json"));
}

std::string input_error(const Json& j) {
  try {
    model_shape_from_json(j);
  } catch (const ftp::InputError& e) {
    return e.what();
  }
  return "<no error>";
}

Json stories_json() {
  return Json::parse(R"({"kind": "ftp.model-shape/v1", "name": "s", "n_layers": 5, "n_heads": 8, "n_kv_heads": 4,
    "hidden_size": 64, "intermediate_size": 172, "vocab_size": 512, "dtype": "f32", "context_length": 512,
    "tie_embeddings": true})");
}

GroupPerf a100(int tp = 1) {
  GroupPerf g;
  g.tp = tp;
  g.tflop_s = 300;
  g.gb_s = 2000;
  g.busbw_gb_s = 100;
  g.allreduce_latency_us = 10;
  g.memory_bytes = 80'000'000'000ull;
  return g;
}

}  // namespace

TEST(ModelShape, ParameterCountsOfTheExamples) {
  EXPECT_EQ(model("llama-7b").n_params, 6738415616ull);     // Llama-2 7B
  EXPECT_EQ(model("llama-70b").n_params, 68976648192ull);   // Llama-2 70B
  ModelShape s = model("stories260K");
  EXPECT_EQ(s.n_params, 260032ull);  // the trained parameters of stories260K.bin
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.kv_bytes_per_token_layer(), 2.0 * 4 * 8 * 2);  // 16-bit KV by default, f32 weights too
  EXPECT_EQ(model("llama-70b").kv_bytes_per_token_layer(2), 2.0 * 4 * 128 * 2);
  EXPECT_EQ(model("llama-70b").kv_bytes_per_token_layer(16), 2.0 * 1 * 128 * 2);  // KV heads replicated
}

TEST(ModelShape, ErrorsNameThePath) {
  Json j = stories_json();
  j.erase("hidden_size");
  EXPECT_EQ(input_error(j), "hidden_size: missing required field");
  j = stories_json();
  j["n_kv_heads"] = 3;
  EXPECT_EQ(input_error(j), "n_kv_heads: must divide n_heads (8), got 3");
  j = stories_json();
  j["dtype"] = "int4";
  EXPECT_NE(input_error(j).find("dtype: "), std::string::npos);
  j = stories_json();
  j["kind"] = "ftp.topology/v1";
  EXPECT_NE(input_error(j).find("kind: expected \"ftp.model-shape/v1\""), std::string::npos);
  j = stories_json();
  j.erase("dtype");
  EXPECT_EQ(input_error(j), "dtype: missing required field");
  j["bytes_per_param"] = 2;
  EXPECT_EQ(model_shape_from_json(j).bytes_per_param, 2);
}

TEST(CostModel, AllReduceAndBubble) {
  // ring: 2(n-1)/n x bytes / busbw + latency = 1.5 x 1e6 / 100e9 + 10 us
  EXPECT_NEAR(allreduce_time_s(4, 1e6, 100, 10), 1.5e-5 + 1e-5, 1e-12);
  EXPECT_EQ(allreduce_time_s(1, 1e9, 100, 10), 0);
  EXPECT_NEAR(pipeline_bubble(4, 4), 3.0 / 7.0, 1e-12);
  EXPECT_EQ(pipeline_bubble(1, 8), 0);
  EXPECT_NEAR(p2p_time_s(25e6, 25, 5), 1e-3 + 5e-6, 1e-12);
}

TEST(CostModel, DecodeIsMemoryBound) {
  ModelShape m = model("llama-7b");
  StageSpan all{32, true, false};
  const double p = 32 * 202383360.0;  // compute params: layers only (no head on a non-last stage)
  EXPECT_DOUBLE_EQ(stage_compute_params(m, all), p);
  // weights 2 p bytes + KV 1 seq x 1000 tokens x 32 layers x 16384 B, at 2000 GB/s x 0.7
  const double bytes = 2 * p + 1000.0 * 32 * 16384;
  EXPECT_NEAR(decode_time_s(m, all, a100(), 1, 1000), bytes / 1.4e12 + 32 * kLayerOverheadS, 1e-9);
}

TEST(CostModel, PrefillIsComputeBoundWithAllReduce) {
  ModelShape m = model("llama-7b");
  StageSpan all{32, true, false};
  const double p = 32 * 202383360.0;
  const double compute = 2 * p * 1000 / (2 * 300e12 * 0.5);
  // two all-reduces per layer of hidden x tokens x 2 bytes over 2 ranks
  const double ar = (2.0 * 1 / 2 * 4096 * 1000 * 2) / 100e9 + 10e-6;
  EXPECT_NEAR(prefill_time_s(m, all, a100(2), 1000), compute + 64 * ar + 32 * kLayerOverheadS, 1e-9);
}

TEST(CostModel, KernelPassesAreTilesAndPowerOfTwoEdges) {
  // A kernel of 4 rows, the remainder in kernels of 2 and 1 (OpenBLAS's SGEMM).
  const double want[] = {0, 1, 1, 2, 1, 2, 2, 3, 2, 3, 3, 4, 3, 4, 4, 5, 4};
  for (int t = 0; t <= 16; ++t) EXPECT_EQ(kernel_passes(t, 4), want[t]) << t << " rows";
  EXPECT_EQ(kernel_passes(256, 4), 64);
  EXPECT_EQ(kernel_passes(17, 16), 2);
  EXPECT_EQ(kernel_passes(5, 0), 0);  // no tile: no pass term
  // Beyond the rows' share of full tiles: none for whole tiles.
  EXPECT_DOUBLE_EQ(extra_passes(3, 4), 1.25);
  EXPECT_DOUBLE_EQ(extra_passes(8, 4), 0);
  EXPECT_DOUBLE_EQ(extra_passes(1, 4), 0.75);
  EXPECT_DOUBLE_EQ(extra_passes(256, 4), 0);
  EXPECT_DOUBLE_EQ(extra_passes(15, 4), 1.25);
}

TEST(CostModel, KernelPassesStreamTheWeightsOnceMore) {
  ModelShape m = model("llama-7b");
  StageSpan last{32, false, true};
  GroupPerf g = a100();
  Calibration c;
  c.overlap = false;
  const StepWork w{3, 3 * 100, 3 * 101, 3};  // three decode rows: passes of 2 and 1, 1.25 beyond 3/4 of a tile
  const double without = step_time_s(m, last, g, w, c);
  c.row_tile = 4;
  c.pass_efficiency = 5;
  const double bytes = (32 * m.layer_params() + m.head_params()) * 1.25 * m.bytes_per_param;
  EXPECT_DOUBLE_EQ(pass_bytes(m, last, 1, w, 4), bytes);
  EXPECT_NEAR(step_time_s(m, last, g, w, c) - without, bytes / (2000e9 * 5), 1e-12);
  // The head runs on the logits rows alone: a prefill chunk of 256 tokens
  // (whole tiles: no extra pass), one row (0.75 beyond its quarter tile).
  const StepWork prefill{256, 256 * 128, 256, 1};
  EXPECT_DOUBLE_EQ(pass_bytes(m, last, 2, prefill, 4), m.head_params() * 0.75 * m.bytes_per_param / 2);
}

TEST(CostModel, MemoryAndReplicaThroughput) {
  ModelShape m = model("llama-7b");
  Workload w = resolve(Workload{}, m);
  EXPECT_EQ(w.prompt_tokens, 512);
  EXPECT_EQ(w.output_tokens, 128);
  EXPECT_EQ(w.context, 4096);
  StageSpan all{32, true, true};
  StageMemory mem = stage_memory(m, all, a100(), w, 8, 4096);
  // The whole model, untied: 16-bit matrices, float32 norms (2 per layer and the final one, of 4096).
  EXPECT_NEAR(mem.weights, 2.0 * m.n_params + 2.0 * (32 * 2 + 1) * 4096, 1.0);
  EXPECT_NEAR(mem.kv_needed, 8.0 * 4096 * 32 * 2 * 32 * 128 * 2, 1.0);
  EXPECT_NEAR(mem.need, mem.weights + mem.activations + mem.kv_needed / 0.7, 1.0);
  EXPECT_NEAR(mem.kv_pool, 0.7 * (80e9 - mem.weights - mem.activations), 1.0);
  EXPECT_TRUE(mem.fits(80'000'000'000ull));
  EXPECT_FALSE(mem.fits(16'000'000'000ull));

  // One stage: rps = B / (prefill(B x 512) + 128 x decode(B, 576)).
  ReplicaEstimate e = estimate_replica(m, {ReplicaStage{all, a100(), 0, 0}}, w, 64 * 640.0);
  EXPECT_EQ(e.batch, 64);
  const double prefill = prefill_time_s(m, all, a100(), 64 * 512 / 16.0) * 16;  // 16 chunks of 2048 tokens
  const double round = decode_time_s(m, all, a100(), 64, 512 + 64);
  EXPECT_NEAR(e.prefill_s, prefill, 1e-12);
  EXPECT_NEAR(e.decode_round_s, round, 1e-12);
  EXPECT_NEAR(e.rps, 64 / (prefill + 128 * round), 1e-9);
  EXPECT_NEAR(e.tokens_s, e.rps * 128, 1e-9);
}

TEST(CostModel, ShortContextShrinksTheReferenceRequest) {
  Workload w = resolve(Workload{}, model("stories260K"));
  EXPECT_EQ(w.prompt_tokens + w.output_tokens, 512);
  Workload bad;
  bad.prompt_tokens = 500;
  bad.output_tokens = 100;
  EXPECT_THROW(resolve(bad, model("stories260K")), ftp::InputError);
}

TEST(Planner, StageSplitGivesFastDevicesMoreLayers) {
  ftp::doc::Topology t = cluster("flexpipe-fragmented");
  ModelShape m = model("llama-7b");
  Workload w = resolve(Workload{}, m);
  auto group = [&](std::vector<std::string> ids) { return StageGroup{ids, group_perf(t, ids)}; };
  LayerSplit a = split_layers(m, {group({"m0.l40s"}), group({"m1.t40"})}, w, 1, 4096);
  ASSERT_TRUE(a.fits);
  EXPECT_EQ(a.layers[0] + a.layers[1], 32);
  EXPECT_GT(a.layers[0], a.layers[1]);  // L40S (864 GB/s) over T4 (320 GB/s)
  LayerSplit b = split_layers(m, {group({"m1.a100.mig1"}), group({"m0.a8000"})}, w, 1, 4096);
  ASSERT_TRUE(b.fits);
  EXPECT_LT(b.layers[0], b.layers[1]);  // a 2g.10gb MIG slice takes fewer than an A800
  // Equal devices split evenly.
  LayerSplit c = split_layers(m, {group({"m0.a8000"}), group({"m0.a8001"})}, w, 1, 4096);
  EXPECT_EQ(c.layers, (std::vector<int>{16, 16}));
  // Too big for two T4s: the device short and by how much.
  LayerSplit d = split_layers(model("llama-70b"), {group({"m1.t40"}), group({"m1.t41"})}, w, 1, 4096);
  EXPECT_FALSE(d.fits);
  EXPECT_EQ(d.device.substr(0, 5), "m1.t4");
  EXPECT_GT(d.need_bytes, d.have_bytes);
}

TEST(Planner, TensorParallelNeverCrossesIslands) {
  for (const char* c : {"two-nodes-4gpu-100g", "flexpipe-fragmented", "a100-8x-nvlink"}) {
    ftp::doc::Topology t = cluster(c);
    Plan p = plan(t, model("llama-70b"), PlanOptions{});
    ASSERT_FALSE(p.candidates.empty());
    for (const auto& cand : p.candidates) {
      EXPECT_EQ(64 % cand.gear.tp, 0);
      for (const auto& r : cand.gear.replicas)
        for (const auto& s : r.stages) {
          std::set<int> islands;
          for (const auto& d : s.devices) islands.insert(t.island_of(d));
          EXPECT_EQ(islands.size(), 1u) << c;
        }
    }
    EXPECT_NO_THROW(ftp::doc::validate_against(p.table, t));
  }
}

// A TP degree must split the KV heads evenly (or replicate them evenly):
// with 12 query heads and 4 KV heads on 8 devices, TP 3 and 6 divide the
// query heads but not the KV heads, so only TP 1, 2 and 4 are candidates.
TEST(Planner, TensorParallelSplitsTheKvHeadsEvenly) {
  Json j = stories_json();
  j["n_heads"] = 12;
  j["n_kv_heads"] = 4;
  j["hidden_size"] = 96;
  const ModelShape m = model_shape_from_json(j);
  Plan p = plan(cluster("a100-8x-nvlink"), m, PlanOptions{});
  std::set<int> tps;
  for (const auto& cand : p.candidates) tps.insert(cand.gear.tp);
  EXPECT_EQ(tps, (std::set<int>{1, 2, 4}));
}

TEST(Planner, TableIsOrderedAndValidates) {
  ftp::doc::Topology t = cluster("a100-8x-nvlink");
  for (const char* name : {"llama-7b", "llama-70b"}) {
    Plan p = plan(t, model(name), PlanOptions{});
    const auto& g = p.table.gears;
    ASSERT_GE(g.size(), 3u) << name;
    EXPECT_EQ(g[0].name, "economy");
    EXPECT_EQ(g[1].name, "standard");
    EXPECT_EQ(g[2].name, "performance");
    for (std::size_t i = 1; i < 3; ++i) {
      EXPECT_LE(g[i - 1].devices().size(), g[i].devices().size()) << name;
      EXPECT_LT(g[i - 1].estimated->max_rps, g[i].estimated->max_rps) << name;
    }
    for (const auto& gear : g) {
      ASSERT_TRUE(gear.estimated);
      EXPECT_NEAR(gear.estimated->safe_rps, 0.8 * gear.estimated->max_rps, 1e-9);
      EXPECT_EQ(gear.estimated->source, "estimate");
    }
    // Round trip through the document, then against the topology.
    ftp::doc::GearTable back = ftp::doc::gear_table_from_json(ftp::doc::to_json(p.table));
    EXPECT_EQ(back.gears.size(), g.size());
    EXPECT_NO_THROW(ftp::doc::validate_against(back, t));
  }
  // 70B needs at least two 80 GB cards: the economy gear has two devices.
  Plan p70 = plan(t, model("llama-70b"), PlanOptions{});
  EXPECT_EQ(p70.table.gears[0].devices().size(), 2u);
}

TEST(Planner, MaxGearsOneKeepsOneStandardGear) {
  PlanOptions o;
  o.max_gears = 1;
  Plan p = plan(cluster("a100-8x-nvlink"), model("llama-7b"), o);
  ASSERT_EQ(p.table.gears.size(), 1u);
  EXPECT_EQ(p.table.gears[0].name, "standard");
}

TEST(Planner, NothingFitsSaysWhichDeviceAndHowShort) {
  ftp::doc::Topology t = cluster("two-nodes-4gpu-100g");
  ModelShape m = model("llama-70b");
  m.n_params *= 6;  // about 414 GB of weights: more than 8 x 40 GiB
  try {
    plan(t, m, PlanOptions{});
    FAIL() << "no error";
  } catch (const ftp::InputError&) {
    FAIL() << "an unfit model is a failure (exit 1), not a usage error";
  } catch (const ftp::Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.exit(), ftp::Exit::failure);
    EXPECT_NE(msg.find("no gear fits: llama-70b needs 827.7 GB of weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GB short on device n"), std::string::npos) << msg;
  }
}
