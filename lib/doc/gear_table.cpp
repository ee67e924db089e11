// SPDX-License-Identifier: Apache-2.0
#include "doc/gear_table.hpp"

#include <cstdint>
#include <limits>
#include <set>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::doc {

using json::Json;
using json::Node;

namespace {

std::string at_index(const std::string& base, std::size_t i) { return base + "[" + std::to_string(i) + "]"; }

std::string num(double v) {
  Json j = v;
  return j.dump();
}

}  // namespace

std::vector<std::string> Gear::devices() const {
  std::vector<std::string> out;
  for (const auto& r : replicas)
    for (const auto& s : r.stages) out.insert(out.end(), s.devices.begin(), s.devices.end());
  return out;
}

const Gear* GearTable::find(const std::string& name) const {
  int i = index_of(name);
  return i < 0 ? nullptr : &gears[static_cast<std::size_t>(i)];
}

int GearTable::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < gears.size(); ++i)
    if (gears[i].name == name) return static_cast<int>(i);
  return -1;
}

Json to_json(const Capacity& c, bool with_kind) {
  Json o = Json::object();
  if (with_kind) o["kind"] = kind::capacity;
  if (!c.gear.empty()) o["gear"] = c.gear;
  o["max_rps"] = c.max_rps;
  o["safe_rps"] = c.safe_rps;
  o["max_tokens_s"] = c.max_tokens_s;
  o["safe_tokens_s"] = c.safe_tokens_s;
  if (c.prefill_tokens_s > 0) o["prefill_tokens_s"] = c.prefill_tokens_s;
  if (c.decode_tokens_s > 0) o["decode_tokens_s"] = c.decode_tokens_s;
  o["source"] = c.source;
  o["t_ms"] = c.t_ms;
  o["window_s"] = c.window_s;
  return o;
}

Capacity capacity_from_node(const Node& n) {
  n.expect_object();
  Capacity c;
  c.gear = n.str_or("gear", "");
  c.max_rps = n.positive("max_rps", true);
  // Absent: 0, "not given": the policy's capacity.safe_fraction applies
  // (control::CapacityTracker), not a fraction fixed here.
  c.safe_rps = n.has("safe_rps") ? n.positive("safe_rps", true) : 0;
  c.max_tokens_s = n.has("max_tokens_s") ? n.positive("max_tokens_s", true) : 0;
  c.safe_tokens_s = n.has("safe_tokens_s") ? n.positive("safe_tokens_s", true) : 0.8 * c.max_tokens_s;
  c.prefill_tokens_s = n.has("prefill_tokens_s") ? n.positive("prefill_tokens_s", true) : 0;
  c.decode_tokens_s = n.has("decode_tokens_s") ? n.positive("decode_tokens_s", true) : 0;
  c.source = n.one_of("source", {"estimate", "bench", "live"});
  c.t_ms = n.integer_or("t_ms", 0);
  c.window_s = n.has("window_s") ? n.positive("window_s", true) : 0;
  if (c.safe_rps > c.max_rps)
    n.at("safe_rps").fail("must not exceed max_rps (" + num(c.max_rps) + "), got " + num(c.safe_rps));
  if (c.safe_tokens_s > c.max_tokens_s)
    n.at("safe_tokens_s").fail("must not exceed max_tokens_s (" + num(c.max_tokens_s) + "), got " + num(c.safe_tokens_s));
  return c;
}

Capacity capacity_from_json(const Json& j) {
  Node root(j, "");
  json::expect_kind(root, kind::capacity);
  Capacity c = capacity_from_node(root);
  if (c.gear.empty()) root.at("gear");  // throws: a standalone capacity names its gear
  return c;
}

Json to_json(const GearTable& t) {
  Json model{{"name", t.model.name},
             {"n_layers", t.model.n_layers},
             {"n_heads", t.model.n_heads},
             {"n_kv_heads", t.model.n_kv_heads}};
  if (t.model.hidden_size) model["hidden_size"] = t.model.hidden_size;
  if (t.model.n_params) model["n_params"] = t.model.n_params;
  Json gears = Json::array();
  for (const auto& g : t.gears) {
    Json replicas = Json::array();
    for (const auto& r : g.replicas) {
      Json stages = Json::array();
      for (const auto& s : r.stages)
        stages.push_back(Json{{"layers", Json::array({s.first_layer, s.first_layer + s.n_layers})},
                              {"devices", s.devices}});
      replicas.push_back(Json{{"stages", stages}});
    }
    Json o{{"name", g.name},
           {"role", g.role},
           {"tp", g.tp},
           {"pp", g.pp},
           {"dp", g.dp},
           {"micro_batches", g.micro_batches},
           {"max_batched_tokens", g.max_batched_tokens},
           {"kv_cache_cap", g.kv_cache_cap},
           {"weight_mode", g.weight_mode},
           {"replicas", replicas}};
    if (g.estimated) o["estimated"] = to_json(*g.estimated, false);
    if (g.measured) o["measured"] = to_json(*g.measured, false);
    gears.push_back(std::move(o));
  }
  return Json{{"kind", kind::gear_table}, {"model", model}, {"topology", t.topology}, {"gears", gears}};
}

