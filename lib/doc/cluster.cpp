// SPDX-License-Identifier: Apache-2.0
#include "doc/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::doc {

namespace {
/// Devices one island (devices joined by fast links) may hold.
constexpr std::size_t kMaxIslandDevices = 4096;
}  // namespace

using json::Json;
using json::Node;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr std::uint64_t kAllReduceBytes = 256ull << 20;  // message for the estimate

const std::vector<std::string> kLinkTypes = {"nvlink", "nvswitch", "pcie", "shared-memory",
                                             "infiniband", "ethernet", "roce"};

bool island_type(const std::string& type) {
  return type == "nvlink" || type == "nvswitch" || type == "pcie" || type == "shared-memory";
}

std::uint64_t gib_bytes(const Node& n, std::string_view key) {
  const double bytes = n.positive(key) * kGiB;
  // Whole bytes that a topology's memory_bytes can hold (at most 2^62).
  if (!(bytes >= 1.0 && bytes <= 4611686018427387904.0))
    n.at(key).fail("out of range: must come to between 1 byte and 2^62 bytes (4 EiB), got " + n.at(key).value().dump() +
                   " GiB");
  return static_cast<std::uint64_t>(std::llround(bytes));
}

/// "3g.40gb" -> 3/7 of the GPU's compute (A100/H100 have 7 compute slices).
double profile_compute_fraction(const Node& slice, const std::string& profile) {
  auto g = profile.find('g');
  int slices = 0;
  if (g != std::string::npos && g > 0) {
    try {
      slices = std::stoi(profile.substr(0, g));
    } catch (...) {
      slices = 0;
    }
  }
  if (slices < 1 || slices > 7)
    slice.at("profile").fail("expected a MIG profile like \"3g.40gb\" (1..7 compute slices), got \"" + profile + "\"");
  return slices / 7.0;
}

