// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"

/// The bytes each device of a gear table holds (ARCHITECTURE.md, resident
/// layout): the one computation behind the planner's weight modes,
/// `ftp-plan --explain`'s per-device table and ftp-serve's start-up check.
namespace ftp::plan {

/// Which part of a tensor-parallel split one rank serves: the fraction
/// [rank/tp, (rank+1)/tp) of every split matrix of its layers.
struct Shard {
  int first_layer = 0, n_layers = 0;
  int tp = 1, rank = 0;
  bool first = false, last = false;  ///< holds the embedding, the head
};

/// Bytes of the union of `shards` (one device's, over every gear): what the
/// engine's ranks on that device read, counted as it views them
/// (model::tp_split): the rows of wq, wk, wv, gate and up and the columns
/// of wo and down (in whole blocks of a quantized dtype) that any of the
/// shards serves, each counted once; the layer's norms whole; the
/// embedding whole where a shard is of a first stage (every rank embeds
/// its rows); the head and the final norm whole where one is rank 0 of a
/// last stage (the rank that computes the logits); a tied head shares the
/// embedding's bytes. Nested shards (a TP-2t shard inside a TP-t shard)
/// add nothing. Matrices take bytes_per_param, the norms 4 bytes (float32
/// in the engine); both scale by ModelShape::scale().
double shard_union_bytes(const ModelShape& m, const std::vector<Shard>& shards);

/// One device's bytes for a gear table.
struct DeviceMemory {
  std::string device;
  double weights = 0;      ///< the union of its shards over the resident gears, or a release gear's own shards where larger
  double kv = 0;           ///< the largest of its gears' KV need: requests x context x layers x KV bytes per token, / kv_cache_cap
  double activations = 0;  ///< the largest of its ranks' activations over its gears (rank_activations: rank 0 of a last stage holds the full logits rows)
  /// GPUs only (GpuOverheads): the captured graphs of its ranks in the two
  /// gears with the most (a shift holds the old domains' and the shadow's);
  /// a rank captures graphs when its stage is TP 1 or on distinct GPUs
  /// (ranks sharing one GPU all-reduce outside graphs).
  double graphs = 0;
  /// GPUs only: NCCL buffers of the communicator pool on the device: the
  /// root communicator and one per distinct GPU set of the table's stages
  /// that spans several GPUs and includes it, channels x NCCL_BUFFSIZE each.
  double comm_buffers = 0;
  std::uint64_t memory_bytes = 0;  ///< what the topology says it has; 0: unknown
  double need() const noexcept { return weights + kv + activations + graphs + comm_buffers; }
  bool fits() const noexcept { return memory_bytes == 0 || need() <= static_cast<double>(memory_bytes); }
};

/// The bytes of every device the table uses, in the order devices first
/// appear, then one row for each GPU whose shares (topology devices of type
/// "virtual" whose parent is that GPU: ranks on one GPU) the table uses: the
/// union of all their shards, the sum of their other bytes. `requests` requests of `context` tokens (w.concurrency,
/// w.context when 0) per gear; activations from w.max_batched_tokens (the
/// gear's own when w's is 0).
std::vector<DeviceMemory> device_memory(const ModelShape& m, const doc::GearTable& t, const doc::Topology& topo,
                                        const Workload& w, int requests = 0, int context = 0,
                                        const GpuOverheads& gpu = GpuOverheads{});

/// {"device", "weights_bytes", "kv_bytes", "activations_bytes",
/// "graphs_bytes", "comm_buffers_bytes", "need_bytes", "memory_bytes", "fits"}:
/// one row of ftp-plan --explain's per-device table.
json::Json to_json(const DeviceMemory& d);

/// The first device of `mem` that does not fit, or null.
const DeviceMemory* first_short(const std::vector<DeviceMemory>& mem);

/// "device vd1 needs 2.100 GB (weights ..., KV ..., activations ...), has 2.000 GB".
std::string short_text(const DeviceMemory& d);

/// Reorders each gear's stage devices so that shards nest: going through
/// the gears from the smallest TP up, a device that serves rank r of the
/// same layers at TP t in an earlier gear gets a rank of [r x t'/t, (r+1)
/// x t'/t) at TP t' (t dividing t'), so its TP-t' shard lies inside its
/// TP-t shard; devices new to the layers fill the ranks left. Returns how
/// many stages it reordered.
int nest_ranks(doc::GearTable& t);

}  // namespace ftp::plan
