// SPDX-License-Identifier: Apache-2.0
#include "plan/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "core/error.hpp"
#include "plan/device_memory.hpp"

namespace ftp::plan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

std::string layout(int tp, int pp, int dp) {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
}

bool tp_valid(const ModelShape& m, int tp) {
  if (m.n_heads % tp != 0) return false;
  return tp <= m.n_kv_heads ? m.n_kv_heads % tp == 0 : tp % m.n_kv_heads == 0;
}

/// Time one layer of the group takes for the reference request: the group's speed rank.
double layer_time(const ModelShape& m, const GroupPerf& g, const Workload& w) {
  StageSpan one{1, false, false};
  return prefill_time_s(m, one, g, w.prompt_tokens) +
         w.output_tokens * decode_time_s(m, one, g, 1, w.prompt_tokens + w.output_tokens / 2.0);
}

struct Evaluated {
  Candidate c;
  std::vector<std::vector<StageSpan>> spans;  // per replica, per stage
};

/// What plan() looks up again and again on a large topology, kept once: each
/// device's island, the links between stages, and the layer splits that fit
/// (they depend only on the stages' speed and memory, so the DP replicas of
/// one device type share them).
class Memo {
 public:
  explicit Memo(const doc::Topology& topo) : topo_(topo) {
    for (std::size_t i = 0; i < topo.islands.size(); ++i)
      for (const auto& d : topo.islands[i].devices) island_.emplace(d, static_cast<int>(i));
  }
  int island_of(const std::string& device) const {
    auto it = island_.find(device);
    return it == island_.end() ? -1 : it->second;
  }
  const std::optional<doc::Link>& link(const std::string& a, const std::string& b) {
    auto key = std::make_pair(a, b);
    auto it = links_.find(key);
    if (it == links_.end()) it = links_.emplace(key, topo_.link_between(a, b)).first;
    return it->second;
  }
  LayerSplit split(const ModelShape& m, const std::vector<StageGroup>& stages, const Workload& w, int conc, int context) {
    std::vector<double> key{double(conc), double(context)};
    for (const auto& g : stages)
      key.insert(key.end(), {double(g.perf.tp), g.perf.tflop_s, g.perf.gb_s, g.perf.busbw_gb_s,
                             g.perf.allreduce_latency_us, double(g.perf.memory_bytes)});
    if (auto it = splits_.find(key); it != splits_.end()) return it->second;
    LayerSplit s = split_layers(m, stages, w, conc, context);
    if (s.fits) splits_.emplace(std::move(key), s);  // a split short of memory names its device: not shared
    return s;
  }

 private:
  const doc::Topology& topo_;
  std::unordered_map<std::string, int> island_;
  std::map<std::pair<std::string, std::string>, std::optional<doc::Link>> links_;
  std::map<std::vector<double>, LayerSplit> splits_;
};

}  // namespace

GroupPerf group_perf(const doc::Topology& topo, const std::vector<std::string>& devices) {
  GroupPerf g;
  g.tp = static_cast<int>(devices.size());
  bool first = true;
  for (const auto& id : devices) {
    const doc::Device* d = topo.find_device(id);
    if (!d) throw InputError("unknown device \"" + id + "\"");
    g.tflop_s = first ? d->gemm_tflop_s : std::min(g.tflop_s, d->gemm_tflop_s);
    g.gb_s = first ? d->memory_bandwidth_gb_s : std::min(g.gb_s, d->memory_bandwidth_gb_s);
    g.memory_bytes = first ? d->memory_bytes : std::min(g.memory_bytes, d->memory_bytes);
    const bool gpu = d->type == "gpu" || d->type == "mig";
    g.gpu = first ? gpu : g.gpu && gpu;
    first = false;
  }
  if (g.tp <= 1) return g;
  double bw = kInf, lat = 0;
  for (std::size_t a = 0; a < devices.size(); ++a)
    for (std::size_t b = a + 1; b < devices.size(); ++b)
      if (auto l = topo.link_between(devices[a], devices[b])) {
        bw = std::min(bw, l->bandwidth_gb_s);
        lat = std::max(lat, l->latency_us);
      } else if (g.unlinked.empty()) {
        g.unlinked = devices[a] + " and " + devices[b];
      }
  g.busbw_gb_s = std::isfinite(bw) ? bw : 0;
  g.allreduce_latency_us = 2.0 * (g.tp - 1) * lat;
  int is = topo.island_of(devices[0]);
  if (is >= 0) {
    const auto& island = topo.islands[static_cast<std::size_t>(is)];
    // The whole island: its all-reduce, measured by ftp-probe or estimated from the spec, says it best.
    if (island.devices.size() == devices.size() && island.allreduce && island.allreduce->busbw_gb_s > 0) {
      g.unlinked.clear();  // the island's own all-reduce figure covers the group
      g.busbw_gb_s = island.allreduce->busbw_gb_s;
      if (island.allreduce->latency_us > 0) g.allreduce_latency_us = island.allreduce->latency_us;
    }
  }
  return g;
}

