// SPDX-License-Identifier: Apache-2.0
// Per-device bytes of a gear table (lib/plan/device_memory): the union of
// each device's weight shards over the gears, nested rank placement, and
// the refusal naming the device that does not fit. Expected bytes are
// written from the shapes by hand (the rows and columns each rank views),
// not from the function under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/json.hpp"
#include "doc/cluster.hpp"
#include "doc/gear_table.hpp"
#include "plan/cost_model.hpp"
#include "plan/device_memory.hpp"
#include "plan/model_shape.hpp"
#include "plan/planner.hpp"

using namespace ftp::plan;

namespace {

std::string source_root() {
  const char* s = std::getenv("FTP_SOURCE_ROOT");
  return s ? s : ".";
}

ModelShape model(const std::string& name) { return read_model_shape(source_root() + "/examples/models/" + name + ".json"); }

ftp::doc::GearTable table(const std::string& name) {
  return ftp::doc::gear_table_from_json(ftp::json::read_file(source_root() + "/examples/gears/" + name + ".json"));
}

const DeviceMemory& of(const std::vector<DeviceMemory>& mem, const std::string& dev) {
  auto it = std::find_if(mem.begin(), mem.end(), [&](const DeviceMemory& d) { return d.device == dev; });
  if (it == mem.end()) throw std::runtime_error("no row for " + dev);
  return *it;
}

Workload small() {
  Workload w;
  w.concurrency = 1;
  w.context = 64;
  w.max_batched_tokens = 64;
  return w;
}

/// TinyLlama 1.1B's shape planned as TP 1, 2, 4 and 8 on eight A100s, and
/// the table's per-device bytes.
struct TpLadder {
  ModelShape m;
  ftp::doc::Topology topo;
  Plan p;
  std::vector<DeviceMemory> mem;
};
TpLadder tinyllama_tp_ladder() {
  TpLadder l;
  l.m = model("tinyllama-1.1b");
  l.topo = ftp::doc::topology_from_cluster_spec(
      ftp::json::read_file(source_root() + "/examples/clusters/a100-8x-nvlink.json"));
  PlanOptions o;
  for (int tp : {1, 2, 4, 8}) o.layouts.push_back(parse_layout("tp" + std::to_string(tp) + ":tp=" + std::to_string(tp)));
  l.p = plan(l.topo, l.m, o);
  l.mem = device_memory(l.m, l.p.table, l.topo, resolve(o.workload, l.m));
  return l;
}

}  // namespace

// stories260K's shape (dim 64, 8 heads of 8, 4 KV heads, feed-forward 172,
// vocabulary 512, tied head, F32) by hand: a layer at TP t holds rows of
// wq (64/t x 8), wk and wv (KV heads x 8 each), columns of wo (as wq's),
// rows of gate and up and columns of down (172 split 43 each at TP 4, 22,
// 22, 22, 22, 21, .. at TP 8), and both norms (64 each), all times 64.
TEST(ShardUnion, NestedShardsAddNothingAndOthersAdd) {
  const ModelShape m = model("stories260K");
  const double emb = 512 * 64, f32 = 4;
  // TP 2 rank 1 (q [32, 64), KV [16, 32), ff [86, 172)) with TP 4 rank 2
  // (q [32, 48), ff [86, 129), vocabulary [256, 384)) inside it: rank 1's
  // bytes, with its vocabulary rows [256, 512) of the embedding (first
  // stage) and of the head (last stage; tied: the same rows) and the final norm.
  const double tp2r1 = 64 * (32 + 2 * 16 + 32 + 2 * 86 + 86 + 2);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 5, 2, 1, true, true}, {0, 5, 4, 2, true, true}}), (5 * tp2r1 + emb / 2 + 64) * f32);
  // TP 4 rank 1 (q [16, 32), KV [8, 16), ff [43, 86), vocabulary [128, 256))
  // is not inside: q 48, KV 24, ff 129, vocabulary 384.
  const double wide = 64 * (48 + 2 * 24 + 48 + 2 * 129 + 129 + 2);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 5, 2, 1, true, true}, {0, 5, 4, 1, true, true}}), (5 * wide + emb * 3 / 4 + 64) * f32);
  // One shard, rank 0 of TP 4 of a last stage: it holds its vocabulary rows
  // [0, 128) of the head (tied: the embedding's) and the final norm;
  // stage_memory's weights are its.
  const double tp4r0 = 64 * (16 + 2 * 8 + 16 + 2 * 43 + 43 + 2);
  GroupPerf g;
  g.tp = 4;
  const StageMemory sm = stage_memory(m, StageSpan{3, false, true}, g, small(), 1, 64);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{2, 3, 4, 0, false, true}}), (3 * tp4r0 + emb / 4 + 64) * f32);
  EXPECT_DOUBLE_EQ(sm.weights, (3 * tp4r0 + emb / 4 + 64) * f32);
  // TP 8 > 4 KV heads: each rank reads one KV head whole (8 rows of wk and
  // wv, not 4), and ranks 0 and 1 read the same one.
  const double tp8r0 = 64 * (8 + 2 * 8 + 8 + 2 * 22 + 22 + 2);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 5, 8, 0, false, false}}), 5 * tp8r0 * f32);
  const double tp8r01 = 64 * (16 + 2 * 8 + 16 + 2 * 44 + 44 + 2);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 5, 8, 0, false, false}, {0, 5, 8, 1, false, false}}), 5 * tp8r01 * f32);
}

