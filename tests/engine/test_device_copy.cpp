// SPDX-License-Identifier: Apache-2.0
// Device-memory mode of the weight store (lib/engine/weight_store:
// copy_to_device): each CPU virtual device holds a private copy of exactly
// the union of its shards. Its bytes are checked against the planner's
// count (plan::shard_union_bytes, which works from the model's shapes and
// copies nothing) and, for one device, against bytes written out by hand;
// greedy tokens on the copies are the golden ones and the mapped file's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hardware/cpu/virtual_device.hpp"
#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "engine/domain.hpp"
#include "engine/weight_store.hpp"
#include "model/model.hpp"
#include "plan/device_memory.hpp"
#include "plan/model_shape.hpp"
#include "synthetic_gguf.hpp"
#include "test_data.hpp"

using namespace ftp::engine;
using ftp::hardware::VirtualDevice;

namespace {

std::string source_root() {
  const char* s = std::getenv("FTP_SOURCE_ROOT");
  return s ? s : ".";
}

ftp::doc::GearTable stories_table() {
  return ftp::doc::gear_table_from_json(ftp::json::read_file(source_root() + "/examples/gears/stories260K-cpu.json"));
}

/// The shards device `dev` serves in `gears` (every gear of a table, or one).
std::vector<RankShard> shards_of(const std::vector<ftp::doc::Gear>& gears, const std::string& dev) {
  std::vector<RankShard> out;
  for (const auto& g : gears)
    for (const auto& rep : g.replicas)
      for (std::size_t s = 0; s < rep.stages.size(); ++s) {
        const auto& st = rep.stages[s];
        for (std::size_t r = 0; r < st.devices.size(); ++r)
          if (st.devices[r] == dev)
            out.push_back(RankShard{st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), static_cast<int>(r),
                                    s == 0, s + 1 == rep.stages.size()});
      }
  return out;
}

std::vector<ftp::plan::Shard> plan_shards(const std::vector<RankShard>& s) {
  std::vector<ftp::plan::Shard> out;
  for (const auto& x : s) out.push_back(ftp::plan::Shard{x.first_layer, x.n_layers, x.tp, x.rank, x.first, x.last});
  return out;
}

/// Virtual devices named as the table names them, with room to spare.
struct Devices {
  std::map<std::string, std::unique_ptr<VirtualDevice>> by_name;
  VirtualDevice& operator[](const std::string& name) {
    auto& d = by_name[name];
    if (!d) d = std::make_unique<VirtualDevice>(static_cast<int>(by_name.size()), 1, std::vector<int>{}, 1ull << 32);
    return *d;
  }
};

/// The domain layout of a gear's first replica on `devs`.
std::vector<StageLayout> stages_of(const ftp::doc::Gear& g, Devices& devs, std::size_t replica = 0) {
  std::vector<StageLayout> out;
  for (const auto& st : g.replicas.at(replica).stages) {
    std::vector<VirtualDevice*> d;
    for (const auto& name : st.devices) d.push_back(&devs[name]);
    out.emplace_back(st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), d);
  }
  return out;
}

std::vector<int> greedy_tokens(const WeightStore& store, std::vector<StageLayout> stages, int micro_batches, int n) {
  DomainConfig cfg;
  cfg.stages = std::move(stages);
  cfg.micro_batches = micro_batches;
  cfg.kv_blocks = 32;
  Domain d(store, cfg);
  std::vector<int> out;
  GenerationRequest r;
  r.id = "greedy";
  r.prompt = {1};
  r.max_tokens = n;
  std::string error;
  r.on_event = [&](const GenerationEvent& e) {
    if (e.token >= 0) out.push_back(e.token);
    if (e.finished && e.finish_reason == FinishReason::error) error = e.error;
  };
  d.submit(std::move(r));
  for (int guard = 0; !d.idle() && guard < 100000; ++guard) d.step();
  EXPECT_EQ(error, "");
  return out;
}

