// SPDX-License-Identifier: Apache-2.0
#include "doc/topology.hpp"

#include <map>
#include <set>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::doc {

using json::Json;
using json::Node;

namespace {

const std::vector<std::string> kDeviceTypes = {"cpu", "virtual", "gpu", "mig"};
const std::vector<std::string> kLinkTypes = {"nvlink", "nvswitch", "pcie", "shared-memory",
                                             "infiniband", "ethernet", "roce"};
const std::vector<std::string> kPerfSources = {"measured", "datasheet", "estimated"};

Json allreduce_to_json(const AllReduce& a) {
  return Json{{"ranks", a.ranks},           {"bytes", a.bytes},
              {"time_us", a.time_us},       {"algbw_gb_s", a.algbw_gb_s},
              {"busbw_gb_s", a.busbw_gb_s}, {"latency_us", a.latency_us},
              {"via", a.via}};
}

AllReduce allreduce_from(const Node& n) {
  n.expect_object();
  AllReduce a;
  a.ranks = n.positive_int("ranks");
  a.bytes = static_cast<std::uint64_t>(n.positive_integer("bytes", true));
  a.time_us = n.positive("time_us", true);
  a.algbw_gb_s = n.positive("algbw_gb_s", true);
  a.busbw_gb_s = n.positive("busbw_gb_s", true);
  a.latency_us = n.has("latency_us") ? n.positive("latency_us", true) : 0;
  a.via = n.one_of("via", {"inproc", "nccl", "estimated"});
  return a;
}

}  // namespace

double allreduce_busbw(double algbw_gb_s, int n_ranks) {
  if (n_ranks <= 1) return 0;
  return algbw_gb_s * 2.0 * (n_ranks - 1) / n_ranks;
}

const Device* Topology::find_device(const std::string& id) const {
  for (const auto& d : devices)
    if (d.id == id) return &d;
  return nullptr;
}

int Topology::island_of(const std::string& device_id) const {
  for (std::size_t i = 0; i < islands.size(); ++i)
    for (const auto& d : islands[i].devices)
      if (d == device_id) return static_cast<int>(i);
  return -1;
}

std::optional<Link> Topology::link_between(const std::string& a, const std::string& b) const {
  std::optional<Link> best;
  auto consider = [&](const Link& l) {
    if (!best || l.bandwidth_gb_s > best->bandwidth_gb_s) best = l;
  };
  for (const auto& l : links)
    if ((l.a == a && l.b == b) || (l.a == b && l.b == a)) consider(l);
  for (const auto& f : fabrics) {
    bool ha = false, hb = false;
    for (const auto& d : f.devices) {
      ha = ha || d == a;
      hb = hb || d == b;
    }
    if (ha && hb) consider(Link{a, b, f.type, f.bandwidth_gb_s, f.latency_us});
  }
  return best;
}

