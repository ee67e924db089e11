// SPDX-License-Identifier: Apache-2.0
// member::gather's parts that need no second process: a member's probe
// renamed as the device pool names its devices, the network probe's
// bounds, and the all-reduce sequence between ranks that are threads here
// (Gloo over loopback, as between machines). The whole gather over three
// processes is in tests/tools/serve-members.sh.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "comm/gloo.hpp"
#include "comm/rendezvous.hpp"
#include "core/error.hpp"
#include "member/gather.hpp"

using namespace ftp;

namespace {

doc::Topology two_virtual_devices() {
  doc::Topology t;
  t.source = "probe";
  t.name = "box";
  t.nodes.push_back(doc::Host{"node0", "box", "cpu", 2, 1, 1u << 30});
  for (const char* id : {"vd0", "vd1"}) {
    doc::Device d;
    d.id = id;
    d.type = "virtual";
    d.node = "node0";
    d.parent = "cpu0";
    d.memory_bytes = 1u << 29;
    t.devices.push_back(d);
  }
  t.fabrics.push_back(doc::Fabric{"shm0", "shared-memory", {"vd0", "vd1"}, 3.0, 400.0});
  t.islands.push_back(doc::Island{"island0", {"vd0", "vd1"}, std::nullopt});
  return t;
}

}  // namespace

TEST(Gather, AMembersProbeIsNamedAsThePoolNamesItsDevices) {
  const doc::Topology t = member::member_topology(two_virtual_devices(), "n1");
  ASSERT_EQ(t.devices.size(), 2u);
  EXPECT_EQ(t.devices[0].id, "n1/vd0");
  EXPECT_EQ(t.devices[1].id, "n1/vd1");
  EXPECT_EQ(t.devices[0].parent, "n1/cpu0");
  EXPECT_EQ(t.devices[0].node, "n1");
  EXPECT_EQ(t.nodes.at(0).id, "n1");
  EXPECT_EQ(t.fabrics.at(0).id, "n1/shm0");
  EXPECT_EQ(t.fabrics.at(0).devices, (std::vector<std::string>{"n1/vd0", "n1/vd1"}));
  EXPECT_EQ(t.islands.at(0).id, "n1/island0");
  EXPECT_EQ(t.islands.at(0).devices, (std::vector<std::string>{"n1/vd0", "n1/vd1"}));
  EXPECT_NO_THROW(doc::validate(t));
  // Beside the leader's own probe, nothing collides.
  doc::Topology both = two_virtual_devices();
  for (auto& n : both.nodes) n.id = "n0";
  for (auto& d : both.devices) d.node = "n0";
  both.nodes.insert(both.nodes.end(), t.nodes.begin(), t.nodes.end());
  both.devices.insert(both.devices.end(), t.devices.begin(), t.devices.end());
  both.fabrics.insert(both.fabrics.end(), t.fabrics.begin(), t.fabrics.end());
  both.islands.insert(both.islands.end(), t.islands.begin(), t.islands.end());
  EXPECT_NO_THROW(doc::validate(both));
  EXPECT_EQ(both.island_of("n1/vd1"), 1);
  EXPECT_EQ(both.island_of("vd1"), 0);
}

TEST(Gather, TheNetworkProbeIsBoundedAndNamesTheField) {
  const member::NetworkProbe d = member::network_probe_from_json(json::Json::object());
  EXPECT_EQ(d.bytes, 4u << 20);
  const member::NetworkProbe p =
      member::network_probe_from_json(json::Json{{"bytes", 8192}, {"iterations", 3}, {"latency_iterations", 5}});
  EXPECT_EQ(p.bytes, 8192u);
  EXPECT_EQ(p.iterations, 3);
  EXPECT_EQ(p.latency_iterations, 5);
  auto err = [](const json::Json& j) {
    try {
      member::network_probe_from_json(j);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(err(json::Json{{"bytes", 1LL << 40}}), "netprobe: bytes: must be an integer from 4096 to 268435456");
  EXPECT_EQ(err(json::Json{{"iterations", 0}}), "netprobe: iterations: must be an integer from 1 to 1000");
  EXPECT_EQ(err(json::Json{{"latency_iterations", "many"}}),
            "netprobe: latency_iterations: must be an integer from 1 to 10000");
}

TEST(Gather, TheAllReduceBetweenRanksIsMeasuredWithNcclTestsDefinitions) {
  comm::LocalStore store;
  member::NetworkProbe p;
  p.bytes = 1u << 20;
  p.iterations = 3;
  p.latency_iterations = 5;
  auto other = std::async(std::launch::async, [&] {
    comm::GlooGroup g(store, "netprobe/t", 1, 2);
    return member::run_network_probe(g, p);
  });
  comm::GlooGroup g(store, "netprobe/t", 0, 2);
  const doc::AllReduce a = member::run_network_probe(g, p);
  other.get();
  EXPECT_EQ(a.ranks, 2);
  EXPECT_EQ(a.bytes, 1u << 20);
  EXPECT_EQ(a.via, "gloo");
  EXPECT_GT(a.time_us, 0);
  EXPECT_GT(a.latency_us, 0);
  EXPECT_NEAR(a.algbw_gb_s, static_cast<double>(a.bytes) / (a.time_us * 1e3), 1e-6 * a.algbw_gb_s);
  EXPECT_DOUBLE_EQ(a.busbw_gb_s, a.algbw_gb_s);  // 2 (n - 1) / n = 1 for two ranks
}
