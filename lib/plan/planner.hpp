// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"

/// Gear enumeration: every feasible (tp, pp, dp) layout of a model on a
/// topology, its estimated capacity, and the chosen gear table (man ftp-plan(1)).
namespace ftp::plan {

struct Candidate;

/// A layout asked for by name (--layout NAME:tp=T[,pp=P][,dp=D]).
struct LayoutRequest {
  std::string name;
  int tp = 1, pp = 1, dp = 1;
};
/// Reads "NAME:tp=T[,pp=P][,dp=D]"; throws ftp::InputError ("--layout: ...").
LayoutRequest parse_layout(const std::string& spec);

struct PlanOptions {
  Workload workload;
  /// When not empty: the table holds exactly these layouts, as normal gears
  /// in this order (the first feasible candidate of each), instead of the
  /// chosen economy/standard/performance/memory-guard.
  std::vector<LayoutRequest> layouts;
  int max_gears = 4;  ///< gears in the table at most (normal gears and the memory guard)
  int max_pp = 8;     ///< pipeline stages per replica at most
  /// Called with each candidate as it is evaluated (for --explain), also when nothing fits.
  std::function<void(const Candidate&)> on_candidate;
};

/// One tensor-parallel group that can run a pipeline stage.
struct StageGroup {
  std::vector<std::string> devices;  ///< tp devices of one island, of one device type
  GroupPerf perf;
};

/// The speed, memory and all-reduce of a group of devices of one island: the
/// slowest rank's TFLOP/s and GB/s, the smallest rank's memory, the ring's
/// bus bandwidth from the slowest link between the group's devices (the
/// island's measured or estimated all-reduce when the group is the whole
/// island) and 2(n-1) x the slowest link's latency.
GroupPerf group_perf(const doc::Topology& topo, const std::vector<std::string>& devices);

/// A split of the layers over the stages of one replica.
struct LayerSplit {
  std::vector<int> layers;     ///< layers per stage, in stage order; sums to n_layers
  bool fits = false;           ///< every stage's ranks hold their weights, activations and KV
  std::string device;          ///< when not: the device furthest short
  double need_bytes = 0;       ///< what that device needs
  double have_bytes = 0;       ///< what it has
};

/// Splits the layers over `stages` (in pipeline order) so that the slowest
/// stage is as fast as possible, under the memory of each stage: an exact
/// search over contiguous splits (O(pp x n_layers^2)) minimising the largest
/// stage time of the reference request (prefill of prompt_tokens + output_tokens
/// decode steps at batch `concurrency`). Fast groups get more layers, slow ones
/// (MIG slices, older cards) fewer. When no split fits, the split that is
/// least short and the device furthest short.
LayerSplit split_layers(const ModelShape& m, const std::vector<StageGroup>& stages, const Workload& w, int concurrency,
                        int context);

/// One (tp, pp, dp) layout the planner considered.
struct Candidate {
  doc::Gear gear;             ///< name empty; replicas hold the devices and, when feasible, the layer split
  bool feasible = false;
  std::string reason;         ///< why not, when not
  std::string short_device;   ///< memory rejection: the device furthest short
  double short_bytes = 0;     ///< and by how much
  double need_bytes = 0, have_bytes = 0;
  int n_devices = 0;
  double kv_tokens_per_replica = 0;  ///< tokens the smallest replica's KV pool holds
};

struct Plan {
  doc::GearTable table;
  std::vector<Candidate> candidates;  ///< every layout considered, in enumeration order
};

/// Enumerates the layouts and chooses the gear table: economy (fewest devices
/// that fit), performance (the fewest devices within 10 % of the highest
/// estimated capacity), standard (capacity between; the fewest devices within
/// 10 % of their geometric mean, else the nearest to it), and memory-guard (most KV tokens
/// per replica), deduplicated; one normal gear alone is named "standard".
/// Throws ftp::Error (exit 1) naming the device and bytes short when nothing
/// fits, or when a requested layout does not (with the candidate's reason).
Plan plan(const doc::Topology& topo, const ModelShape& m, const PlanOptions& opts);

/// One line of --explain: a candidate as JSON.
json::Json to_json(const Candidate& c);

/// A human table of the gears (for stderr on a terminal).
std::string summary_table(const doc::GearTable& t);

}  // namespace ftp::plan
