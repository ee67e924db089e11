// SPDX-License-Identifier: Apache-2.0
#include "plan/device_memory.hpp"

#include "model/tp_split.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <utility>

namespace ftp::plan {

namespace {

constexpr double kNormBytes = 4;  ///< per element of a norm vector: the engine converts them to float32

/// Length of the union of half-open integer intervals [a, b) (sorts them).
long long union_length(std::vector<std::pair<long long, long long>>& iv) {
  if (iv.empty()) return 0;
  std::sort(iv.begin(), iv.end());
  long long covered = 0, lo = iv.front().first, hi = iv.front().second;
  for (const auto& [a, b] : iv) {
    if (a > hi) {
      covered += hi - lo;
      lo = a;
    }
    hi = std::max(hi, b);
  }
  return covered + (hi - lo);
}

/// Weights per block of the model's dtype (ggml's names, either case): a
/// column range of a row-parallel matrix is held in whole blocks.
long long dtype_block(const std::string& dtype) {
  std::string d;
  for (char c : dtype) d += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (d.size() > 2 && d.compare(d.size() - 2, 2, "_k") == 0) return 256;
  if (d.rfind("q", 0) == 0) return 32;
  return 1;
}

/// [a, b) widened to whole blocks of `blk`.
std::pair<long long, long long> blocks(long long a, long long b, long long blk) {
  return {a / blk * blk, (b + blk - 1) / blk * blk};
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  return buf;
}

}  // namespace

double shard_union_bytes(const ModelShape& m, const std::vector<Shard>& shards) {
  // The engine's views (engine::WeightStore::layer) of each shard, as
  // integer ranges of each matrix: rows of the column-parallel ones (wq,
  // wk, wv, gate, up), whole blocks of columns of the row-parallel ones (wo,
  // down). The norms go with every rank of a layer; the embedding and the
  // head are vocabulary-parallel (model::row_split of the vocabulary): each
  // rank of a first stage holds its rows of the embedding, each rank of a
  // last stage its rows of the head and the final norm; a tied head shares
  // the embedding's rows.
  //
  // Every layer that the same shards cover holds the same bytes, so the
  // layers are cut into segments at the shards' first and end layers and
  // each segment's unions are computed once (the planner asks for every
  // stage of every candidate: one union per layer would allocate per layer).
  using Iv = std::vector<std::pair<long long, long long>>;
  const long long h = m.hidden_size, hd = m.head_dim, blk = dtype_block(m.dtype);
  std::vector<int> cuts;
  cuts.reserve(2 * shards.size());
  Iv embed_rows, head_rows;
  for (const Shard& s : shards) {
    if (s.n_layers <= 0) continue;
    cuts.push_back(s.first_layer);
    cuts.push_back(s.first_layer + s.n_layers);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<model::TpSplit> splits;
  splits.reserve(shards.size());
  for (const Shard& s : shards) {
    splits.push_back(model::tp_split(m.n_heads, m.n_kv_heads, m.intermediate_size, s.tp, s.rank));
    const model::RowSplit v = model::row_split(m.vocab_size, s.tp, s.rank);
    if (s.first) embed_rows.emplace_back(v.begin, v.end);
    if (s.last) head_rows.emplace_back(v.begin, v.end);
  }
  const bool head = !head_rows.empty();
  double params = 0, norms = 0;  // the norms: float32 vectors in the engine, whatever the file stores
  Iv q_rows, kv_rows, wo_cols, ff_rows, down_cols;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    const int lo = cuts[c], n = cuts[c + 1] - cuts[c];
    q_rows.clear(), kv_rows.clear(), wo_cols.clear(), ff_rows.clear(), down_cols.clear();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const Shard& s = shards[i];
      if (lo < s.first_layer || lo >= s.first_layer + s.n_layers) continue;
      const model::TpSplit& sp = splits[i];
      q_rows.emplace_back(sp.q_begin * hd, sp.q_end * hd);
      kv_rows.emplace_back(sp.kv_begin * hd, sp.kv_end * hd);
      wo_cols.push_back(blocks(sp.q_begin * hd, sp.q_end * hd, blk));
      ff_rows.emplace_back(sp.ff_begin, sp.ff_end);
      down_cols.push_back(blocks(sp.ff_begin, sp.ff_end, blk));
    }
    if (q_rows.empty()) continue;  // a gap between shards
    params += double(n) * double(h) *
              (union_length(q_rows) + 2.0 * union_length(kv_rows) + union_length(wo_cols) +
               2.0 * union_length(ff_rows) + union_length(down_cols));
    norms += double(n) * 2.0 * double(h);
  }
  // A tied head is the embedding: its rows held once where both are.
  if (m.tie_embeddings) {
    embed_rows.insert(embed_rows.end(), head_rows.begin(), head_rows.end());
    params += double(union_length(embed_rows)) * h;
  } else {
    params += double(union_length(embed_rows) + union_length(head_rows)) * h;
  }
  if (head) norms += double(h);
  return (params * m.bytes_per_param + norms * kNormBytes) * m.scale();
}

