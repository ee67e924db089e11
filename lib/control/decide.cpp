// SPDX-License-Identifier: Apache-2.0
#include "control/decide.hpp"

#include <optional>

#include "core/error.hpp"
#include "doc/control.hpp"

namespace ftp::control {

DecideStats decide(std::istream& in, std::string_view source, Policy& policy,
                   const std::function<void(const json::Json&)>& emit,
                   const std::function<void(const std::string&)>& warn) {
  DecideStats st;
  std::string line;
  long n = 0;
  std::optional<std::int64_t> last_t;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++st.lines;
    const std::string where = std::string(source) + ":" + std::to_string(n) + ": ";
    try {
      doc::Observation o = doc::observation_from_json(json::parse_line(line));
      if (last_t && o.t_ms < *last_t)
        throw InputError("t_ms: must not go back in time, got " + std::to_string(o.t_ms) + " after " +
                         std::to_string(*last_t));
      doc::Decision d = policy.observe(o);
      last_t = o.t_ms;
      ++st.decisions;
      if (d.action == "shift") ++st.shifts;
      emit(doc::to_json(d));
    } catch (const InputError& e) {
      ++st.skipped;
      warn(where + e.what() + "; line skipped");
    }
  }
  return st;
}

}  // namespace ftp::control
