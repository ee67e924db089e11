// SPDX-License-Identifier: Apache-2.0
// The service in device-memory mode (ServiceConfig::device_memory, ftp-serve
// --device-memory) on stories260K's example table: each virtual device holds
// the planner's bytes (plan::device_memory, the start-up check's
// computation) within 1 %, shifts copy nothing and serve the static greedy
// text, a table that does not fit is refused naming the device, and a
// reload needing weights a device lacks is refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <string>

#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "model/model.hpp"
#include "plan/device_memory.hpp"
#include "plan/model_shape.hpp"
#include "serve/generate.hpp"
#include "engine/weight_store.hpp"
#include "serve/service.hpp"
#include "test_data.hpp"

using namespace ftp::serve;

namespace {

std::string model_path() { return ftp::test::stories260k("stories260K.gguf"); }
std::string gears_path() {
  const char* s = std::getenv("FTP_SOURCE_ROOT");
  return std::string(s ? s : ".") + "/examples/gears/stories260K-cpu.json";
}

struct DeviceMemoryFixture : ::testing::Test {
  static inline std::unique_ptr<ftp::model::Model> model;
  static inline ftp::doc::GearTable table;
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    model = std::make_unique<ftp::model::Model>(ftp::model::load_model(model_path()));
    table = ftp::json::parse_file(gears_path(), [](const auto& j) { return ftp::doc::gear_table_from_json(j); });
  }
  void SetUp() override {
    if (!model) GTEST_SKIP() << "stories260K.gguf not found at " << model_path() << " (set FTP_TEST_DATA)";
  }
  ServiceConfig config(bool device_memory, std::uint64_t budget = 1ull << 30) const {
    ServiceConfig c;
    c.model_name = "stories260K";
    c.gears = table;
    c.kv_blocks = 64;
    c.step_interval_ms = 1;
    c.device_memory = device_memory;
    c.virtual_device_memory = budget;
    return c;
  }
  /// Completes `prompt` greedily on the service.
  static std::string complete(Service& svc, const std::string& prompt, int max_tokens) {
    std::promise<std::string> done;
    std::string text;
    CompletionRequest r;
    r.id = "r-" + prompt;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.on_event = [&](const CompletionEvent& e) {
      text += e.text;
      if (e.finished) done.set_value(e.finish_reason == ftp::engine::FinishReason::error ? "error: " + e.error : text);
    };
    auto f = done.get_future();
    svc.submit(std::move(r));
    return f.get();
  }
};

/// The status document's devices by id.
std::map<std::string, ftp::json::Json> devices_of(const ftp::json::Json& status) {
  std::map<std::string, ftp::json::Json> out;
  for (const auto& d : status["devices"]) out[d["id"].get<std::string>()] = d;
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ftp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_F(DeviceMemoryFixture, DevicesHoldThePlannedBytesAndShiftsCopyNothing) {
  Service svc(*model, config(true));
  svc.start();
  ftp::json::Json st = svc.status();
  EXPECT_EQ(st["device_memory"], true);
  // The planner's count for the table in force (the service nested it).
  ftp::plan::ModelShape shape = ftp::plan::model_shape_of(*model, "stories260K");
  ftp::plan::Workload w;
  w.max_batched_tokens = 256;
  const auto planned = ftp::plan::device_memory(shape, svc.gear_table(), ftp::doc::Topology{}, w, 1, 256);
  auto devs = devices_of(st);
  std::uint64_t sum = 0;
  ASSERT_EQ(planned.size(), 4u);
  for (const auto& p : planned) {
    ASSERT_TRUE(devs.count(p.device)) << p.device;
    const auto held = devs[p.device]["memory_weights"].get<std::uint64_t>();
    std::printf("%s: holds %llu weight bytes, planned %.0f\n", p.device.c_str(), static_cast<unsigned long long>(held),
                p.weights);
    EXPECT_NEAR(static_cast<double>(held), p.weights, 0.01 * p.weights) << p.device;
    EXPECT_GE(devs[p.device]["memory_used"].get<std::uint64_t>(), held) << p.device;  // and the KV pages
    sum += held;
  }
  EXPECT_EQ(st["weights_copied_bytes"].get<std::uint64_t>(), sum);
  // The example's performance gear nested: vd1 serves its rank 2, inside its TP 2 half.
  EXPECT_EQ(svc.gear_table().find("performance")->replicas[0].stages[0].devices,
            (std::vector<std::string>{"vd0", "vd2", "vd1", "vd3"}));

  std::map<std::string, std::string> reference;
  for (const std::string p : {"Zoo", "Once upon a time", "The cat"}) {
    GenerateOptions o;
    o.prompt = p;
    o.max_tokens = 40;
    reference[p] = generate_once(*model, o, [](std::string_view) {});
  }
  for (const std::string to : {"standard", "performance", "pipelined", "replicated", "economy"}) {
    Service::ShiftOptions o;
    o.to = to;
    std::string warm;
    const auto rec = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) {
      if (e.phase == ftp::doc::ShiftPhase::warm) warm = e.message;
    });
    ASSERT_EQ(rec.outcome, ftp::doc::ShiftOutcome::committed) << rec.message;
    EXPECT_NE(warm.find("; weights copied: 0 bytes"), std::string::npos) << warm;
    // Resident mode: nothing freed, nothing copied back.
    EXPECT_FALSE(rec.weights_copied_bytes);
    EXPECT_FALSE(rec.weights_released_bytes);
    ftp::json::Json now = svc.status();
    EXPECT_EQ(now["weights_copied_bytes"].get<std::uint64_t>(), sum) << "shift to " << to;
    auto d = devices_of(now);
    for (const auto& [id, j] : devs) EXPECT_EQ(d[id]["memory_weights"], j["memory_weights"]) << id << " after " << to;
    for (const auto& [p, text] : reference) EXPECT_EQ(complete(svc, p, 40), text) << "gear " << to << ", prompt " << p;
  }
  svc.drain_and_stop();
}