GearTable gear_table_from_json(const Json& j) {
  Node root(j, "");
  json::expect_kind(root, kind::gear_table);
  GearTable t;
  Node m = root.at("model");
  m.expect_object();
  t.model.name = m.str_or("name", "");
  t.model.n_layers = m.positive_int("n_layers");
  t.model.n_heads = m.positive_int("n_heads");
  t.model.n_kv_heads = m.has("n_kv_heads") ? m.positive_int("n_kv_heads") : t.model.n_heads;
  t.model.hidden_size = m.has("hidden_size") ? m.positive_int("hidden_size") : 0;
  t.model.n_params = m.has("n_params") ? static_cast<std::uint64_t>(m.positive_integer("n_params")) : 0;
  t.topology = root.str_or("topology", "");
  for (const auto& gn : root.at("gears").items()) {
    gn.expect_object();
    Gear g;
    g.name = gn.str("name");
    g.role = gn.has("role") ? gn.one_of("role", {"normal", "memory-guard"}) : "normal";
    g.tp = gn.positive_int("tp");
    g.pp = gn.positive_int("pp");
    g.dp = gn.positive_int("dp");
    g.micro_batches = gn.has("micro_batches") ? gn.positive_int("micro_batches") : 1;
    g.max_batched_tokens =
        gn.has("max_batched_tokens") ? gn.positive_int("max_batched_tokens") : 2048;
    g.kv_cache_cap = gn.has("kv_cache_cap") ? gn.positive("kv_cache_cap") : 0.7;
    g.weight_mode = gn.has("weight_mode") ? gn.one_of("weight_mode", {"resident", "release"}) : "resident";
    for (const auto& rn : gn.at("replicas").items()) {
      Replica r;
      for (const auto& sn : rn.at("stages").items()) {
        Stage s;
        Node layers = sn.at("layers");
        auto lr = layers.items();
        if (lr.size() != 2) layers.fail("expected [first, end) as two integers, got " + std::to_string(lr.size()) + " values");
        // In 64 bits first: a bound past INT_MAX must not wrap into range.
        const std::int64_t first = lr[0].integer(), last = lr[1].integer();
        if (first < 0 || last <= first || last > std::numeric_limits<int>::max())
          layers.fail("expected 0 <= first < end <= " + std::to_string(std::numeric_limits<int>::max()) + ", got [" +
                      std::to_string(first) + ", " + std::to_string(last) + "]");
        s.first_layer = static_cast<int>(first);
        const int end = static_cast<int>(last);
        s.n_layers = end - s.first_layer;
        for (const auto& d : sn.at("devices").items()) s.devices.push_back(d.str());
        r.stages.push_back(std::move(s));
      }
      g.replicas.push_back(std::move(r));
    }
    if (auto e = gn.find("estimated")) g.estimated = capacity_from_node(*e);
    if (auto e = gn.find("measured")) g.measured = capacity_from_node(*e);
    t.gears.push_back(std::move(g));
  }
  validate(t);
  return t;
}