// A quantized dtype's row-parallel columns are held in whole blocks: TP 4
// rank 1 of a Q8_0 model with a feed-forward of 160 reads down's columns
// [40, 80), held as [32, 96). Norms are float32 whatever the dtype.
TEST(ShardUnion, RowParallelColumnsInWholeBlocks) {
  ModelShape m = model("stories260K");
  m.dtype = "q8_0";
  m.bytes_per_param = 34.0 / 32;
  m.intermediate_size = 160;
  m.n_params = 0;
  // q [16, 32) x 8 = rows [16, 32) of wq, wo's columns [16, 32) held as
  // [0, 32); the two norms in float32.
  const double layer = 64 * (16 + 2 * 8 + 32 + 2 * 40 + 64);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 1, 4, 1, false, false}}), layer * 34.0 / 32 + 2 * 64 * 4);
}

// The example table as written (standard TP 2 on vd0, vd1; performance
// TP 4 on vd0..vd3 in that order), then with its ranks nested.
TEST(DeviceMemory, StoriesTableShardUnionsPerDevice) {
  const ModelShape m = model("stories260K");
  const double all = 260032 * 4.0;  // the model's parameters, F32
  const double layer = 64 * (64 + 2 * 32 + 64 + 3 * 172 + 2), emb = 512 * 64;
  ftp::doc::GearTable t = table("stories260K-cpu");
  ftp::doc::Topology none;
  auto mem = device_memory(m, t, none, small());
  ASSERT_EQ(mem.size(), 4u);
  // vd0 serves economy (all of it): the whole model.
  EXPECT_DOUBLE_EQ(of(mem, "vd0").weights, all);
  // vd1: pipelined's layers 3-4 and head (rank 0 of its last stage),
  // standard's rank 1 and performance's rank 1 (q 48 of 64, KV 24 of 32,
  // ff 129 of 172: see above) on layers 0-2, the embedding; the tied head
  // adds only the final norm.
  const double wide = 64 * (48 + 2 * 24 + 48 + 2 * 129 + 129 + 2);
  EXPECT_DOUBLE_EQ(of(mem, "vd1").weights, (3 * wide + 2 * layer + emb + 64) * 4);
  // vd2, vd3: a replica each (all of it).
  EXPECT_DOUBLE_EQ(of(mem, "vd2").weights, all);
  EXPECT_DOUBLE_EQ(of(mem, "vd3").weights, all);

  // Nested: performance becomes vd0, vd2, vd1, vd3 (vd1 = rank 2, inside its TP 2 half).
  EXPECT_EQ(nest_ranks(t), 1);
  const ftp::doc::Gear* perf = t.find("performance");
  ASSERT_NE(perf, nullptr);
  EXPECT_EQ(perf->replicas[0].stages[0].devices, (std::vector<std::string>{"vd0", "vd2", "vd1", "vd3"}));
  mem = device_memory(m, t, none, small());
  const double tp2r1 = 64 * (32 + 2 * 16 + 32 + 2 * 86 + 86 + 2);
  EXPECT_DOUBLE_EQ(of(mem, "vd1").weights, (3 * tp2r1 + 2 * layer + emb + 64) * 4);
  EXPECT_EQ(nest_ranks(t), 0);  // already nested
}

