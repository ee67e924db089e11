// SPDX-License-Identifier: Apache-2.0
#include "plan/device_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <utility>

namespace ftp::plan {

namespace {

/// Measure of a union of fractions [a/t, b/t) of [0, 1), exact in integers
/// over the least common multiple of the tp degrees.
double union_measure(std::vector<std::pair<int, int>> parts /* (rank, tp) */) {
  if (parts.empty()) return 0;
  long long l = 1;
  for (const auto& [r, t] : parts) l = std::lcm(l, static_cast<long long>(t));
  std::vector<std::pair<long long, long long>> iv;
  for (const auto& [r, t] : parts) iv.emplace_back(r * (l / t), (r + 1) * (l / t));
  std::sort(iv.begin(), iv.end());
  long long covered = 0, lo = iv.front().first, hi = iv.front().second;
  for (const auto& [a, b] : iv) {
    if (a > hi) {
      covered += hi - lo;
      lo = a;
    }
    hi = std::max(hi, b);
  }
  covered += hi - lo;
  return double(covered) / double(l);
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  return buf;
}

}  // namespace

double shard_union_bytes(const ModelShape& m, const std::vector<Shard>& shards) {
  std::map<int, std::vector<std::pair<int, int>>> layers;
  std::vector<std::pair<int, int>> embed, head;
  for (const Shard& s : shards) {
    for (int l = s.first_layer; l < s.first_layer + s.n_layers; ++l) layers[l].emplace_back(s.rank, s.tp);
    if (s.first) embed.emplace_back(s.rank, s.tp);
    if (s.last) head.emplace_back(s.rank, s.tp);
  }
  double params = 0;
  for (const auto& [l, parts] : layers) params += m.layer_params() * union_measure(parts);
  params += m.embedding_params() * union_measure(embed) + m.head_params() * union_measure(head);
  return params * m.bytes_per_param;
}

std::vector<DeviceMemory> device_memory(const ModelShape& m, const doc::GearTable& t, const doc::Topology& topo,
                                        const Workload& w, int requests, int context) {
  if (requests <= 0) requests = w.concurrency;
  if (context <= 0) context = w.context > 0 ? w.context : m.context_length;
  std::vector<std::string> order;
  struct Acc {
    std::vector<Shard> resident;
    std::vector<std::vector<Shard>> release;  // one list per release gear
    DeviceMemory d;
  };
  std::map<std::string, Acc> acc;
  for (const doc::Gear& g : t.gears) {
    const bool release = g.weight_mode == "release";
    std::map<std::string, std::vector<Shard>> of_gear;
    for (const doc::Replica& rep : g.replicas)
      for (std::size_t s = 0; s < rep.stages.size(); ++s) {
        const doc::Stage& st = rep.stages[s];
        const int tp = static_cast<int>(st.devices.size());
        const StageSpan span{st.n_layers, s == 0, s + 1 == rep.stages.size()};
        GroupPerf perf;
        perf.tp = tp;
        Workload gw = w;
        if (gw.max_batched_tokens <= 0) gw.max_batched_tokens = g.max_batched_tokens;
        const int per_replica = (requests + static_cast<int>(g.replicas.size()) - 1) / static_cast<int>(g.replicas.size());
        const StageMemory sm = stage_memory(m, span, perf, gw, per_replica, context);
        for (int r = 0; r < tp; ++r) {
          const std::string& dev = st.devices[static_cast<std::size_t>(r)];
          auto [it, fresh] = acc.try_emplace(dev);
          if (fresh) order.push_back(dev);
          Acc& a = it->second;
          const Shard sh{st.first_layer, st.n_layers, tp, r, span.first, span.last};
          (release ? of_gear[dev] : a.resident).push_back(sh);
          a.d.kv = std::max(a.d.kv, sm.kv_needed / g.kv_cache_cap);
          a.d.activations = std::max(a.d.activations, sm.activations);
        }
      }
    for (auto& [dev, shards] : of_gear) acc[dev].release.push_back(std::move(shards));
  }
  auto find = [&](const std::string& id) -> const doc::Device* {
    for (const auto& x : topo.devices)
      if (x.id == id) return &x;
    return nullptr;
  };
  auto is_gpu = [](const doc::Device* x) { return x && (x->type == "gpu" || x->type == "mig"); };
  // Virtual devices that are shares of one GPU (ranks on one GPU): that
  // GPU holds the union of their shards once, and the sum of the rest.
  std::vector<std::string> parents;
  std::map<std::string, std::vector<std::string>> children;
  for (const auto& dev : order)
    if (const doc::Device* td = find(dev); td && td->type == "virtual" && is_gpu(find(td->parent))) {
      if (children[td->parent].empty()) parents.push_back(td->parent);
      children[td->parent].push_back(dev);
    }
  std::vector<DeviceMemory> out;
  for (const auto& dev : order) {
    Acc& a = acc[dev];
    DeviceMemory d = a.d;
    d.device = dev;
    d.weights = shard_union_bytes(m, a.resident);
    // A release gear's shards alone: release mode drops the other gears'
    // weights from a device while it serves (the planner's reason for it).
    for (const auto& rel : a.release) d.weights = std::max(d.weights, shard_union_bytes(m, rel));
    const doc::Device* td = find(dev);
    d.memory_bytes = td ? td->memory_bytes : 0;
    out.push_back(std::move(d));
  }
  for (const auto& p : parents) {
    DeviceMemory d;
    d.device = p;
    d.memory_bytes = find(p)->memory_bytes;
    std::vector<Shard> all;
    for (const auto& c : children[p]) {
      const Acc& a = acc[c];
      all.insert(all.end(), a.resident.begin(), a.resident.end());
      for (const auto& rel : a.release) all.insert(all.end(), rel.begin(), rel.end());
      for (const auto& x : out)
        if (x.device == c) d.kv += x.kv, d.activations += x.activations;
    }
    d.weights = shard_union_bytes(m, all);
    out.push_back(std::move(d));
  }
  return out;
}

json::Json to_json(const DeviceMemory& d) {
  auto b = [](double x) { return static_cast<std::uint64_t>(x + 0.5); };
  return json::Json{{"device", d.device},
                    {"weights_bytes", b(d.weights)},
                    {"kv_bytes", b(d.kv)},
                    {"activations_bytes", b(d.activations)},
                    {"need_bytes", b(d.need())},
                    {"memory_bytes", d.memory_bytes},
                    {"fits", d.fits()}};
}

const DeviceMemory* first_short(const std::vector<DeviceMemory>& mem) {
  for (const auto& d : mem)
    if (!d.fits()) return &d;
  return nullptr;
}

std::string short_text(const DeviceMemory& d) {
  return "device " + d.device + " needs " + gb(d.need()) + " (weights " + gb(d.weights) + ", KV " + gb(d.kv) +
         ", activations " + gb(d.activations) + "), has " + gb(static_cast<double>(d.memory_bytes));
}

int nest_ranks(doc::GearTable& t) {
  // Gears from the smallest TP up (stable: the table's order among equals).
  std::vector<std::size_t> idx(t.gears.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return t.gears[a].tp < t.gears[b].tp; });
  // (first_layer, n_layers) -> device -> (rank, tp) of the last stage placed over those layers.
  std::map<std::pair<int, int>, std::map<std::string, std::pair<int, int>>> placed;
  int changed = 0;
  for (std::size_t gi : idx)
    for (doc::Replica& rep : t.gears[gi].replicas)
      for (doc::Stage& st : rep.stages) {
        const int tp = static_cast<int>(st.devices.size());
        auto& prev = placed[{st.first_layer, st.n_layers}];
        std::vector<std::string> slot(static_cast<std::size_t>(tp));
        std::vector<std::string> rest;
        for (const auto& dev : st.devices) {
          auto it = prev.find(dev);
          bool put = false;
          if (it != prev.end() && tp % it->second.second == 0) {
            const int per = tp / it->second.second;
            for (int r = it->second.first * per; r < (it->second.first + 1) * per && !put; ++r)
              if (slot[static_cast<std::size_t>(r)].empty()) slot[static_cast<std::size_t>(r)] = dev, put = true;
          }
          if (!put) rest.push_back(dev);
        }
        std::size_t k = 0;
        for (auto& s : slot)
          if (s.empty()) s = rest[k++];
        if (slot != st.devices) ++changed, st.devices = slot;
        for (int r = 0; r < tp; ++r) prev[st.devices[static_cast<std::size_t>(r)]] = {r, tp};
      }
  return changed;
}

}  // namespace ftp::plan