Json to_json(const Topology& t) {
  Json nodes = Json::array();
  for (const auto& n : t.nodes) {
    Json o{{"id", n.id}, {"hostname", n.hostname}};
    if (!n.cpu_model.empty()) o["cpu_model"] = n.cpu_model;
    if (n.cpu_cores) o["cpu_cores"] = n.cpu_cores;
    if (n.numa_nodes) o["numa_nodes"] = n.numa_nodes;
    if (n.memory_bytes) o["memory_bytes"] = n.memory_bytes;
    nodes.push_back(std::move(o));
  }
  Json devices = Json::array();
  for (const auto& d : t.devices) {
    Json o{{"id", d.id}, {"type", d.type}, {"name", d.name}, {"node", d.node}};
    if (!d.parent.empty()) o["parent"] = d.parent;
    o["memory_bytes"] = d.memory_bytes;
    o["compute_units"] = d.compute_units;
    o["gemm_tflop_s"] = d.gemm_tflop_s;
    if (!d.gemm_dtype.empty()) o["gemm_dtype"] = d.gemm_dtype;
    o["memory_bandwidth_gb_s"] = d.memory_bandwidth_gb_s;
    o["perf_source"] = d.perf_source;
    if (d.numa_node >= 0) o["numa_node"] = d.numa_node;
    if (!d.uuid.empty()) o["uuid"] = d.uuid;
    devices.push_back(std::move(o));
  }
  Json links = Json::array();
  for (const auto& l : t.links)
    links.push_back(Json{{"a", l.a}, {"b", l.b}, {"type", l.type},
                         {"bandwidth_gb_s", l.bandwidth_gb_s}, {"latency_us", l.latency_us}});
  Json fabrics = Json::array();
  for (const auto& f : t.fabrics)
    fabrics.push_back(Json{{"id", f.id}, {"type", f.type}, {"devices", f.devices},
                           {"bandwidth_gb_s", f.bandwidth_gb_s}, {"latency_us", f.latency_us}});
  Json islands = Json::array();
  for (const auto& i : t.islands) {
    Json o{{"id", i.id}, {"devices", i.devices}};
    if (i.allreduce) o["allreduce"] = allreduce_to_json(*i.allreduce);
    islands.push_back(std::move(o));
  }
  return Json{{"kind", kind::topology}, {"source", t.source}, {"name", t.name},
              {"nodes", nodes},         {"devices", devices}, {"links", links},
              {"fabrics", fabrics},         {"islands", islands}};
}

Topology topology_from_json(const Json& j) {
  Node root(j, "");
  json::expect_kind(root, kind::topology);
  Topology t;
  t.source = root.one_of("source", {"probe", "cluster-spec"});
  t.name = root.str_or("name", "");
  for (const auto& n : root.at("nodes").items()) {
    n.expect_object();
    Host node;
    node.id = n.str("id");
    node.hostname = n.str_or("hostname", "");
    node.cpu_model = n.str_or("cpu_model", "");
    node.cpu_cores = n.has("cpu_cores") ? n.positive_int("cpu_cores", true) : 0;
    node.numa_nodes = n.has("numa_nodes") ? n.positive_int("numa_nodes", true) : 0;
    node.memory_bytes = static_cast<std::uint64_t>(n.has("memory_bytes") ? n.positive_integer("memory_bytes", true) : 0);
    t.nodes.push_back(std::move(node));
  }
  for (const auto& n : root.at("devices").items()) {
    n.expect_object();
    Device d;
    d.id = n.str("id");
    d.type = n.one_of("type", kDeviceTypes);
    d.name = n.str_or("name", "");
    d.node = n.str("node");
    d.parent = n.str_or("parent", "");
    d.memory_bytes = static_cast<std::uint64_t>(n.positive_integer("memory_bytes"));
    d.compute_units = n.has("compute_units") ? n.positive_int("compute_units", true) : 0;
    d.gemm_tflop_s = n.positive("gemm_tflop_s", true);
    d.gemm_dtype = n.str_or("gemm_dtype", "");
    d.memory_bandwidth_gb_s = n.positive("memory_bandwidth_gb_s", true);
    d.perf_source = n.one_of("perf_source", kPerfSources);
    d.numa_node = static_cast<int>(n.integer_or("numa_node", -1));
    d.uuid = n.str_or("uuid", "");
    t.devices.push_back(std::move(d));
  }
  if (auto links = root.find("links")) {
    for (const auto& n : links->items()) {
      n.expect_object();
      Link l;
      l.a = n.str("a");
      l.b = n.str("b");
      l.type = n.one_of("type", kLinkTypes);
      l.bandwidth_gb_s = n.positive("bandwidth_gb_s");
      l.latency_us = n.positive("latency_us", true);
      t.links.push_back(std::move(l));
    }
  }
  if (auto fabrics = root.find("fabrics")) {
    for (const auto& n : fabrics->items()) {
      n.expect_object();
      Fabric f;
      f.id = n.str("id");
      f.type = n.one_of("type", kLinkTypes);
      for (const auto& d : n.at("devices").items()) f.devices.push_back(d.str());
      f.bandwidth_gb_s = n.positive("bandwidth_gb_s");
      f.latency_us = n.positive("latency_us", true);
      t.fabrics.push_back(std::move(f));
    }
  }
  for (const auto& n : root.at("islands").items()) {
    n.expect_object();
    Island i;
    i.id = n.str("id");
    for (const auto& d : n.at("devices").items()) i.devices.push_back(d.str());
    if (auto a = n.find("allreduce")) i.allreduce = allreduce_from(*a);
    t.islands.push_back(std::move(i));
  }
  validate(t);
  return t;
}

