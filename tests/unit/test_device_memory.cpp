// SPDX-License-Identifier: Apache-2.0
// Per-device bytes of a gear table (lib/plan/device_memory): the union of
// each device's weight shards over the gears, nested rank placement, and
// the refusal naming the device that does not fit. Expected bytes are
// written from the shapes' parameter counts by hand (fractions of layers,
// embedding and head), not from the function under test.
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

}  // namespace

TEST(ShardUnion, NestedShardsAddNothingAndOthersAdd) {
  const ModelShape m = model("stories260K");
  const double L = m.layer_params() * m.bytes_per_param, E = m.embedding_params() * m.bytes_per_param,
               H = m.head_params() * m.bytes_per_param;
  // TP 2 rank 1 = [1/2, 1); TP 4 rank 2 = [1/2, 3/4) lies inside it.
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 5, 2, 1, true, true}, {0, 5, 4, 2, true, true}}), (5 * L + E + H) / 2);
  // TP 4 rank 1 = [1/4, 1/2) does not: the union is [1/4, 1).
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{0, 5, 2, 1, true, true}, {0, 5, 4, 1, true, true}}), (5 * L + E + H) * 3 / 4);
  // One shard: stage_memory's weights, stage_weight_params x bytes / tp.
  GroupPerf g;
  g.tp = 4;
  const StageMemory sm = stage_memory(m, StageSpan{3, false, true}, g, small(), 1, 64);
  EXPECT_DOUBLE_EQ(shard_union_bytes(m, {{2, 3, 4, 0, false, true}}), sm.weights);
  EXPECT_DOUBLE_EQ(sm.weights, (3 * L + H) / 4);
}

// The example table as written (standard TP 2 on vd0, vd1; performance
// TP 4 on vd0..vd3 in that order), then with its ranks nested.
TEST(DeviceMemory, StoriesTableShardUnionsPerDevice) {
  const ModelShape m = model("stories260K");
  const double L = m.layer_params() * m.bytes_per_param, E = m.embedding_params() * m.bytes_per_param,
               H = m.head_params() * m.bytes_per_param;
  ftp::doc::GearTable t = table("stories260K-cpu");
  ftp::doc::Topology none;
  auto mem = device_memory(m, t, none, small());
  ASSERT_EQ(mem.size(), 4u);
  // vd0 serves economy (all of it): the whole model.
  EXPECT_DOUBLE_EQ(of(mem, "vd0").weights, 5 * L + E + H);
  // vd1: pipelined's layers 3-4 and head, standard's [1/2, 1), performance's
  // rank 1 [1/4, 1/2): layers 0-2 and the embedding 3/4, layers 3-4 and the head whole.
  EXPECT_DOUBLE_EQ(of(mem, "vd1").weights, 3 * 0.75 * L + 2 * L + 0.75 * E + H);
  // vd2, vd3: a replica each (all of it).
  EXPECT_DOUBLE_EQ(of(mem, "vd2").weights, 5 * L + E + H);
  EXPECT_DOUBLE_EQ(of(mem, "vd3").weights, 5 * L + E + H);

  // Nested: performance becomes vd0, vd2, vd1, vd3 (vd1 = rank 2, inside its TP 2 half).
  EXPECT_EQ(nest_ranks(t), 1);
  const ftp::doc::Gear* perf = t.find("performance");
  ASSERT_NE(perf, nullptr);
  EXPECT_EQ(perf->replicas[0].stages[0].devices, (std::vector<std::string>{"vd0", "vd2", "vd1", "vd3"}));
  mem = device_memory(m, t, none, small());
  EXPECT_DOUBLE_EQ(of(mem, "vd1").weights, 3 * 0.5 * L + 2 * L + 0.5 * E + H);
  EXPECT_EQ(nest_ranks(t), 0);  // already nested
}

// A 1B-class model (TinyLlama 1.1B's shape) planned as TP 1, 2, 4 and 8 on
// eight A100s: every device's weights are its smallest TP's shard,
// weights / TP, because the planner nests the ranks.
TEST(DeviceMemory, PlannedTablesNestSoEachDeviceHoldsItsLargestShard) {
  const ModelShape m = model("tinyllama-1.1b");
  const auto topo = ftp::doc::topology_from_cluster_spec(
      ftp::json::read_file(source_root() + "/examples/clusters/a100-8x-nvlink.json"));
  PlanOptions o;
  for (int tp : {1, 2, 4, 8}) o.layouts.push_back(parse_layout("tp" + std::to_string(tp) + ":tp=" + std::to_string(tp)));
  const Plan p = plan(topo, m, o);
  const auto mem = device_memory(m, p.table, topo, resolve(o.workload, m));
  const double all = (m.n_layers * m.layer_params() + m.embedding_params() + m.head_params()) * m.bytes_per_param;
  for (const auto& d : mem) {
    int smallest = 0;
    for (const auto& g : p.table.gears)
      for (const auto& dev : g.devices())
        if (dev == d.device && (smallest == 0 || g.tp < smallest)) smallest = g.tp;
    ASSERT_GT(smallest, 0) << d.device;
    EXPECT_NEAR(d.weights, all / smallest, all * 1e-12) << d.device;
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