struct Stories : ::testing::Test {
  static inline std::unique_ptr<ftp::model::Model> model;
  static void SetUpTestSuite() {
    if (std::filesystem::exists(ftp::test::stories260k("stories260K.gguf")))
      model = std::make_unique<ftp::model::Model>(ftp::model::load_model(ftp::test::stories260k("stories260K.gguf")));
  }
  void SetUp() override {
    if (!model) GTEST_SKIP() << "stories260K.gguf not found under " << ftp::test::data_dir() << " (set FTP_TEST_DATA)";
  }
};

/// For every gear alone and for the table as a whole (nested): each
/// device's copy is the planner's shard union, to the byte (an F32 model
/// without biases: every tensor the plan counts is copied, nothing else),
/// and that is what the device has reserved.
void expect_copies_are_shard_unions(const ftp::model::Model& m, ftp::doc::GearTable table, double tolerance) {
  const ftp::plan::ModelShape shape = ftp::plan::model_shape_of(m, "model");
  ftp::plan::nest_ranks(table);
  std::vector<std::pair<std::string, std::vector<ftp::doc::Gear>>> cases;
  for (const auto& g : table.gears) cases.push_back({"gear " + g.name, {g}});
  cases.push_back({"the whole table", table.gears});
  for (const auto& [what, gears] : cases) {
    Devices devs;  // outlive the store, which gives their bytes back
    WeightStore store(m);
    std::uint64_t sum = 0;
    for (const auto& g : gears)
      for (const auto& dev : g.devices()) {
        if (devs.by_name.count(dev)) continue;
        const std::vector<RankShard> shards = shards_of(gears, dev);
        VirtualDevice& vd = devs[dev];
        const std::uint64_t bytes = store.copy_to_device(vd, shards);
        const double planned = ftp::plan::shard_union_bytes(shape, plan_shards(shards));
        if (tolerance == 0)
          EXPECT_EQ(static_cast<double>(bytes), planned) << what << ", " << dev;
        else
          EXPECT_NEAR(static_cast<double>(bytes), planned, tolerance * planned) << what << ", " << dev;
        EXPECT_EQ(vd.memory_weights(), bytes) << what << ", " << dev;
        EXPECT_EQ(vd.memory_used(), bytes) << what << ", " << dev;
        EXPECT_EQ(store.device_bytes(&vd), bytes) << what << ", " << dev;
        sum += bytes;
      }
    EXPECT_EQ(store.copied_bytes(), sum) << what;
  }
}

}  // namespace

TEST_F(Stories, EveryGearsCopiesAreThePlannersShardUnions) {
  expect_copies_are_shard_unions(*model, stories_table(), 0);
}

// One device by hand: stories260K (F32, dim 64, 8 heads of 8, 4 KV heads,
// feed-forward 172, vocabulary 512, 5 layers) at TP 2 rank 1 of the whole
// model, the first and the last stage: per layer wq 32 rows + wk, wv 16
// rows each + wo 32 columns, of 64; gate, up 86 rows and down 86 columns of
// 64; two norms of 64; the vocabulary-parallel embedding and head: rows
// [256, 512) of each (one tensor when tied) and the final norm.
TEST_F(Stories, OneShardsBytesWrittenOut) {
  const auto& hp = model->hparams;
  ASSERT_EQ(hp.n_embd, 64);
  ASSERT_EQ(hp.n_ff, 172);
  ASSERT_EQ(hp.n_head_kv, 4);
  ASSERT_EQ(hp.n_vocab, 512);
  VirtualDevice vd(0, 1, {}, 1ull << 32), vd2(1, 1, {}, 1ull << 32);  // outlive the stores
  WeightStore store(*model);
  const auto& w = model->weights;
  const bool tied = !w.output.data || w.output.data == w.tok_embd.data;
  // Vocabulary rows of the embedding and the head, and the final norm.
  auto vocab = [&](std::uint64_t rows) { return 4 * (64 * rows * (tied ? 1 : 2) + 64); };
  const std::uint64_t per_layer = 4 * (64 * (32 + 16 + 16 + 32) + 64 * 86 * 3 + 2 * 64);
  EXPECT_EQ(store.copy_to_device(vd, {RankShard{0, 5, 2, 1, true, true}}), 5 * per_layer + vocab(256));
  // Rank 0 of TP 4 at the same time adds its rows: vocabulary [0, 128).
  WeightStore store2(*model);
  const std::uint64_t tp4_rank0 = 4 * (64 * (16 + 8 + 8 + 16) + 64 * 43 * 3);
  EXPECT_EQ(store2.copy_to_device(vd2, {RankShard{0, 5, 2, 1, true, true}, RankShard{0, 5, 4, 0, true, true}}),
            5 * (per_layer + tp4_rank0) + vocab(384));
}