void validate(const Topology& t) {
  std::set<std::string> node_ids;
  for (std::size_t i = 0; i < t.nodes.size(); ++i)
    if (!node_ids.insert(t.nodes[i].id).second)
      throw InputError("nodes[" + std::to_string(i) + "].id: duplicate node \"" + t.nodes[i].id + "\"");
  std::set<std::string> dev_ids;
  for (std::size_t i = 0; i < t.devices.size(); ++i) {
    const auto& d = t.devices[i];
    std::string p = "devices[" + std::to_string(i) + "]";
    if (d.id.empty()) throw InputError(p + ".id: must not be empty");
    if (!dev_ids.insert(d.id).second) throw InputError(p + ".id: duplicate device \"" + d.id + "\"");
    if (!node_ids.count(d.node)) throw InputError(p + ".node: unknown node \"" + d.node + "\"");
  }
  for (std::size_t i = 0; i < t.devices.size(); ++i) {
    const auto& d = t.devices[i];
    if (!d.parent.empty() && !dev_ids.count(d.parent) && d.type != "virtual" && d.type != "mig")
      throw InputError("devices[" + std::to_string(i) + "].parent: unknown device \"" + d.parent + "\"");
  }
  for (std::size_t i = 0; i < t.links.size(); ++i) {
    const auto& l = t.links[i];
    std::string p = "links[" + std::to_string(i) + "]";
    if (!dev_ids.count(l.a)) throw InputError(p + ".a: unknown device \"" + l.a + "\"");
    if (!dev_ids.count(l.b)) throw InputError(p + ".b: unknown device \"" + l.b + "\"");
    if (l.a == l.b) throw InputError(p + ": a link joins two different devices, got \"" + l.a + "\" twice");
  }
  for (std::size_t i = 0; i < t.fabrics.size(); ++i)
    for (std::size_t k = 0; k < t.fabrics[i].devices.size(); ++k)
      if (!dev_ids.count(t.fabrics[i].devices[k]))
        throw InputError("fabrics[" + std::to_string(i) + "].devices[" + std::to_string(k) + "]: unknown device \"" +
                         t.fabrics[i].devices[k] + "\"");
  std::map<std::string, std::string> owner;
  std::set<std::string> island_ids;
  for (std::size_t i = 0; i < t.islands.size(); ++i) {
    const auto& is = t.islands[i];
    std::string p = "islands[" + std::to_string(i) + "]";
    if (!island_ids.insert(is.id).second) throw InputError(p + ".id: duplicate island \"" + is.id + "\"");
    if (is.devices.empty()) throw InputError(p + ".devices: an island holds at least one device");
    for (std::size_t k = 0; k < is.devices.size(); ++k) {
      const auto& d = is.devices[k];
      std::string dp = p + ".devices[" + std::to_string(k) + "]";
      if (!dev_ids.count(d)) throw InputError(dp + ": unknown device \"" + d + "\"");
      auto [it, fresh] = owner.emplace(d, is.id);
      if (!fresh) throw InputError(dp + ": device \"" + d + "\" is already in island \"" + it->second + "\"");
    }
  }
}

}  // namespace ftp::doc