LayerSplit split_layers(const ModelShape& m, const std::vector<StageGroup>& stages, const Workload& w, int concurrency,
                        int context) {
  const int pp = static_cast<int>(stages.size());
  const int n = m.n_layers;
  LayerSplit out;
  if (pp == 0 || pp > n) return out;
  // cost[s][L]: time of stage s holding L layers; short_[s][L]: bytes it is short (<= 0 fits).
  std::vector<std::vector<double>> cost(static_cast<std::size_t>(pp), std::vector<double>(static_cast<std::size_t>(n + 1)));
  auto short_ = cost;
  const double context_mid = w.prompt_tokens + w.output_tokens / 2.0;
  for (int s = 0; s < pp; ++s) {
    const auto& g = stages[static_cast<std::size_t>(s)].perf;
    for (int l = 1; l <= n; ++l) {
      StageSpan span{l, s == 0, s == pp - 1};
      cost[s][l] = prefill_time_s(m, span, g, w.prompt_tokens) +
                   w.output_tokens * decode_time_s(m, span, g, concurrency, context_mid);
      short_[s][l] = stage_memory(m, span, g, w, concurrency, context).need - double(g.memory_bytes);
    }
  }
  // best[s][l]: the smallest bottleneck for stages 0..s holding layers [0, l).
  auto solve = [&](bool by_memory, std::vector<int>& layers) {
    std::vector<std::vector<double>> best(static_cast<std::size_t>(pp), std::vector<double>(static_cast<std::size_t>(n + 1), kInf));
    std::vector<std::vector<int>> from(static_cast<std::size_t>(pp), std::vector<int>(static_cast<std::size_t>(n + 1), -1));
    auto value = [&](int s, int l) {
      if (by_memory) return short_[s][l];
      return short_[s][l] <= 0 ? cost[s][l] : kInf;
    };
    for (int l = 1; l <= n - (pp - 1); ++l) best[0][l] = value(0, l);
    for (int s = 1; s < pp; ++s)
      for (int l = s + 1; l <= n - (pp - 1 - s); ++l)
        for (int k = s; k < l; ++k) {
          double v = std::max(best[s - 1][k], value(s, l - k));
          if (v < best[s][l]) best[s][l] = v, from[s][l] = k;
        }
    if (!std::isfinite(best[pp - 1][n])) return false;
    layers.assign(static_cast<std::size_t>(pp), 0);
    int l = n;
    for (int s = pp - 1; s > 0; --s) {
      int k = from[s][l];
      layers[static_cast<std::size_t>(s)] = l - k;
      l = k;
    }
    layers[0] = l;
    return true;
  };
  if (solve(false, out.layers)) {
    out.fits = true;
    return out;
  }
  solve(true, out.layers);
  double worst = -kInf;
  for (int s = 0; s < pp; ++s) {
    const auto& st = stages[static_cast<std::size_t>(s)];
    double sh = short_[s][out.layers[static_cast<std::size_t>(s)]];
    if (sh > worst) {
      worst = sh;
      // The ranks of a group share one device type and memory size: the first stands for all.
      out.device = st.devices.front();
      out.have_bytes = double(st.perf.memory_bytes);
      out.need_bytes = sh + double(st.perf.memory_bytes);
    }
  }
  return out;
}

