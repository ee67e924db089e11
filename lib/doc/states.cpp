// SPDX-License-Identifier: Apache-2.0
#include "doc/states.hpp"

namespace ftp::doc {

namespace {

template <typename E>
std::optional<E> from_names(const std::vector<std::string>& names, std::string_view name) noexcept {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& domain_state_names() {
  static const std::vector<std::string> names = {"warming", "serving", "draining", "retired"};
  return names;
}

const std::vector<std::string>& shift_phase_names() {
  static const std::vector<std::string> names = {"reserve", "warm", "ramp", "drain", "retire", "rollback", "done"};
  return names;
}

const std::vector<std::string>& shift_outcome_names() {
  static const std::vector<std::string> names = {"committed", "rolled-back", "failed", "interrupted"};
  return names;
}

std::string_view to_string(DomainState s) noexcept { return domain_state_names()[static_cast<std::size_t>(s)]; }
std::string_view to_string(ShiftPhase p) noexcept { return shift_phase_names()[static_cast<std::size_t>(p)]; }
std::string_view to_string(ShiftOutcome o) noexcept { return shift_outcome_names()[static_cast<std::size_t>(o)]; }

std::optional<DomainState> domain_state_from(std::string_view name) noexcept {
  return from_names<DomainState>(domain_state_names(), name);
}
std::optional<ShiftPhase> shift_phase_from(std::string_view name) noexcept {
  return from_names<ShiftPhase>(shift_phase_names(), name);
}
std::optional<ShiftOutcome> shift_outcome_from(std::string_view name) noexcept {
  return from_names<ShiftOutcome>(shift_outcome_names(), name);
}

}  // namespace ftp::doc
