// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <istream>
#include <string>
#include <string_view>

#include "control/policy.hpp"
#include "core/json.hpp"

namespace ftp::control {

/// Counts of one decide run.
struct DecideStats {
  long lines = 0;       ///< non-empty input lines
  long decisions = 0;   ///< decisions written (one per accepted observation)
  long shifts = 0;      ///< of which shifts
  long skipped = 0;     ///< lines rejected with a warning
};

/// The stream processor of `ftp-plan decide`: reads ftp.observation/v1
/// documents, one per line, and hands one ftp.decision/v1 per observation
/// to `emit`. A line that is not a valid observation (malformed JSON,
/// a bad field, a gear the table lacks, a t_ms earlier than the previous
/// line's) is skipped: `warn` gets "<source>:<line>: <path>: <why>" and the
/// stream goes on. Empty lines are ignored. Time is the observations' t_ms.
DecideStats decide(std::istream& in, std::string_view source, Policy& policy,
                   const std::function<void(const json::Json&)>& emit,
                   const std::function<void(const std::string&)>& warn);

}  // namespace ftp::control