namespace {

/// Tensor-parallel groups of `tp` devices: inside one island, of one device
/// type, name and memory size, in island order, fastest first.
std::vector<StageGroup> make_groups(const doc::Topology& topo, const ModelShape& m, const Workload& w, int tp) {
  std::vector<StageGroup> groups;
  for (const auto& island : topo.islands) {
    std::map<std::tuple<std::string, std::string, std::uint64_t>, std::vector<std::string>> buckets;
    std::vector<std::tuple<std::string, std::string, std::uint64_t>> order;
    for (const auto& id : island.devices) {
      const doc::Device* d = topo.find_device(id);
      if (!d || d->gemm_tflop_s <= 0 || d->memory_bandwidth_gb_s <= 0 || d->memory_bytes == 0) continue;
      auto key = std::make_tuple(d->type, d->name, d->memory_bytes);
      if (!buckets.count(key)) order.push_back(key);
      buckets[key].push_back(id);
    }
    for (const auto& key : order) {
      const auto& ids = buckets[key];
      for (std::size_t i = 0; i + static_cast<std::size_t>(tp) <= ids.size(); i += static_cast<std::size_t>(tp)) {
        StageGroup g;
        g.devices.assign(ids.begin() + static_cast<long>(i), ids.begin() + static_cast<long>(i) + tp);
        g.perf = group_perf(topo, g.devices);
        groups.push_back(std::move(g));
      }
    }
  }
  std::stable_sort(groups.begin(), groups.end(), [&](const StageGroup& a, const StageGroup& b) {
    return layer_time(m, a.perf, w) < layer_time(m, b.perf, w);
  });
  return groups;
}

Evaluated evaluate(Memo& memo, const ModelShape& m, const Workload& w, int context, int tp, int pp,
                   const std::vector<std::vector<StageGroup>>& replicas) {
  Evaluated ev;
  Candidate& c = ev.c;
  const int dp = static_cast<int>(replicas.size());
  c.gear.tp = tp;
  c.gear.pp = pp;
  c.gear.dp = dp;
  c.gear.micro_batches = 1;
  for (const auto& rep : replicas)
    for (const auto& g : rep)
      if (!g.perf.unlinked.empty()) {
        c.reason = "no link between " + g.perf.unlinked + " inside a tensor-parallel group (its all-reduces need one)";
        return ev;
      }
  c.gear.max_batched_tokens = w.max_batched_tokens;
  c.gear.kv_cache_cap = kKvCacheCap;
  c.n_devices = tp * pp * dp;
  for (const auto& r : replicas) {
    doc::Replica rep;
    for (const auto& g : r) rep.stages.push_back(doc::Stage{0, 0, g.devices});
    c.gear.replicas.push_back(std::move(rep));
  }
  const int conc = static_cast<int>((static_cast<std::int64_t>(w.concurrency) + dp - 1) / dp);  // no overflow at INT_MAX
  double rps = 0, tokens_s = 0, prefill_s = 0, decode_s = 0;
  double kv_min = kInf;
  int micro = 1;
  for (std::size_t ri = 0; ri < replicas.size(); ++ri) {
    const auto& groups = replicas[ri];
    LayerSplit split = memo.split(m, groups, w, conc, context);
    if (!split.fits) {
      c.short_device = split.device;
      c.need_bytes = split.need_bytes;
      c.have_bytes = split.have_bytes;
      c.short_bytes = split.need_bytes - split.have_bytes;
      c.reason = "memory: " + split.device + " needs " + gb(split.need_bytes) + " (weights, activations and KV for " +
                 std::to_string(conc) + " requests x " + std::to_string(context) + " tokens at a KV cap of 0.7), has " +
                 gb(split.have_bytes) + ", " + gb(c.short_bytes) + " short";
      return ev;
    }
    std::vector<ReplicaStage> stages;
    std::vector<StageSpan> spans;
    double kv = kInf;
    int first = 0;
    for (std::size_t s = 0; s < groups.size(); ++s) {
      const int nl = split.layers[s];
      StageSpan span{nl, s == 0, s + 1 == groups.size()};
      ReplicaStage st{span, groups[s].perf, 0, 0};
      if (s + 1 < groups.size()) {
        const auto& a = groups[s].devices.front();
        const auto& b = groups[s + 1].devices.front();
        const auto& link = memo.link(a, b);
        if (!link) {
          c.reason = "no link between " + a + " and " + b + " for the pipeline send";
          return ev;
        }
        st.send_gb_s = link->bandwidth_gb_s;
        st.send_latency_us = link->latency_us;
      }
      StageMemory mem = stage_memory(m, span, groups[s].perf, w, conc, context);
      kv = std::min(kv, mem.kv_tokens);
      c.gear.replicas[ri].stages[s].first_layer = first;
      c.gear.replicas[ri].stages[s].n_layers = nl;
      first += nl;
      stages.push_back(st);
      spans.push_back(span);
    }
    ReplicaEstimate e = estimate_replica(m, stages, w, kv);
    rps += e.rps;
    tokens_s += e.tokens_s;
    prefill_s += e.prefill_tokens_s;
    decode_s += e.decode_tokens_s;
    kv_min = std::min(kv_min, kv);
    micro = std::max(micro, e.micro_batches);
    ev.spans.push_back(std::move(spans));
  }
  c.feasible = true;
  c.kv_tokens_per_replica = kv_min;
  c.gear.micro_batches = micro;
  doc::Capacity cap;
  cap.max_rps = rps;
  cap.safe_rps = kSafeFraction * rps;
  cap.max_tokens_s = tokens_s;
  cap.safe_tokens_s = kSafeFraction * tokens_s;
  cap.prefill_tokens_s = prefill_s;
  cap.decode_tokens_s = decode_s;
  cap.source = "estimate";
  c.gear.estimated = cap;
  return ev;
}

/// Capacities within this fraction of each other count as equal when the
/// table picks performance and standard: the fewer devices win.
constexpr double kNearCapacity = 0.1;

double capacity_of(const Evaluated& e) { return e.c.gear.estimated ? e.c.gear.estimated->max_rps : 0; }

/// Resident unless a device of `g` could not hold g's weight shards with
/// those of the gears resident already (`resident`: the largest gear and
/// those kept before g; their union on that device, ranks as the table
/// places them: device_memory) next to the KV and activations.
std::string weight_mode(const ModelShape& m, const doc::Topology& topo, const Workload& w, const doc::Gear& g,
                        const doc::GearTable& resident) {
  doc::GearTable with = resident;
  with.gears.push_back(g);
  for (auto& x : with.gears) x.weight_mode = "resident";
  const std::vector<std::string> mine = g.devices();
  for (const DeviceMemory& d : device_memory(m, with, topo, w))
    if (!d.fits() && std::find(mine.begin(), mine.end(), d.device) != mine.end()) return "release";
  return "resident";
}

/// The table of the chosen gears (name, candidate); "memory-guard" is the
/// guard's role, every other gear is normal. Ranks placed so that shards
/// nest (nest_ranks); weight modes against the gear with the most devices
/// and the gears kept resident before (weight_mode).
void fill_table(doc::GearTable& t, const doc::Topology& topo, const ModelShape& m, const Workload& w,
                const std::vector<std::pair<std::string, const Evaluated*>>& gears) {
  std::size_t largest = 0;  // the last normal gear, unless an earlier one has more devices
  for (std::size_t i = 0; i < gears.size(); ++i)
    if (gears[i].first != "memory-guard") largest = i;
  for (std::size_t i = 0; i < gears.size(); ++i)
    if (gears[i].first != "memory-guard" && gears[i].second->c.n_devices > gears[largest].second->c.n_devices)
      largest = i;
  t.model = m.to_doc();
  t.topology = topo.name;
  for (const auto& [name, e] : gears) {
    doc::Gear g = e->c.gear;
    g.name = name;
    g.role = name == "memory-guard" ? "memory-guard" : "normal";
    t.gears.push_back(std::move(g));
  }
  nest_ranks(t);
  // Every resident gear's shards stay on their devices together, so each
  // gear is checked against all those kept resident before it, not against
  // the largest alone (three gears can overflow a device that any two fit).
  doc::GearTable resident;
  t.gears[largest].weight_mode = "resident";
  resident.gears = {t.gears[largest]};
  for (std::size_t i = 0; i < t.gears.size(); ++i) {
    if (i == largest) continue;
    t.gears[i].weight_mode = weight_mode(m, topo, w, t.gears[i], resident);
    if (t.gears[i].weight_mode == "resident") resident.gears.push_back(t.gears[i]);
  }
  doc::validate(t);
  doc::validate_against(t, topo);
}

Plan with_layouts(Plan out, const std::vector<Evaluated>& feasible, const doc::Topology& topo, const ModelShape& m,
                  const Workload& w,
                  const std::vector<LayoutRequest>& layouts, int max_pp) {
  std::vector<std::pair<std::string, const Evaluated*>> gears;
  std::set<std::string> names;
  for (const auto& l : layouts)
    if (!names.insert(l.name).second) throw InputError("--layout " + l.name + ": the name is given twice");
  for (const auto& l : layouts) {
    if (l.pp > max_pp)
      throw InputError("--layout " + l.name + ": pp=" + std::to_string(l.pp) + " is over --max-pp " +
                       std::to_string(max_pp));
    auto same = [&](const Candidate& c) { return c.gear.tp == l.tp && c.gear.pp == l.pp && c.gear.dp == l.dp; };
    auto it = std::find_if(feasible.begin(), feasible.end(), [&](const Evaluated& e) { return same(e.c); });
    if (it != feasible.end()) {
      gears.emplace_back(l.name, &*it);
      continue;
    }
    auto c = std::find_if(out.candidates.begin(), out.candidates.end(), same);
    throw Error("--layout " + l.name + ": " + layout(l.tp, l.pp, l.dp) + " does not fit " +
                (topo.name.empty() ? std::string("the topology") : topo.name) + ": " +
                (c != out.candidates.end() ? c->reason
                                           : "no such layout (tp must divide the heads and fit in an island, "
                                             "tp x pp x dp devices)"));
  }
  fill_table(out.table, topo, m, w, gears);
  return out;
}

}  // namespace

