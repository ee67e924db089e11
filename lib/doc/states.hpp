// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace ftp::doc {

/// Life of a domain (ARCHITECTURE.md section 1): warming -> serving ->
/// draining -> retired. A string only at the JSON boundary (to_string).
enum class DomainState { warming, serving, draining, retired };

/// The phases of a shift, in the order a committed shift runs them;
/// `rollback` replaces drain and retire on a failed check, `done` closes
/// every shift with its outcome.
enum class ShiftPhase { reserve, warm, ramp, drain, retire, rollback, done };

/// How a shift ended (the `done` record).
enum class ShiftOutcome { committed, rolled_back, failed, interrupted };  ///< interrupted: the daemon stopped mid-shift (the journal)

std::string_view to_string(DomainState s) noexcept;
std::string_view to_string(ShiftPhase p) noexcept;
/// "committed" | "rolled-back" | "failed" | "interrupted".
std::string_view to_string(ShiftOutcome o) noexcept;

/// Writes the JSON name (log lines, test messages).
inline std::ostream& operator<<(std::ostream& os, DomainState s) { return os << to_string(s); }
inline std::ostream& operator<<(std::ostream& os, ShiftPhase p) { return os << to_string(p); }
inline std::ostream& operator<<(std::ostream& os, ShiftOutcome o) { return os << to_string(o); }

/// The JSON names of each enum, in declaration order (for one_of checks
/// and error messages).
const std::vector<std::string>& domain_state_names();
const std::vector<std::string>& shift_phase_names();
const std::vector<std::string>& shift_outcome_names();

/// The value named `name`, or nothing.
std::optional<DomainState> domain_state_from(std::string_view name) noexcept;
std::optional<ShiftPhase> shift_phase_from(std::string_view name) noexcept;
std::optional<ShiftOutcome> shift_outcome_from(std::string_view name) noexcept;

}  // namespace ftp::doc