// A 1B-class model (TinyLlama 1.1B's shape: dim 2048, 32 heads of 64, 4 KV
// heads, feed-forward 5632, vocabulary 32000, untied, BF16) planned as TP
// 1, 2, 4 and 8 on eight A100s: the planner nests the ranks, so every
// device holds its smallest TP's shard: that TP's share of the layers (one
// KV head whole at TP 8), the norms, the embedding whole, and the head where
// it is rank 0 there.
TEST(DeviceMemory, PlannedTablesNestSoEachDeviceHoldsItsLargestShard) {
  const TpLadder l = tinyllama_tp_ladder();
  const auto& [m, topo, p, mem] = l;
  auto by_hand = [](int tp, int rank) {  // BF16 matrices, float32 norms
    const double kv_rows = tp <= 4 ? 256.0 / tp : 64;
    const double layer = 2048 * (2 * 2048.0 / tp + 2 * kv_rows + 3 * 5632.0 / tp) * 2 + 2 * 2048 * 4;
    // Vocabulary-parallel embedding and head (untied): 32000 / tp rows of each, and the final norm.
    const double emb = 32000.0 / tp * 2048 * 2;
    (void)rank;
    return 22 * layer + 2 * emb + 2048 * 4;
  };
  for (const auto& d : mem) {
    int smallest = 0, rank = -1;
    for (const auto& g : p.table.gears)
      for (const auto& st : g.replicas[0].stages)
        for (std::size_t r = 0; r < st.devices.size(); ++r)
          if (st.devices[r] == d.device && (smallest == 0 || g.tp < smallest)) {
            smallest = g.tp;
            rank = static_cast<int>(r);
          }
    ASSERT_GT(smallest, 0) << d.device;
    EXPECT_NEAR(d.weights, by_hand(smallest, rank), d.weights * 1e-12) << d.device << " TP " << smallest << " rank " << rank;
    EXPECT_TRUE(d.fits()) << d.device;
  }
}

TEST(DeviceMemory, ATableThatDoesNotFitNamesTheDevice) {
  const ModelShape m = model("llama-70b");
  const auto topo = ftp::doc::topology_from_cluster_spec(
      ftp::json::read_file(source_root() + "/examples/clusters/a100-8x-nvlink.json"));
  ftp::doc::GearTable t;
  ftp::doc::Gear g;
  g.name = "all-on-one";
  g.replicas = {ftp::doc::Replica{{ftp::doc::Stage{0, m.n_layers, {topo.devices.back().id}}}}};
  t.gears = {g};
  const auto mem = device_memory(m, t, topo, small());
  const DeviceMemory* d = first_short(mem);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->device, topo.devices.back().id);
  EXPECT_GT(d->weights, 130e9);  // 69 B parameters in 16 bits
  const std::string why = short_text(*d);
  EXPECT_NE(why.find("device " + topo.devices.back().id + " needs"), std::string::npos) << why;
  EXPECT_NE(why.find("), has "), std::string::npos) << why;
}