LayoutRequest parse_layout(const std::string& spec) {
  LayoutRequest r;
  const auto colon = spec.find(':');
  auto bad = [&](const std::string& why) {
    return InputError("--layout: " + why + " in \"" + spec + "\" (expected NAME:tp=T[,pp=P][,dp=D])");
  };
  if (colon == std::string::npos || colon == 0) throw bad("no name");
  r.name = spec.substr(0, colon);
  if (r.name == "memory-guard") throw bad("\"memory-guard\" is the guard's role, not a layout name");
  std::string rest = spec.substr(colon + 1);
  bool has_tp = false;
  std::set<std::string> keys;
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    std::size_t comma = rest.find(',', pos);
    std::string kv = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw bad("\"" + kv + "\" is not KEY=N");
    const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    int n = 0;
    try {
      std::size_t used = 0;
      n = std::stoi(val, &used);
      if (used != val.size()) throw std::invalid_argument(val);
    } catch (const std::exception&) {
      throw bad(key + ": \"" + val + "\" is not a number");
    }
    if (n < 1) throw bad(key + ": must be >= 1, got " + val);
    if (!keys.insert(key).second) throw bad(key + " given twice");
    if (key == "tp") r.tp = n, has_tp = true;
    else if (key == "pp") r.pp = n;
    else if (key == "dp") r.dp = n;
    else throw bad("unknown key \"" + key + "\"");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (!has_tp) throw bad("tp missing");
  return r;
}