void validate(const GearTable& t) {
  const auto& m = t.model;
  if (m.n_layers <= 0) throw InputError("model.n_layers: must be positive, got " + std::to_string(m.n_layers));
  if (m.n_heads <= 0) throw InputError("model.n_heads: must be positive, got " + std::to_string(m.n_heads));
  if (m.n_kv_heads <= 0 || m.n_heads % m.n_kv_heads != 0)
    throw InputError("model.n_kv_heads: must divide n_heads (" + std::to_string(m.n_heads) + "), got " +
                     std::to_string(m.n_kv_heads));
  if (t.gears.empty()) throw InputError("gears: a gear table holds at least one gear");
  std::set<std::string> names;
  int guards = 0;
  for (std::size_t gi = 0; gi < t.gears.size(); ++gi) {
    const Gear& g = t.gears[gi];
    const std::string p = at_index("gears", gi);
    if (g.name.empty()) throw InputError(p + ".name: must not be empty");
    if (!names.insert(g.name).second) throw InputError(p + ".name: duplicate gear \"" + g.name + "\"");
    if (g.role == "memory-guard" && ++guards > 1) throw InputError(p + ".role: only one memory-guard gear per table");
    if (g.tp <= 0) throw InputError(p + ".tp: must be positive, got " + std::to_string(g.tp));
    if (g.pp <= 0) throw InputError(p + ".pp: must be positive, got " + std::to_string(g.pp));
    if (g.dp <= 0) throw InputError(p + ".dp: must be positive, got " + std::to_string(g.dp));
    if (m.n_heads % g.tp != 0)
      throw InputError(p + ".tp: must divide n_heads (" + std::to_string(m.n_heads) + "), got " + std::to_string(g.tp));
    // KV heads are split when tp <= n_kv_heads and replicated when tp > n_kv_heads.
    if (g.tp <= m.n_kv_heads ? m.n_kv_heads % g.tp != 0 : g.tp % m.n_kv_heads != 0)
      throw InputError(p + ".tp: must divide n_kv_heads (" + std::to_string(m.n_kv_heads) + ")" +
                       (g.tp > m.n_kv_heads ? " or be a multiple of it" : "") + ", got " + std::to_string(g.tp));
    if (g.pp > m.n_layers)
      throw InputError(p + ".pp: must not exceed n_layers (" + std::to_string(m.n_layers) + "), got " + std::to_string(g.pp));
    if (g.micro_batches <= 0) throw InputError(p + ".micro_batches: must be positive");
    if (g.max_batched_tokens <= 0) throw InputError(p + ".max_batched_tokens: must be positive");
    if (!(g.kv_cache_cap > 0 && g.kv_cache_cap <= 1))
      throw InputError(p + ".kv_cache_cap: must be in (0, 1], got " + num(g.kv_cache_cap));
    if (g.weight_mode != "resident" && g.weight_mode != "release")
      throw InputError(p + ".weight_mode: must be one of resident, release, got \"" + g.weight_mode + "\"");
    if (static_cast<int>(g.replicas.size()) != g.dp)
      throw InputError(p + ".replicas: expected dp (" + std::to_string(g.dp) + ") replicas, got " +
                       std::to_string(g.replicas.size()));
    std::set<std::string> used;
    for (std::size_t ri = 0; ri < g.replicas.size(); ++ri) {
      const std::string rp = p + at_index(".replicas", ri);
      const auto& stages = g.replicas[ri].stages;
      if (static_cast<int>(stages.size()) != g.pp)
        throw InputError(rp + ".stages: expected pp (" + std::to_string(g.pp) + ") stages, got " +
                         std::to_string(stages.size()));
      int next = 0;
      for (std::size_t si = 0; si < stages.size(); ++si) {
        const std::string sp = rp + at_index(".stages", si);
        const Stage& s = stages[si];
        if (s.first_layer != next)
          throw InputError(sp + ".layers: must start at layer " + std::to_string(next) + " (stages are contiguous), got " +
                           std::to_string(s.first_layer));
        if (s.n_layers <= 0) throw InputError(sp + ".layers: must hold at least one layer");
        next = s.first_layer + s.n_layers;
        if (static_cast<int>(s.devices.size()) != g.tp)
          throw InputError(sp + ".devices: expected tp (" + std::to_string(g.tp) + ") devices, got " +
                           std::to_string(s.devices.size()));
        for (std::size_t di = 0; di < s.devices.size(); ++di)
          if (!used.insert(s.devices[di]).second)
            throw InputError(sp + at_index(".devices", di) + ": device \"" + s.devices[di] +
                             "\" already serves another rank of this gear");
      }
      if (next != m.n_layers)
        throw InputError(rp + ".stages: layers end at " + std::to_string(next) + ", the model has " +
                         std::to_string(m.n_layers));
    }
  }
}

void validate_against(const GearTable& t, const Topology& topo) {
  for (std::size_t gi = 0; gi < t.gears.size(); ++gi) {
    const Gear& g = t.gears[gi];
    for (std::size_t ri = 0; ri < g.replicas.size(); ++ri) {
      for (std::size_t si = 0; si < g.replicas[ri].stages.size(); ++si) {
        const Stage& s = g.replicas[ri].stages[si];
        const std::string sp = at_index("gears", gi) + at_index(".replicas", ri) + at_index(".stages", si) + ".devices";
        int island = -2;
        for (std::size_t di = 0; di < s.devices.size(); ++di) {
          if (!topo.find_device(s.devices[di]))
            throw InputError(sp + at_index("", di) + ": unknown device \"" + s.devices[di] + "\" in topology \"" +
                             topo.name + "\"");
          int is = topo.island_of(s.devices[di]);
          if (island == -2) island = is;
          if (s.devices.size() > 1 && (is != island || is < 0))
            throw InputError(sp + ": the tensor-parallel group must stay inside one island, \"" + s.devices[di] +
                             "\" is " + (is < 0 ? std::string("in no island") : "in island \"" + topo.islands[static_cast<std::size_t>(is)].id + "\""));
        }
      }
    }
  }
}

}  // namespace ftp::doc