// GPU overheads (GpuOverheads, estimates with sources in
// plan/cost_model.hpp), by hand for TinyLlama planned as TP 1, 2, 4 and 8
// on eight A100s: each gear's stage has 22 layers, so one domain's graphs
// on a rank are 32 batches x (22 x 16 + 8) nodes x 64 KiB, and a device
// counts the two gears with the most (here: any two it serves). Each gear
// of TP > 1 is its own GPU set, so a device's NCCL buffers are (its gears
// of TP > 1, plus the root communicator) x 32 channels x 4 MiB. CPU
// virtual devices hold neither.
TEST(DeviceMemory, GpusCountGraphsAndCommunicatorBuffers) {
  const TpLadder l = tinyllama_tp_ladder();
  const auto& [m, topo, p, mem] = l;
  const double one_domain = 32.0 * (22 * 16 + 8) * 65536;
  const double one_comm = 32.0 * 4 * 1048576;
  ASSERT_EQ(mem.size(), 8u);
  for (const auto& d : mem) {
    int gears = 0, multi = 0;
    for (const auto& g : p.table.gears) {
      const auto devs = g.devices();
      if (std::find(devs.begin(), devs.end(), d.device) == devs.end()) continue;
      ++gears;
      multi += g.tp > 1;
    }
    ASSERT_GT(gears, 0) << d.device;
    EXPECT_DOUBLE_EQ(d.graphs, std::min(gears, 2) * one_domain) << d.device;
    EXPECT_DOUBLE_EQ(d.comm_buffers, multi > 0 ? (multi + 1) * one_comm : 0.0) << d.device;
    EXPECT_DOUBLE_EQ(d.need(), d.weights + d.kv + d.activations + d.graphs + d.comm_buffers);
    const auto j = to_json(d);
    EXPECT_EQ(j["graphs_bytes"].get<std::uint64_t>(), static_cast<std::uint64_t>(d.graphs + 0.5));
    EXPECT_EQ(j["comm_buffers_bytes"].get<std::uint64_t>(), static_cast<std::uint64_t>(d.comm_buffers + 0.5));
  }
  // The first device serves all four gears: TP 2, 4 and 8 sets and the root.
  EXPECT_DOUBLE_EQ(of(mem, topo.devices.front().id).comm_buffers, 4 * one_comm);
  // CPU virtual devices: none.
  for (const auto& d : device_memory(m, table("stories260K-cpu"), ftp::doc::Topology{}, small())) {
    EXPECT_EQ(d.graphs, 0) << d.device;
    EXPECT_EQ(d.comm_buffers, 0) << d.device;
  }
}

// Activations per device follow what each rank of a TP 2 stage holds
// (plan::rank_activations; tests/engine/test_vocab_head.cpp checks the
// engine asks for these head floats): stories260K (hidden 64, feed-forward
// 172, vocabulary 512: 256 rows each) at max_batched_tokens 64, so 64
// logits rows. Both ranks: 64 x (4 x 64 + 2 x 172 / 2) = 27392 floats of
// layer scratch. Rank 0 also holds the full logits rows and its slice,
// 64 x (512 + 256) = 49152 floats; rank 1 its slice, 64 x 256 = 16384.
TEST(DeviceMemory, ActivationsFollowWhatEachRankOfTheHeadHolds) {
  const auto t = ftp::doc::gear_table_from_json(ftp::json::parse(R"({
    "kind": "ftp.gear-table/v1",
    "model": {"name": "stories260K", "n_layers": 5, "n_heads": 8, "n_kv_heads": 4, "hidden_size": 64},
    "topology": "cpu-virtual-4",
    "gears": [{"name": "standard", "tp": 2, "pp": 1, "dp": 1,
               "replicas": [{"stages": [{"layers": [0, 5], "devices": ["vd0", "vd1"]}]}]}]})",
                                                                   "test"));
  const auto mem = device_memory(model("stories260K"), t, ftp::doc::Topology{}, small());
  EXPECT_DOUBLE_EQ(of(mem, "vd0").activations, (27392.0 + 49152.0) * 4);
  EXPECT_DOUBLE_EQ(of(mem, "vd1").activations, (27392.0 + 16384.0) * 4);
}
