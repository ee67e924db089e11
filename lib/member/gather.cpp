// SPDX-License-Identifier: Apache-2.0
#include "member/gather.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <vector>

#include "core/error.hpp"
#include "member/leader.hpp"

namespace ftp::member {

namespace {

int bounded_int(const json::Json& j, const char* key, int def, int lo, int hi) {
  if (!j.contains(key)) return def;
  const json::Json& v = j.at(key);
  if (!v.is_number_integer() || v.get<long long>() < lo || v.get<long long>() > hi)
    throw InputError(std::string("netprobe: ") + key + ": must be an integer from " + std::to_string(lo) + " to " +
                     std::to_string(hi));
  return static_cast<int>(v.get<long long>());
}

/// Seconds of `n` all-reduces of `count` floats on `g`.
double time_all_reduces(comm::GlooGroup& g, std::vector<float>& buf, int n) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) g.all_reduce_sum(buf.data(), buf.size());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string prefixed(const std::string& name, const std::string& id) { return id.empty() ? id : name + "/" + id; }

}  // namespace

json::Json to_json(const NetworkProbe& p) {
  return json::Json{{"bytes", p.bytes}, {"iterations", p.iterations}, {"latency_iterations", p.latency_iterations}};
}

NetworkProbe network_probe_from_json(const json::Json& j) {
  NetworkProbe p;
  p.bytes = static_cast<std::size_t>(bounded_int(j, "bytes", static_cast<int>(p.bytes), 4096, 256 << 20));
  p.iterations = bounded_int(j, "iterations", p.iterations, 1, 1000);
  p.latency_iterations = bounded_int(j, "latency_iterations", p.latency_iterations, 1, 10000);
  return p;
}

doc::AllReduce run_network_probe(comm::GlooGroup& group, const NetworkProbe& p) {
  std::vector<float> small(4096 / sizeof(float), 1.0f), big(p.bytes / sizeof(float), 1.0f);
  time_all_reduces(group, small, 1);  // warm-up: the pairs' first messages
  const double lat_s = time_all_reduces(group, small, p.latency_iterations);
  time_all_reduces(group, big, 1);
  const double big_s = time_all_reduces(group, big, p.iterations);
  doc::AllReduce a;
  a.ranks = group.size();
  a.bytes = big.size() * sizeof(float);
  a.time_us = big_s / p.iterations * 1e6;
  a.algbw_gb_s = big_s > 0 ? static_cast<double>(a.bytes) * p.iterations / big_s / 1e9 : 0;
  a.busbw_gb_s = doc::allreduce_busbw(a.algbw_gb_s, a.ranks);
  a.latency_us = lat_s / p.latency_iterations * 1e6;
  a.via = "gloo";
  return a;
}

doc::Topology member_topology(const doc::Topology& probe, const std::string& name) {
  doc::Topology t = probe;
  for (auto& n : t.nodes) n.id = name;
  for (auto& d : t.devices) {
    d.id = prefixed(name, d.id);
    d.parent = prefixed(name, d.parent);
    d.node = name;
  }
  for (auto& l : t.links) {
    l.a = prefixed(name, l.a);
    l.b = prefixed(name, l.b);
  }
  for (auto& f : t.fabrics) {
    f.id = prefixed(name, f.id);
    for (auto& d : f.devices) d = prefixed(name, d);
  }
  for (auto& i : t.islands) {
    i.id = prefixed(name, i.id);
    for (auto& d : i.devices) d = prefixed(name, d);
  }
  return t;
}

doc::Topology gather_topology(Leader& leader, doc::Topology local, const GatherOptions& o) {
  std::vector<std::string> names;
  for (const auto& m : leader.members())
    if (m.alive) names.push_back(m.name);
  doc::Topology all = std::move(local);
  if (names.empty()) return all;

  // Each member probes its machine (in parallel: seconds each).
  std::vector<std::future<json::Json>> probes;
  for (const auto& n : names)
    probes.push_back(std::async(std::launch::async, [&leader, n, &o] {
      return leader.request(n, json::Json{{"type", "probe"}, {"quick", o.quick}}, o.timeout_ms);
    }));
  for (std::size_t i = 0; i < names.size(); ++i) {
    const json::Json r = probes[i].get();
    if (!r.contains("topology")) throw Error("member " + names[i] + ": probe: the reply holds no topology");
    doc::Topology t = member_topology(doc::topology_from_json(r.at("topology")), names[i]);
    all.nodes.insert(all.nodes.end(), t.nodes.begin(), t.nodes.end());
    all.devices.insert(all.devices.end(), t.devices.begin(), t.devices.end());
    all.links.insert(all.links.end(), t.links.begin(), t.links.end());
    all.fabrics.insert(all.fabrics.end(), t.fabrics.begin(), t.fabrics.end());
    all.islands.insert(all.islands.end(), t.islands.begin(), t.islands.end());
  }

  // The link between machines: one all-reduce group of a rank per process.
  static std::atomic<int> serial{0};
  const std::string prefix = "netprobe/" + std::to_string(++serial);
  const int size = static_cast<int>(names.size()) + 1;
  std::vector<std::future<json::Json>> ranks;
  for (std::size_t i = 0; i < names.size(); ++i)
    ranks.push_back(std::async(std::launch::async, [&leader, &o, n = names[i], prefix, size, r = static_cast<int>(i) + 1] {
      json::Json req = to_json(o.network);
      req["type"] = "netprobe";
      req["group"] = prefix;
      req["rank"] = r;
      req["size"] = size;
      return leader.request(n, req, o.timeout_ms);
    }));
  doc::AllReduce a;
  try {
    comm::GlooGroup group(leader.store(), prefix, 0, size, o.gloo);
    a = run_network_probe(group, o.network);
  } catch (...) {
    for (auto& f : ranks) f.wait();
    leader.store().erase_prefix(prefix);
    throw;
  }
  for (auto& f : ranks) f.get();  // rethrows a member's failure, naming it
  leader.store().erase_prefix(prefix);

  doc::Fabric net;
  net.id = "network0";
  net.type = "ethernet";
  for (const auto& d : all.devices) net.devices.push_back(d.id);
  net.bandwidth_gb_s = a.busbw_gb_s;
  net.latency_us = a.latency_us;
  all.fabrics.push_back(std::move(net));
  all.name += " + " + std::to_string(names.size()) + " member(s)";
  doc::validate(all);
  return all;
}

}  // namespace ftp::member
