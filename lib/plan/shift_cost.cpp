// SPDX-License-Identifier: Apache-2.0
#include "plan/shift_cost.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "core/error.hpp"
#include "plan/cost_model.hpp"

namespace ftp::plan {

void validate(const ShiftCostConfig& c) {
  auto time = [](double v, const char* what) {
    if (!(v >= 0) || !std::isfinite(v)) throw InputError(std::string(what) + ": must be a finite number >= 0");
  };
  time(c.reserve_s, "shift reserve_s");
  time(c.warm_s, "shift warm_s");
  time(c.weight_load_gb_s, "shift weight_load_gb_s");
  time(c.ramp_step_s, "shift ramp_step_s");
  if (c.ramp.empty() || c.ramp.back() != 1.0) throw InputError("shift ramp: the last share must be 1.0 (100 %)");
  for (std::size_t i = 0; i < c.ramp.size(); ++i)
    if (!(c.ramp[i] > 0 && c.ramp[i] <= 1) || (i > 0 && c.ramp[i] <= c.ramp[i - 1]))
      throw InputError("shift ramp: shares must increase within (0, 1]");
}

double weight_load_s(const ModelShape& m, const doc::Gear& from, const doc::Gear& to, const ShiftCostConfig& c) {
  if (to.weight_mode != "release" || !(c.weight_load_gb_s > 0)) return 0;
  const std::vector<std::string> held = from.devices();
  const std::set<std::string> keep(held.begin(), held.end());
  double slowest = 0;
  for (const auto& rep : to.replicas)
    for (const auto& st : rep.stages) {
      const StageSpan span{st.n_layers, st.first_layer == 0, st.first_layer + st.n_layers == m.n_layers};
      const double tp = static_cast<double>(std::max<std::size_t>(1, st.devices.size()));
      const double bytes = stage_weight_params(m, span) * m.bytes_per_param / tp;
      for (const auto& d : st.devices)
        if (!keep.count(d)) slowest = std::max(slowest, bytes / (c.weight_load_gb_s * 1e9));
    }
  return slowest;
}

double reserve_phase_s(const ModelShape& m, const doc::Gear& from, const doc::Gear& to, const ShiftCostConfig& c) {
  return c.reserve_s + weight_load_s(m, from, to, c);
}

}  // namespace ftp::plan