TEST_F(DeviceMemoryFixture, ResidentModeCopiesNothing) {
  Service svc(*model, config(false));
  svc.start();
  auto st = svc.status();
  EXPECT_EQ(st["device_memory"], false);
  EXPECT_EQ(st["weights_copied_bytes"], 0);
  for (const auto& [id, d] : devices_of(st)) EXPECT_EQ(d["memory_weights"], 0) << id;
  // The table as written: nothing reordered.
  EXPECT_EQ(svc.gear_table().find("performance")->replicas[0].stages[0].devices,
            (std::vector<std::string>{"vd0", "vd1", "vd2", "vd3"}));
}

// Budgets under what the table puts on a device: refused at start, the
// device named with the bytes needed and free, in either mode. vd0 holds
// the whole model (economy: 4 x 264 K parameters); 600 kB is short of that.
TEST_F(DeviceMemoryFixture, ATableThatDoesNotFitIsRefusedNamingTheDevice) {
  for (bool dm : {false, true}) {
    Service svc(*model, config(dm, 600000));
    const std::string why = error_of([&] { svc.start(); });
    EXPECT_NE(why.find("the gear table does not fit device vd0: it needs "), std::string::npos) << why;
    EXPECT_NE(why.find("600000 bytes free"), std::string::npos) << why;
    EXPECT_EQ(svc.status()["weights_copied_bytes"], 0);
  }
}

// A reload whose shards a device lacks is refused, naming it; one inside
// the copies is taken.
TEST_F(DeviceMemoryFixture, AReloadNeedingOtherWeightsIsRefused) {
  ftp::doc::GearTable small;
  ftp::doc::Gear g = *table.find("pipelined");
  small.model = table.model;
  small.gears = {g};
  ServiceConfig c = config(true);
  c.gears = small;
  c.virtual_devices = 2;
  Service svc(*model, c);
  svc.start();
  // vd1 holds layers 3-4 only; economy on vd1 needs layers 0-2.
  ftp::doc::GearTable bigger = small;
  ftp::doc::Gear e = *table.find("economy");
  e.replicas[0].stages[0].devices = {"vd1"};
  bigger.gears.push_back(e);
  const std::string why = error_of([&] { svc.reload(bigger); });
  EXPECT_NE(why.find("device vd1 does not hold"), std::string::npos) << why;
  EXPECT_NE(why.find("layer 0"), std::string::npos) << why;
  // Another gear on the same shards: taken.
  ftp::doc::GearTable same = small;
  ftp::doc::Gear half = g;
  half.name = "pipelined-again";
  same.gears.push_back(half);
  EXPECT_EQ(error_of([&] { svc.reload(same); }), "");
}

TEST_F(DeviceMemoryFixture, DeviceMemoryNeedsTheRealCpuEngine) {
  ServiceConfig c = config(true);
  c.backend = "cuda";
  // Refused for the mode, before a GPU is looked for.
  EXPECT_NE(error_of([&] { Service svc(*model, c); }).find("--device-memory: it imitates a GPU's memory"),
            std::string::npos);
}