struct UnionFind {
  std::vector<std::size_t> parent;
  explicit UnionFind(std::size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  std::size_t find(std::size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void join(std::size_t a, std::size_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

}  // namespace

AllReduce estimate_ring_allreduce(int n, double link_gb_s, double link_latency_us, std::uint64_t bytes) {
  AllReduce a;
  a.ranks = n;
  a.bytes = bytes;
  a.via = "estimated";
  if (n <= 1 || link_gb_s <= 0) return a;
  // A ring moves 2(n-1)/n of the message over the slowest link, in 2(n-1) steps.
  a.busbw_gb_s = link_gb_s;
  a.algbw_gb_s = link_gb_s * n / (2.0 * (n - 1));
  a.latency_us = 2.0 * (n - 1) * link_latency_us;
  a.time_us = a.latency_us + static_cast<double>(bytes) / (a.algbw_gb_s * 1e3);
  return a;
}

Topology topology_from_cluster_spec(const Json& spec) {
  Node root(spec, "");
  json::expect_kind(root, kind::cluster);
  Topology t;
  t.source = "cluster-spec";
  t.name = root.str_or("name", "");

  // Where each device came from, for path-precise errors further down.
  std::map<std::string, std::string> where;
  std::map<std::string, std::vector<std::string>> node_devices;

  auto nodes = root.at("nodes").items();
  if (nodes.empty()) root.at("nodes").fail("a cluster holds at least one node");
  for (const auto& nn : nodes) {
    nn.expect_object();
    Host node;
    node.id = nn.str("id");
    if (node.id.empty()) nn.at("id").fail("must not be empty");
    for (const auto& existing : t.nodes)
      if (existing.id == node.id) nn.at("id").fail("duplicate node \"" + node.id + "\"");
    node.hostname = nn.str_or("hostname", node.id);
    node.cpu_model = nn.str_or("cpu_model", "");
    node.cpu_cores = nn.has("cpu_cores") ? nn.positive_int("cpu_cores") : 0;
    node.memory_bytes = nn.has("memory_gib") ? gib_bytes(nn, "memory_gib") : 0;
    t.nodes.push_back(node);

    auto devs = nn.at("devices").items();
    if (devs.empty()) nn.at("devices").fail("a node holds at least one device");
    for (const auto& dn : devs) {
      dn.expect_object();
      Device base;
      std::string local = dn.str("id");
      if (local.empty()) dn.at("id").fail("must not be empty");
      base.type = dn.one_of("type", {"gpu", "cpu"});
      base.name = dn.str("name");
      base.node = node.id;
      base.memory_bytes = gib_bytes(dn, "memory_gib");
      base.gemm_tflop_s = dn.positive("tflop_s");
      base.gemm_dtype = dn.str_or("dtype", base.type == "gpu" ? "bf16" : "f32");
      base.memory_bandwidth_gb_s = dn.positive("memory_bandwidth_gb_s");
      base.compute_units = dn.has("compute_units") ? dn.positive_int("compute_units") : 0;
      base.perf_source = dn.has("perf_source") ? dn.one_of("perf_source", {"measured", "datasheet", "estimated"})
                                               : "datasheet";
      int count = dn.has("count") ? dn.positive_int("count") : 1;
      auto mig = dn.find("mig");
      if (mig && base.type != "gpu") mig->fail("only a gpu can be cut into MIG slices");
      for (int i = 0; i < count; ++i) {
        Device d = base;
        d.id = node.id + "." + local + (dn.has("count") ? std::to_string(i) : "");
        if (where.count(d.id)) dn.at("id").fail("device id \"" + d.id + "\" is already used by " + where[d.id]);
        if (!mig) {
          where[d.id] = dn.path();
          node_devices[node.id].push_back(d.id);
          t.devices.push_back(d);
          continue;
        }
        // A GPU cut into MIG slices is scheduled as its slices only.
        double mem_used = 0;
        auto slices = mig->items();
        if (slices.empty()) mig->fail("list at least one MIG slice, or leave out \"mig\"");
        for (const auto& sn : slices) {
          sn.expect_object();
          Device s = base;
          s.type = "mig";
          s.parent = d.id;
          s.id = d.id + "." + sn.str("id");
          std::string profile = sn.str("profile");
          s.name = base.name + " MIG " + profile;
          s.memory_bytes = gib_bytes(sn, "memory_gib");
          mem_used += static_cast<double>(s.memory_bytes);
          double compute = sn.has("compute_fraction") ? sn.positive("compute_fraction")
                                                      : profile_compute_fraction(sn, profile);
          if (compute > 1) sn.at("compute_fraction").fail("must be at most 1");
          s.gemm_tflop_s = base.gemm_tflop_s * compute;
          s.compute_units = static_cast<int>(base.compute_units * compute);
          s.memory_bandwidth_gb_s = base.memory_bandwidth_gb_s * static_cast<double>(s.memory_bytes) /
                                    static_cast<double>(base.memory_bytes);
          if (where.count(s.id)) sn.at("id").fail("device id \"" + s.id + "\" is already used by " + where[s.id]);
          where[s.id] = sn.path();
          node_devices[node.id].push_back(s.id);
          t.devices.push_back(s);
        }
        if (mem_used > static_cast<double>(base.memory_bytes) * 1.0001)
          mig->fail("MIG slices take " + Json(mem_used / kGiB).dump() + " GiB, the GPU has " +
                    Json(static_cast<double>(base.memory_bytes) / kGiB).dump() + " GiB");
      }
    }
  }

  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < t.devices.size(); ++i) index[t.devices[i].id] = i;
  UnionFind uf(t.devices.size());
  auto device_ref = [&](const Node& n) {
    std::string id = n.str();
    if (!index.count(id)) n.fail("unknown device \"" + id + "\"");
    return id;
  };

  if (auto fabrics = root.find("fabrics")) {
    std::size_t k = 0;
    for (const auto& fn : fabrics->items()) {
      fn.expect_object();
      Fabric f;
      f.id = fn.str_or("id", "fabric" + std::to_string(k++));
      f.type = fn.one_of("type", kLinkTypes);
      f.bandwidth_gb_s = fn.positive("bandwidth_gb_s");
      f.latency_us = fn.positive("latency_us", true);
      if (auto ds = fn.find("devices"))
        for (const auto& dn : ds->items()) f.devices.push_back(device_ref(dn));
      if (auto ns = fn.find("nodes")) {
        for (const auto& nn : ns->items()) {
          std::string id = nn.str();
          if (!node_devices.count(id)) nn.fail("unknown node \"" + id + "\"");
          for (const auto& d : node_devices[id]) f.devices.push_back(d);
        }
      }
      std::set<std::string> seen;
      for (const auto& d : f.devices)
        if (!seen.insert(d).second) fn.fail("device \"" + d + "\" is listed twice");
      if (f.devices.size() < 2) fn.fail("a fabric joins at least two devices (give \"devices\" or \"nodes\")");
      bool joins = fn.boolean_or("island", island_type(f.type));
      if (joins)
        for (const auto& d : f.devices) uf.join(index[f.devices[0]], index[d]);
      t.fabrics.push_back(std::move(f));
    }
  }
  if (auto links = root.find("links")) {
    for (const auto& ln : links->items()) {
      ln.expect_object();
      Link l;
      l.a = device_ref(ln.at("a"));
      l.b = device_ref(ln.at("b"));
      if (l.a == l.b) ln.at("b").fail("a link joins two different devices, got \"" + l.a + "\" twice");
      l.type = ln.one_of("type", kLinkTypes);
      l.bandwidth_gb_s = ln.positive("bandwidth_gb_s");
      l.latency_us = ln.positive("latency_us", true);
      if (ln.boolean_or("island", island_type(l.type))) uf.join(index[l.a], index[l.b]);
      t.links.push_back(std::move(l));
    }
  }

  // Islands in order of their first device; an estimate of each one's all-reduce.
  std::map<std::size_t, std::size_t> island_of_root;
  for (std::size_t i = 0; i < t.devices.size(); ++i) {
    std::size_t r = uf.find(i);
    auto [it, fresh] = island_of_root.emplace(r, t.islands.size());
    if (fresh) t.islands.push_back(Island{"island" + std::to_string(t.islands.size()), {}, std::nullopt});
    t.islands[it->second].devices.push_back(t.devices[i].id);
  }
  for (auto& is : t.islands) {
    if (is.devices.size() < 2) continue;
    // The estimate looks at every pair; islands (NVLink domains, nodes)
    // hold tens to hundreds of devices, so a larger one is a spec error.
    if (is.devices.size() > kMaxIslandDevices)
      throw InputError("an island of " + std::to_string(is.devices.size()) + " devices (from " + is.devices.front() +
                       "): more than " + std::to_string(kMaxIslandDevices) +
                       " devices joined by island links; check the fabrics' island flag and device counts");
    double bw = 0, lat = 0;
    bool first = true;
    for (std::size_t a = 0; a < is.devices.size(); ++a) {
      for (std::size_t b = a + 1; b < is.devices.size(); ++b) {
        auto l = t.link_between(is.devices[a], is.devices[b]);
        // Inside an island two devices without a direct link reach each other
        // through others; the ring uses direct neighbours, so skip the pair.
        if (!l) continue;
        bw = first ? l->bandwidth_gb_s : std::min(bw, l->bandwidth_gb_s);
        lat = first ? l->latency_us : std::max(lat, l->latency_us);
        first = false;
      }
    }
    is.allreduce = estimate_ring_allreduce(static_cast<int>(is.devices.size()), bw, lat, kAllReduceBytes);
  }
  validate(t);
  return t;
}

}  // namespace ftp::doc
