// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>

/// Kind and version of every JSON document flextp reads or writes. A reader
/// checks the kind first and ignores fields it does not know; a writer never
/// changes a field's meaning within a version (man ftp-documents(5)).
namespace ftp::doc::kind {
inline constexpr std::string_view topology = "ftp.topology/v1";
inline constexpr std::string_view cluster = "ftp.cluster/v1";
inline constexpr std::string_view gear_table = "ftp.gear-table/v1";
inline constexpr std::string_view observation = "ftp.observation/v1";
inline constexpr std::string_view decision = "ftp.decision/v1";
inline constexpr std::string_view shift_event = "ftp.shift-event/v1";
inline constexpr std::string_view capacity = "ftp.capacity/v1";
inline constexpr std::string_view model_shape = "ftp.model-shape/v1";
inline constexpr std::string_view policy = "ftp.policy/v1";
inline constexpr std::string_view sim_interval = "ftp.sim-interval/v1";
inline constexpr std::string_view sim_summary = "ftp.sim-summary/v1";
inline constexpr std::string_view gear_bench = "ftp.gear-bench/v1";
inline constexpr std::string_view sim_calibration = "ftp.sim-calibration/v1";
}  // namespace ftp::doc::kind