// Release weight mode on copies: the devices that leave a release-mode gear
// free their copies at retire, exactly their shard unions (as
// WeightStore::shard_union counts them on a second store); a later shift
// that needs them copies exactly those bytes back at reserve, and the
// shift records carry both; the greedy text is the static gear's.
TEST_F(DeviceMemoryFixture, ReleaseModeFreesCopiesAtRetireAndCopiesThemBackAtReserve) {
  ServiceConfig c = config(true);
  for (auto& g : c.gears.gears)
    if (g.name == "performance") g.weight_mode = "release";
  Service svc(*model, c);
  svc.start();
  const auto held = devices_of(svc.status());
  const std::uint64_t copied_at_start = svc.status()["weights_copied_bytes"].get<std::uint64_t>();
  // Each device's union over the table in force, computed apart.
  ftp::engine::WeightStore apart(*model);
  std::map<std::string, std::vector<ftp::engine::RankShard>> shards;
  for (const auto& g : svc.gear_table().gears)
    for (const auto& rep : g.replicas)
      for (std::size_t s = 0; s < rep.stages.size(); ++s) {
        const auto& st = rep.stages[s];
        for (std::size_t r = 0; r < st.devices.size(); ++r)
          shards[st.devices[r]].push_back(ftp::engine::RankShard{st.first_layer, st.n_layers, static_cast<int>(st.devices.size()),
                                                                 static_cast<int>(r), s == 0, s + 1 == rep.stages.size()});
      }
  std::uint64_t leaving = 0;  // vd1..vd3: performance's devices that economy (vd0) does not use
  for (const std::string d : {"vd1", "vd2", "vd3"}) {
    const std::uint64_t u = apart.shard_union(shards[d]).bytes();
    EXPECT_EQ(held.at(d)["memory_weights"].get<std::uint64_t>(), u) << d;
    leaving += u;
  }
  GenerateOptions go;
  go.prompt = "Zoo";
  go.max_tokens = 40;
  const std::string reference = generate_once(*model, go, [](std::string_view) {});
  std::vector<ftp::doc::ShiftEvent> events;
  auto shift = [&](const std::string& to) {
    events.clear();
    Service::ShiftOptions o;
    o.to = to;
    const auto rec = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) { events.push_back(e); });
    EXPECT_EQ(rec.outcome, ftp::doc::ShiftOutcome::committed) << rec.message;
  };
  auto phase = [&](ftp::doc::ShiftPhase p) {
    for (const auto& e : events)
      if (e.phase == p) return e;
    ADD_FAILURE() << "no phase " << ftp::doc::to_string(p);
    return ftp::doc::ShiftEvent{};
  };
  // Up: every device still holds its copy, nothing to copy back.
  shift("performance");
  EXPECT_FALSE(phase(ftp::doc::ShiftPhase::reserve).weights_copied_bytes);
  EXPECT_EQ(complete(svc, "Zoo", 40), reference);
  // Down: vd1..vd3 leave the release-mode gear and free their copies.
  shift("economy");
  const auto retire = phase(ftp::doc::ShiftPhase::retire);
  ASSERT_TRUE(retire.weights_released_bytes) << retire.message;
  EXPECT_EQ(*retire.weights_released_bytes, leaving) << retire.message;
  EXPECT_FALSE(phase(ftp::doc::ShiftPhase::done).weights_released_bytes);
  auto now = devices_of(svc.status());
  for (const std::string d : {"vd1", "vd2", "vd3"}) EXPECT_EQ(now[d]["memory_weights"], 0) << d;
  EXPECT_EQ(now["vd0"]["memory_weights"], held.at("vd0")["memory_weights"]);
  EXPECT_EQ(complete(svc, "Zoo", 40), reference);
  // Up again: exactly those bytes come back at reserve, timed, and the build copies nothing more.
  shift("performance");
  const auto reserve = phase(ftp::doc::ShiftPhase::reserve);
  ASSERT_TRUE(reserve.weights_copied_bytes) << reserve.message;
  EXPECT_EQ(*reserve.weights_copied_bytes, leaving) << reserve.message;
  ASSERT_TRUE(reserve.weights_copy_ms);
  EXPECT_GE(*reserve.weights_copy_ms, 0.0);
  EXPECT_NE(phase(ftp::doc::ShiftPhase::warm).message.find("; weights copied: 0 bytes"), std::string::npos);
  // The record as JSON, and back (the journal's round trip).
  const auto j = ftp::doc::to_json(reserve);
  EXPECT_EQ(j["weights_copied_bytes"].get<std::uint64_t>(), leaving);
  EXPECT_EQ(ftp::doc::shift_event_from_json(j).weights_copied_bytes, reserve.weights_copied_bytes);
  now = devices_of(svc.status());
  for (const auto& [id, d] : held) EXPECT_EQ(now[id]["memory_weights"], d["memory_weights"]) << id;
  EXPECT_EQ(svc.status()["weights_copied_bytes"].get<std::uint64_t>(), copied_at_start + leaving);
  EXPECT_EQ(complete(svc, "Zoo", 40), reference);
  // A resident gear that needs a released device also gets it back: standard is vd0, vd1.
  shift("economy");
  shift("standard");
  const auto back = phase(ftp::doc::ShiftPhase::reserve);
  ASSERT_TRUE(back.weights_copied_bytes) << back.message;
  EXPECT_EQ(*back.weights_copied_bytes, apart.shard_union(shards["vd1"]).bytes());
  EXPECT_EQ(complete(svc, "Zoo", 40), reference);
  svc.drain_and_stop();
}
