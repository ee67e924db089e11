// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <vector>

#include "doc/gear_table.hpp"
#include "plan/model_shape.hpp"

/// What a shift costs in time, phase by phase (ARCHITECTURE.md, shift:
/// reserve -> warm -> ramp -> drain -> retire), as the engine replay of
/// `ftp-plan simulate` charges it. Seconds; 1 GB/s = 1e9 B/s.
namespace ftp::plan {

/// The constants of a shift. Those marked "ours" are not measured: they
/// are the defaults of this model and say so in ftp-plan(1).
struct ShiftCostConfig {
  /// Leasing the target's devices and its communicators from the pool
  /// (created ahead, ARCHITECTURE.md §2), s. Ours.
  double reserve_s = 0.5;
  /// Warm-up besides the one dummy request each new domain serves (the
  /// replay runs that request on the engine model): communicator hand-over,
  /// graph capture, allocator warm-up, s. Ours.
  double warm_s = 2.0;
  /// Host-to-device bandwidth a rank reloads its weights at in release
  /// weight mode (PCIe 4.0 x16 is about 25 GB/s), GB/s. Ours.
  double weight_load_gb_s = 25;
  /// The ramp's traffic shares on the new domains (ftp-serve --ramp).
  std::vector<double> ramp{0.1, 0.5, 1.0};
  /// The wait at each ramp step before its check (ftp-serve's step interval), s.
  double ramp_step_s = 1.0;
};

/// Checks a config: times and bandwidth non-negative and finite, the ramp's
/// shares increasing in (0, 1] and ending at 1. Throws InputError naming
/// the field.
void validate(const ShiftCostConfig& c);

/// Seconds the target's weights take to arrive before its domains can be
/// built: 0 for a gear whose weight_mode is "resident" (every gear's shards
/// stay on their devices); in "release" mode, the slowest rank on a device
/// that `from` does not use loads its shard:
///   max over such ranks of stage_weight_params x bytes_per_param / tp / weight_load_gb_s.
/// Ranks load in parallel.
double weight_load_s(const ModelShape& m, const doc::Gear& from, const doc::Gear& to, const ShiftCostConfig& c);

/// Seconds of the reserve phase: reserve_s + weight_load_s (the reload
/// overlaps nothing else in a shift's critical path).
double reserve_phase_s(const ModelShape& m, const doc::Gear& from, const doc::Gear& to, const ShiftCostConfig& c);

}  // namespace ftp::plan
