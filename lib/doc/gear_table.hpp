// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "doc/topology.hpp"

namespace ftp::doc {

/// The shapes of a model that decide which gears are possible.
struct ModelShape {
  std::string name;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;          ///< < n_heads for grouped-query attention
  int hidden_size = 0;         ///< 0 when unknown
  std::uint64_t n_params = 0;  ///< 0 when unknown
};

/// ftp.capacity/v1: the throughput a gear sustains on today's cluster.
/// `safe` is 0.8 x `max` by default (ARCHITECTURE.md, capacity).
struct Capacity {
  std::string gear;             ///< gear name; empty when embedded in a gear
  double max_rps = 0;           ///< requests/s at the throughput knee
  double safe_rps = 0;          ///< requests/s the controller plans with; 0: not given (its safe_fraction of max)
  double max_tokens_s = 0;      ///< output tokens/s at max_rps
  double safe_tokens_s = 0;
  /// The work a gear does, apart from requests (0: not known): its peak
  /// prefill rate, prompt tokens/s when it only prefills, and its peak
  /// decode rate, tokens/s of a full decode batch. A mix of p prompt and
  /// o output tokens per request then takes p / prefill_tokens_s +
  /// o / decode_tokens_s of the gear per request (control::work_rps).
  double prefill_tokens_s = 0;
  double decode_tokens_s = 0;
  std::string source;           ///< "estimate" | "bench" | "live"
  std::int64_t t_ms = 0;        ///< clock time of the measurement, ms
  double window_s = 0;          ///< span of data it was computed from, s; 0 for an estimate
};

/// One pipeline stage of one replica: a contiguous layer range run by `tp`
/// devices (tensor-parallel ranks in order).
struct Stage {
  int first_layer = 0;
  int n_layers = 0;
  std::vector<std::string> devices;
};

/// One data-parallel replica of a gear: `pp` stages.
struct Replica {
  std::vector<Stage> stages;
};

/// One deployable parallel configuration.
struct Gear {
  std::string name;                   ///< "economy", "standard", "performance", "memory-guard"
  std::string role = "normal";        ///< "normal" | "memory-guard"
  int tp = 1, pp = 1, dp = 1;
  int micro_batches = 1;              ///< micro-batches in flight per pipeline
  int max_batched_tokens = 2048;      ///< scheduler token budget per step
  double kv_cache_cap = 0.7;          ///< fraction of free device memory the KV pool may take
  std::string weight_mode = "resident";  ///< "resident" | "release"
  std::vector<Replica> replicas;      ///< dp replicas, each with pp stages of tp devices
  std::optional<Capacity> estimated;  ///< from the cost model
  std::optional<Capacity> measured;   ///< from ftp-gear-bench or live data

  /// Every device of the gear, replica by replica, stage by stage.
  std::vector<std::string> devices() const;
};

/// ftp.gear-table/v1: the ordered gears for one model on one topology;
/// gears[0] is the smallest, the array order is the shift order.
struct GearTable {
  ModelShape model;
  std::string topology;               ///< name of the topology it was planned on
  std::vector<Gear> gears;

  const Gear* find(const std::string& name) const;
  /// Index of a gear by name, or -1.
  int index_of(const std::string& name) const;
};

json::Json to_json(const Capacity& c, bool with_kind = true);
Capacity capacity_from_json(const json::Json& j);
/// Parses an embedded or standalone capacity at `n` (kind optional when embedded).
Capacity capacity_from_node(const json::Node& n);

json::Json to_json(const GearTable& t);
/// Parses and validates a ftp.gear-table/v1 document; errors name the JSON
/// path: "gears[2].tp: must divide n_kv_heads (4), got 3".
GearTable gear_table_from_json(const json::Json& j);

/// The checks of gear_table_from_json on a table built in code.
void validate(const GearTable& t);

/// Checks a gear table against a topology: every device exists, no device
/// serves two ranks of one gear, and every tensor-parallel group stays inside
/// one island.
void validate_against(const GearTable& t, const Topology& topo);

}  // namespace ftp::doc