// Greedy tokens on the copies: the golden ones at every gear of the table.
TEST_F(Stories, GoldenGreedyTokensOnTheCopies) {
  const auto golden = ftp::test::stories260k_golden_ids();
  ASSERT_EQ(golden.size(), 256u);
  ftp::doc::GearTable t = stories_table();
  ftp::plan::nest_ranks(t);
  Devices devs;
  WeightStore store(*model);
  for (const auto& g : t.gears)
    for (const auto& dev : g.devices())
      if (!devs.by_name.count(dev)) store.copy_to_device(devs[dev], shards_of(t.gears, dev));
  for (const auto& g : t.gears)
    for (std::size_t rep = 0; rep < g.replicas.size(); ++rep)
      EXPECT_EQ(greedy_tokens(store, stages_of(g, devs, rep), g.micro_batches, 256), golden)
          << "gear " << g.name << " replica " << rep;
}

// A rank whose device's copy lacks its views is refused, naming the
// device and the layer: a domain never reads the mapped file instead.
TEST_F(Stories, ARankOutsideItsDevicesCopyIsRefused) {
  VirtualDevice vd(3, 1, {}, 1ull << 32), other(4, 1, {}, 1ull << 32);
  WeightStore store(*model);
  store.copy_to_device(vd, {RankShard{3, 2, 1, 0, false, true}});
  DomainConfig cfg;
  cfg.stages = {StageLayout{0, 5, 1, {&vd}}};
  cfg.kv_blocks = 8;
  try {
    Domain d(store, cfg);
    ADD_FAILURE() << "a domain over layers vd lacks was built";
  } catch (const ftp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("device cpu:3 holds no copy of layer 0"), std::string::npos) << e.what();
  }
  cfg.stages = {StageLayout{0, 5, 1, {&other}}};
  EXPECT_THROW(Domain(store, cfg), ftp::Error);  // a device with no copy at all
  EXPECT_EQ(store.missing_on_device(vd, {RankShard{3, 2, 1, 0, false, true}}), "");
  EXPECT_EQ(store.missing_on_device(vd, {RankShard{3, 2, 2, 0, false, true}}), "");  // nested inside the copy
  EXPECT_NE(store.missing_on_device(vd, {RankShard{2, 3, 1, 0, false, true}}).find("layer 2"), std::string::npos);
  EXPECT_NE(store.missing_on_device(vd, {RankShard{3, 2, 1, 0, true, true}}).find("embedding"), std::string::npos);
  EXPECT_THROW(store.copy_to_device(vd, {}), ftp::Error);  // once per device
}