Plan plan(const doc::Topology& topo, const ModelShape& m, const PlanOptions& opts) {
  const Workload w = resolve(opts.workload, m);
  const int context = w.context;
  Plan out;
  std::vector<Evaluated> feasible;
  std::set<std::string> seen;
  Memo memo(topo);
  int max_island = 0;
  for (const auto& is : topo.islands) max_island = std::max(max_island, static_cast<int>(is.devices.size()));
  for (int tp = 1; tp <= max_island; ++tp) {
    if (!tp_valid(m, tp)) continue;
    std::vector<StageGroup> by_speed = make_groups(topo, m, w, tp);
    const int n_groups = static_cast<int>(by_speed.size());
    std::vector<StageGroup> by_memory = by_speed;
    std::stable_sort(by_memory.begin(), by_memory.end(),
                     [](const StageGroup& a, const StageGroup& b) { return a.perf.memory_bytes > b.perf.memory_bytes; });
    std::map<std::string, int> rank;  // speed rank of each group, by its first device
    for (int i = 0; i < n_groups; ++i) rank[by_speed[static_cast<std::size_t>(i)].devices.front()] = i;
    for (int pp = 1; pp <= std::min({n_groups, m.n_layers, opts.max_pp}); ++pp) {
      for (int dp = 1; dp * pp <= n_groups; ++dp) {
        for (const auto* pool : {&by_speed, &by_memory}) {
          std::vector<StageGroup> sel(pool->begin(), pool->begin() + dp * pp);
          // Stages of one replica next to each other: by island, then fastest first.
          std::stable_sort(sel.begin(), sel.end(), [&](const StageGroup& a, const StageGroup& b) {
            int ia = memo.island_of(a.devices.front()), ib = memo.island_of(b.devices.front());
            if (ia != ib) return ia < ib;
            return rank[a.devices.front()] < rank[b.devices.front()];
          });
          std::vector<std::vector<StageGroup>> replicas(static_cast<std::size_t>(dp));
          std::string key = layout(tp, pp, dp);
          for (int i = 0; i < dp * pp; ++i) {
            replicas[static_cast<std::size_t>(i / pp)].push_back(sel[static_cast<std::size_t>(i)]);
            for (const auto& d : sel[static_cast<std::size_t>(i)].devices) key += " " + d;
          }
          if (!seen.insert(key).second) continue;
          Evaluated ev = evaluate(memo, m, w, context, tp, pp, replicas);
          out.candidates.push_back(ev.c);
          if (opts.on_candidate) opts.on_candidate(ev.c);
          if (ev.c.feasible) feasible.push_back(std::move(ev));
        }
      }
    }
  }

  if (feasible.empty()) {
    double devices_bytes = 0;
    for (const auto& d : topo.devices) devices_bytes += double(d.memory_bytes);
    const Candidate* closest = nullptr;
    for (const auto& c : out.candidates)
      if (!c.short_device.empty() && (!closest || c.short_bytes < closest->short_bytes)) closest = &c;
    const double kv = double(w.concurrency) * context * m.n_layers * m.kv_bytes_per_token_layer();
    std::string msg = "no gear fits: " + m.name + " needs " + gb(m.weight_bytes()) + " of weights and " + gb(kv) +
                      " of KV cache (" + std::to_string(w.concurrency) + " requests x " + std::to_string(context) +
                      " tokens); the " + std::to_string(topo.devices.size()) + " devices of " +
                      (topo.name.empty() ? std::string("the topology") : topo.name) + " hold " + gb(devices_bytes);
    if (closest)
      msg += "; the closest gear (" + layout(closest->gear.tp, closest->gear.pp, closest->gear.dp) + ") is " +
             gb(closest->short_bytes) + " short on device " + closest->short_device + " (needs " +
             gb(closest->need_bytes) + ", has " + gb(closest->have_bytes) + ")";
    else if (!out.candidates.empty())
      msg += "; " + out.candidates.front().reason;
    throw Error(msg);
  }

  if (!opts.layouts.empty()) return with_layouts(std::move(out), feasible, topo, m, w, opts.layouts, opts.max_pp);

  // economy: fewest devices, then highest capacity. performance: the fewest
  // devices among the layouts within kNearCapacity of the highest capacity,
  // then the highest capacity; standard likewise among those within
  // kNearCapacity of the geometric mean of the two, then the nearest to it.
  // A few percent of estimated capacity is inside the cost model's error and
  // not worth whole devices: a 7 B model on a fragmented cluster would
  // otherwise take ten GPUs for 8 % over five, and a six-stage pipeline over
  // slow cards for 8 % over two A800s at TP 2.
  auto better_cap = [](const Evaluated& a, const Evaluated& b) {
    if (capacity_of(a) != capacity_of(b)) return capacity_of(a) > capacity_of(b);
    return a.c.n_devices < b.c.n_devices;
  };
  const Evaluated* econ = &feasible.front();
  const Evaluated* top = &feasible.front();
  for (const auto& e : feasible) {
    if (e.c.n_devices < econ->c.n_devices || (e.c.n_devices == econ->c.n_devices && better_cap(e, *econ))) econ = &e;
    if (better_cap(e, *top)) top = &e;
  }
  const Evaluated* perf = top;
  for (const auto& e : feasible)
    if (capacity_of(e) >= (1 - kNearCapacity) * capacity_of(*top) &&
        (e.c.n_devices < perf->c.n_devices || (e.c.n_devices == perf->c.n_devices && better_cap(e, *perf))))
      perf = &e;
  const Evaluated* standard = nullptr;
  if (capacity_of(*perf) > capacity_of(*econ)) {
    const double target = std::sqrt(capacity_of(*econ) * capacity_of(*perf));
    auto nearer = [&](const Evaluated& a, const Evaluated& b) {
      const double da = std::fabs(std::log(capacity_of(a) / target)), db = std::fabs(std::log(capacity_of(b) / target));
      if (da != db) return da < db;
      return a.c.n_devices < b.c.n_devices;
    };
    auto near = [&](const Evaluated& e) { return std::fabs(std::log(capacity_of(e) / target)) <= std::log1p(kNearCapacity); };
    for (const auto& e : feasible) {
      const double cap = capacity_of(e);
      if (cap <= capacity_of(*econ) || cap >= capacity_of(*perf)) continue;
      if (e.c.n_devices < econ->c.n_devices || e.c.n_devices > perf->c.n_devices) continue;
      if (!standard) {
        standard = &e;
        continue;
      }
      const bool en = near(e), sn = near(*standard);
      if (en && sn ? (e.c.n_devices < standard->c.n_devices ||
                      (e.c.n_devices == standard->c.n_devices && nearer(e, *standard)))
                   : (en != sn ? en : nearer(e, *standard)))
        standard = &e;
    }
  } else {
    perf = econ;
  }
  std::vector<std::pair<std::string, const Evaluated*>> normal;
  if (perf == econ) {
    normal.emplace_back("standard", econ);
  } else {
    normal.emplace_back("economy", econ);
    if (standard) normal.emplace_back("standard", standard);
    normal.emplace_back("performance", perf);
  }
  // memory-guard: the most KV tokens per replica, then fewest devices, then capacity.
  const Evaluated* guard = &feasible.front();
  for (const auto& e : feasible) {
    const double a = e.c.kv_tokens_per_replica, b = guard->c.kv_tokens_per_replica;
    if (a > b || (a == b && (e.c.n_devices < guard->c.n_devices ||
                             (e.c.n_devices == guard->c.n_devices && capacity_of(e) > capacity_of(*guard)))))
      guard = &e;
  }
  bool guard_is_new = true;
  for (const auto& [name, e] : normal)
    if (e == guard) guard_is_new = false;
  // --max-gears drops the memory guard first, then standard, then economy.
  const int max_gears = std::max(1, opts.max_gears);
  if (guard_is_new && static_cast<int>(normal.size()) + 1 > max_gears) guard_is_new = false;
  while (static_cast<int>(normal.size()) > max_gears) {
    auto it = std::find_if(normal.begin(), normal.end(), [](const auto& p) { return p.first == "standard"; });
    if (it == normal.end() || normal.size() == 1) it = normal.begin();
    normal.erase(it);
  }
  if (normal.size() == 1) normal.front().first = "standard";

  if (guard_is_new) normal.emplace_back("memory-guard", guard);
  fill_table(out.table, topo, m, w, normal);
  return out;
}

