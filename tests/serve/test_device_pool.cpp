// SPDX-License-Identifier: Apache-2.0
// The device pool: devices bind through its topology (an unknown name is an
// error, never a default device), leases, lost devices.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "doc/gear_table.hpp"
#include "serve/device_pool.hpp"

using ftp::serve::DevicePool;

namespace {

ftp::doc::GearTable table(std::vector<std::vector<std::string>> gears) {
  ftp::doc::GearTable t;
  int i = 0;
  for (auto& devs : gears) {
    ftp::doc::Gear g;
    g.name = "g" + std::to_string(i++);
    ftp::doc::Replica r;
    ftp::doc::Stage s;
    s.first_layer = 0;
    s.n_layers = 1;
    s.devices = devs;
    r.stages.push_back(s);
    g.replicas.push_back(r);
    t.gears.push_back(g);
  }
  return t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ftp::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DevicePool, CpuMakesTheVirtualDevicesTheTableNames) {
  DevicePool p(DevicePool::Kind::cpu, table({{"vd0"}, {"vd0", "vd1", "vd2"}}), 0);
  ASSERT_EQ(p.devices().size(), 3u);
  EXPECT_EQ(p.devices()[2].id, "vd2");
  EXPECT_EQ(p.devices()[2].parent, "cpu0");
  auto b = p.bind("vd1");
  ASSERT_NE(b.virtual_device, nullptr);
  EXPECT_EQ(b.virtual_device->id(), 1);
  EXPECT_EQ(b.gpu, -1);
}

TEST(DevicePool, UnknownNamesAreRefusedNeverDefaulted) {
  DevicePool p(DevicePool::Kind::cpu, table({{"vd0", "vd1"}}), 2);
  EXPECT_NE(error_of([&] { p.bind("vd2"); }).find("device \"vd2\" is not one of this service's cpu devices (vd0, vd1)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { p.bind("gpu0"); }).find("GPUs need --backend cuda"), std::string::npos);
  EXPECT_NE(error_of([&] { p.bind("vd01x"); }).find("vd01x"), std::string::npos);
  // A whole table: the gear is named too.
  EXPECT_NE(error_of([&] { p.check(table({{"vd0"}, {"vd0", "gpu3"}})); }).find("gear g1: device \"gpu3\""),
            std::string::npos);
  EXPECT_EQ(error_of([&] { p.check(table({{"vd1"}, {"vd0", "vd1"}})); }), "");
}

TEST(DevicePool, VirtualDeviceCountFromTheOperator) {
  // --virtual-devices 4 makes four even if the table names two: a reloaded
  // table may use the others.
  DevicePool p(DevicePool::Kind::cpu, table({{"vd0", "vd1"}}), 4);
  EXPECT_EQ(p.devices().size(), 4u);
  EXPECT_EQ(error_of([&] { p.bind("vd3"); }), "");
}

TEST(DevicePool, NamedBindsTheTopologysDevicesOnly) {
  ftp::doc::Topology topo;
  ftp::doc::Device d;
  d.id = "n0.gpu0";
  d.type = "gpu";
  topo.devices.push_back(d);
  DevicePool p(DevicePool::Kind::named, table({{"n0.gpu0"}}), 0, &topo);
  EXPECT_EQ(error_of([&] { p.bind("n0.gpu0"); }), "");
  EXPECT_NE(error_of([&] { p.bind("n0.gpu1"); }).find("not in the topology"), std::string::npos);
  // Without a topology the table's own names are the devices.
  DevicePool q(DevicePool::Kind::named, table({{"a", "b"}}), 0);
  EXPECT_EQ(error_of([&] { q.bind("b"); }), "");
  EXPECT_NE(error_of([&] { q.bind("c"); }), "");
}

TEST(DevicePool, LeasesAndLostDevices) {
  DevicePool p(DevicePool::Kind::cpu, table({{"vd0", "vd1"}}), 2);
  p.lease("d0", {"vd0", "vd1"});
  p.lease("d1", {"vd1"});
  auto st = p.status();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0]["state"], "leased");
  EXPECT_EQ(st[1]["held_by"].size(), 2u);
  p.release("d0");
  st = p.status();
  EXPECT_EQ(st[0]["state"], "free");
  p.mark_lost("vd0", "its worker died");
  EXPECT_NE(error_of([&] { p.lease("d2", {"vd0"}); }).find("device vd0 is lost (its worker died)"), std::string::npos);
  st = p.status();
  EXPECT_EQ(st[0]["state"], "lost");
  EXPECT_EQ(st[0]["lost_because"], "its worker died");
  EXPECT_EQ(p.lost().size(), 1u);
}

namespace {

/// Two GPUs as discover_gpus() would describe them (no GPU here).
std::vector<ftp::hardware::GpuInfo> two_fake_gpus() {
  std::vector<ftp::hardware::GpuInfo> g(2);
  for (int i = 0; i < 2; ++i) {
    g[static_cast<std::size_t>(i)].index = i;
    g[static_cast<std::size_t>(i)].name = "fake GPU";
    g[static_cast<std::size_t>(i)].memory_bytes = 80ull << 30;
  }
  g[0].uuid = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
  g[1].uuid = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff";
  return g;
}

}  // namespace

TEST(DevicePool, CudaBindsByOrdinalOrUuid) {
  const auto gpus = two_fake_gpus();
  DevicePool p(DevicePool::Kind::cuda, table({{"gpu1"}}), 0, nullptr, 0, &gpus);
  ASSERT_EQ(p.devices().size(), 2u);
  EXPECT_EQ(p.bind("gpu1").gpu, 1);
  EXPECT_EQ(p.bind("cuda:1").gpu, 1);
  EXPECT_EQ(p.bind("GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff").gpu, 1);
  EXPECT_EQ(p.bind("gpu-0A1B2C3D-0000-1111-2222-333344445555").gpu, 0);  // case as typed
  EXPECT_EQ(p.canonical("GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"), "gpu1");
  EXPECT_EQ(p.canonical("cuda:0"), "gpu0");
  EXPECT_EQ(p.canonical("vd3"), "vd3");
  // A gear table naming one GPU twice over: one name once canonical.
  auto t = table({{"GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"}, {"cuda:0", "gpu1"}});
  EXPECT_EQ(p.canonicalize(t), 2);
  EXPECT_EQ(t.gears[0].replicas[0].stages[0].devices[0], "gpu1");
  EXPECT_EQ(t.gears[1].replicas[0].stages[0].devices[0], "gpu0");
  EXPECT_EQ(error_of([&] { p.check(t); }), "");
}

TEST(DevicePool, CudaRefusesADeviceTheTopologyLacksNeverGpu0) {
  const auto gpus = two_fake_gpus();
  DevicePool p(DevicePool::Kind::cuda, table({{"gpu0"}}), 0, nullptr, 0, &gpus);
  const std::string e = error_of([&] { p.bind("gpu2"); });
  EXPECT_NE(e.find("device \"gpu2\" is not one of this service's cuda devices (gpu0 = GPU-0a1b"), std::string::npos) << e;
  const std::string u = error_of([&] { p.bind("GPU-12345678-dead-beef-0000-000000000000"); });
  EXPECT_NE(u.find("device \"GPU-12345678-dead-beef-0000-000000000000\" (a GPU UUID) is not one"), std::string::npos) << u;
  EXPECT_NE(error_of([&] { p.bind("cuda:7"); }).find("device \"gpu7\""), std::string::npos);
  EXPECT_NE(error_of([&] { p.check(table({{"gpu0"}, {"gpu0", "gpu5"}})); }).find("gear g1: device \"gpu5\""),
            std::string::npos);
  // No GPU at all (CI): every GPU name is refused, none falls back to a default.
  const std::vector<ftp::hardware::GpuInfo> none;
  DevicePool empty(DevicePool::Kind::cuda, table({{"gpu0"}}), 0, nullptr, 0, &none);
  EXPECT_NE(error_of([&] { empty.bind("gpu0"); }).find("(none)"), std::string::npos);
}

TEST(DevicePool, NamedBindsATopologyUuidToItsId) {
  ftp::doc::Topology topo;
  ftp::doc::Device d;
  d.id = "n0.gpu3";
  d.type = "gpu";
  d.uuid = "GPU-11112222-3333-4444-5555-666677778888";
  topo.devices.push_back(d);
  DevicePool p(DevicePool::Kind::named, table({{"n0.gpu3"}}), 0, &topo);
  EXPECT_EQ(p.canonical("GPU-11112222-3333-4444-5555-666677778888"), "n0.gpu3");
  EXPECT_EQ(p.bind("GPU-11112222-3333-4444-5555-666677778888").name, "n0.gpu3");
  EXPECT_NE(error_of([&] { p.bind("GPU-00000000-3333-4444-5555-666677778888"); }).find("not in the topology"),
            std::string::npos);
}