// A copy that does not fit the device's budget is refused before anything
// is allocated, naming the device; the budget is untouched.
TEST_F(Stories, ACopyOverTheBudgetIsRefused) {
  VirtualDevice small(7, 1, {}, 100000);
  WeightStore store(*model);
  try {
    store.copy_to_device(small, {RankShard{0, 5, 1, 0, true, true}});
    ADD_FAILURE() << "the whole model fit 100000 bytes";
  } catch (const ftp::hardware::OutOfDeviceMemory& e) {
    EXPECT_NE(std::string(e.what()).find("cpu:7: weights"), std::string::npos) << e.what();
  }
  EXPECT_EQ(small.memory_used(), 0u);
  EXPECT_EQ(store.device_bytes(&small), 0u);
}

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("ftp-device-copy-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

/// TP 1, 2, 4 and 8 of a synthetic model with 2 KV heads (TP 4 and 8
/// replicate them), as three gears over four devices plus a pipeline.
ftp::doc::GearTable synthetic_table() {
  return ftp::doc::gear_table_from_json(ftp::json::parse(R"({
    "kind": "ftp.gear-table/v1",
    "model": {"name": "synthetic", "n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "hidden_size": 64},
    "gears": [
      {"name": "tp1", "tp": 1, "pp": 1, "dp": 1, "replicas": [{"stages": [{"layers": [0, 4], "devices": ["vd0"]}]}]},
      {"name": "tp2", "tp": 2, "pp": 1, "dp": 1, "replicas": [{"stages": [{"layers": [0, 4], "devices": ["vd1", "vd0"]}]}]},
      {"name": "tp4", "tp": 4, "pp": 1, "dp": 1,
       "replicas": [{"stages": [{"layers": [0, 4], "devices": ["vd0", "vd1", "vd2", "vd3"]}]}]},
      {"name": "tp2pp2", "tp": 2, "pp": 2, "dp": 1, "micro_batches": 2,
       "replicas": [{"stages": [{"layers": [0, 2], "devices": ["vd2", "vd3"]}, {"layers": [2, 4], "devices": ["vd0", "vd1"]}]}]},
      {"name": "tp8", "tp": 8, "pp": 1, "dp": 1,
       "replicas": [{"stages": [{"layers": [0, 4], "devices": ["vd0", "vd1", "vd2", "vd3", "vd4", "vd5", "vd6", "vd7"]}]}]}
    ]})",
                                                         "synthetic gear table"));
}

ftp::testing::SyntheticShape synthetic_shape(ftp::model::DType dtype) {
  ftp::testing::SyntheticShape s;
  s.n_layer = 4;
  s.n_embd = 64;
  s.n_ff = 160;  // 20 at TP 8, inside Q8_0's blocks of 32: the copy holds whole blocks
  s.n_head = 8;
  s.n_head_kv = 2;
  s.dtype = dtype;
  return s;
}

}  // namespace

// A synthetic table, in F32 (to the byte) and in Q8_0, whose row-parallel
// splits at TP 4 and 8 fall inside blocks (the copy and the plan both hold
// whole blocks; the plan's bytes per parameter are the file's mean, the
// norms' F32 included, so they agree to within 1 %). Greedy tokens on the
// copies are the mapped file's at every gear.
TEST(SyntheticDeviceCopy, CopiesAreShardUnionsAndGreedyTokensHold) {
  TempDir dir;
  for (auto dtype : {ftp::model::DType::f32, ftp::model::DType::q8_0}) {
    const std::string path = (dir.path / (std::string(ftp::model::dtype_name(dtype)) + ".gguf")).string();
    ftp::testing::write_synthetic_gguf(path, synthetic_shape(dtype));
    const ftp::model::Model m = ftp::model::load_model(path);
    SCOPED_TRACE(ftp::model::dtype_name(dtype));
    ftp::doc::GearTable t = synthetic_table();
    expect_copies_are_shard_unions(m, t, dtype == ftp::model::DType::f32 ? 0 : 0.01);

    ftp::plan::nest_ranks(t);
    // Q8_0 on an AVX-512 CPU: the mapped store would pack its matrices
    // (another kernel, not bit-identical); the copies are never packed.
    ::setenv("FTP_Q8_PACK", "0", 1);
    Devices devs;
    WeightStore mapped(m), copied(m);
    for (const auto& g : t.gears)
      for (const auto& dev : g.devices())
        if (!devs.by_name.count(dev)) copied.copy_to_device(devs[dev], shards_of(t.gears, dev));
    Devices none;  // the same layouts on devices without copies: views of the file
    for (const auto& g : t.gears) {
      const auto want = greedy_tokens(mapped, stages_of(g, none), g.micro_batches, 24);
      EXPECT_EQ(want.size(), 24u) << g.name;
      EXPECT_EQ(greedy_tokens(copied, stages_of(g, devs), g.micro_batches, 24), want) << "gear " << g.name;
    }
  }
}