std::vector<DeviceMemory> device_memory(const ModelShape& m, const doc::GearTable& t, const doc::Topology& topo,
                                        const Workload& w, int requests, int context, const GpuOverheads& gpu) {
  if (requests <= 0) requests = w.concurrency;
  if (context <= 0) context = w.context > 0 ? w.context : m.context_length;
  auto find = [&](const std::string& id) -> const doc::Device* {
    for (const auto& x : topo.devices)
      if (x.id == id) return &x;
    return nullptr;
  };
  auto is_gpu = [](const doc::Device* x) { return x && (x->type == "gpu" || x->type == "mig"); };
  // The GPU a device is on: itself, a share's parent GPU, or "" (a CPU device).
  auto physical = [&](const std::string& id) -> std::string {
    const doc::Device* x = find(id);
    if (is_gpu(x)) return id;
    if (x && x->type == "virtual" && is_gpu(find(x->parent))) return x->parent;
    return "";
  };
  std::vector<std::string> order;
  struct Acc {
    std::vector<Shard> resident;
    std::vector<std::vector<Shard>> release;  // one list per release gear
    std::vector<double> gear_graphs;          // graph bytes of its ranks, per gear
    DeviceMemory d;
  };
  std::map<std::string, Acc> acc;
  std::map<std::string, std::set<std::vector<std::string>>> nccl_sets;  // GPU -> the multi-GPU sets it is in
  for (const doc::Gear& g : t.gears) {
    const bool release = g.weight_mode == "release";
    std::map<std::string, std::vector<Shard>> of_gear;
    std::map<std::string, double> graphs_of_gear;
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
        // The stage's GPUs: NCCL over distinct ones; ranks sharing one GPU
        // all-reduce outside graphs, so they capture none at tp > 1.
        std::vector<std::string> gpus;
        for (const auto& dev : st.devices) gpus.push_back(physical(dev));
        std::vector<std::string> set = gpus;
        std::sort(set.begin(), set.end());
        const bool on_gpus = std::find(set.begin(), set.end(), std::string()) == set.end();
        const bool distinct = std::adjacent_find(set.begin(), set.end()) == set.end();
        if (on_gpus && distinct && tp > 1)
          for (const auto& p : set) nccl_sets[p].insert(set);
        const double graph_bytes =
            on_gpus && (tp == 1 || distinct)
                ? double(gpu.graph_batches) * (double(st.n_layers) * gpu.graph_nodes_per_layer + gpu.graph_nodes_per_stage) *
                      gpu.graph_node_bytes
                : 0.0;
        for (int r = 0; r < tp; ++r) {
          const std::string& dev = st.devices[static_cast<std::size_t>(r)];
          auto [it, fresh] = acc.try_emplace(dev);
          if (fresh) order.push_back(dev);
          Acc& a = it->second;
          const Shard sh{st.first_layer, st.n_layers, tp, r, span.first, span.last};
          (release ? of_gear[dev] : a.resident).push_back(sh);
          graphs_of_gear[dev] += graph_bytes;
          a.d.kv = std::max(a.d.kv, sm.kv_needed / g.kv_cache_cap);
          // Each rank its own: rank 0 of a last stage holds the full logits rows.
          GroupPerf rp = perf;
          rp.gpu = on_gpus && distinct && tp > 1;  // NCCL stages what it receives
          a.d.activations = std::max(a.d.activations, rank_activations(m, span, rp, gw, r));
        }
      }
    for (auto& [dev, shards] : of_gear) acc[dev].release.push_back(std::move(shards));
    for (const auto& [dev, bytes] : graphs_of_gear) acc[dev].gear_graphs.push_back(bytes);
  }
  // The two gears with the most graphs: the old domains' and a shadow's.
  auto two_largest = [](std::vector<double> v) {
    std::sort(v.rbegin(), v.rend());
    return (v.size() > 0 ? v[0] : 0.0) + (v.size() > 1 ? v[1] : 0.0);
  };
  auto comm_bytes = [&](const std::string& gpu_id) {
    auto it = nccl_sets.find(gpu_id);
    if (it == nccl_sets.end() || it->second.empty()) return 0.0;
    // The root communicator and one split per set, each channels x NCCL_BUFFSIZE.
    return double(it->second.size() + 1) * gpu.nccl_channels * gpu.nccl_buffer_bytes;
  };
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
    d.graphs = two_largest(a.gear_graphs);
    if (is_gpu(find(dev))) d.comm_buffers = comm_bytes(dev);
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
        if (x.device == c) d.kv += x.kv, d.activations += x.activations, d.graphs += x.graphs;
    }
    d.weights = shard_union_bytes(m, all);
    d.comm_buffers = comm_bytes(p);
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
                    {"graphs_bytes", b(d.graphs)},
                    {"comm_buffers_bytes", b(d.comm_buffers)},
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
         ", activations " + gb(d.activations) + ", CUDA graphs " + gb(d.graphs) + ", NCCL buffers " + gb(d.comm_buffers) +
         "), has " + gb(static_cast<double>(d.memory_bytes));
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