json::Json to_json(const Candidate& c) {
  json::Json devices = json::Json::array();
  for (const auto& d : c.gear.devices()) devices.push_back(d);
  json::Json o{{"tp", c.gear.tp}, {"pp", c.gear.pp}, {"dp", c.gear.dp}, {"devices", devices}, {"feasible", c.feasible}};
  if (c.feasible) {
    json::Json layers = json::Json::array();
    for (const auto& s : c.gear.replicas.front().stages) layers.push_back(s.n_layers);
    o["layers"] = layers;
    o["max_rps"] = c.gear.estimated ? c.gear.estimated->max_rps : 0.0;
    o["kv_tokens_per_replica"] = std::floor(c.kv_tokens_per_replica);
  } else {
    o["reason"] = c.reason;
    if (!c.short_device.empty()) {
      o["device"] = c.short_device;
      o["short_bytes"] = c.short_bytes;
    }
  }
  return o;
}

std::string summary_table(const doc::GearTable& t) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-13s %3s %3s %3s %7s %-9s %10s %10s %12s\n", "gear", "tp", "pp", "dp", "devices",
                "weights", "max rps", "safe rps", "max tok/s");
  out += line;
  for (const auto& g : t.gears) {
    const double mx = g.estimated ? g.estimated->max_rps : 0, sf = g.estimated ? g.estimated->safe_rps : 0;
    const double tk = g.estimated ? g.estimated->max_tokens_s : 0;
    std::snprintf(line, sizeof line, "%-13s %3d %3d %3d %7zu %-9s %10.2f %10.2f %12.0f\n", g.name.c_str(), g.tp, g.pp,
                  g.dp, g.devices().size(), g.weight_mode.c_str(), mx, sf, tk);
    out += line;
  }
  return out;
}

}  // namespace ftp::plan
