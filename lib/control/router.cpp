// SPDX-License-Identifier: Apache-2.0
#include "control/router.hpp"

namespace ftp::control {

std::vector<double> capacity_shares(const std::vector<double>& capacity, double share) {
  std::vector<double> out(capacity.size(), capacity.empty() ? 0 : share / static_cast<double>(capacity.size()));
  double total = 0;
  for (double c : capacity) {
    if (!(c > 0)) return out;
    total += c;
  }
  for (std::size_t i = 0; i < capacity.size(); ++i) out[i] = share * capacity[i] / total;
  return out;
}

int Router::pick(const std::vector<RouteCandidate>& cands, const RouteRequest& r) {
  const bool to_largest_tp = r.priority > 0 || (long_prompt_tokens_ > 0 && r.prompt_tokens >= long_prompt_tokens_);
  int best = -1;
  if (to_largest_tp) {
    for (std::size_t i = 0; i < cands.size(); ++i)
      if (cands[i].weight > 0 && (best < 0 || cands[i].tp > cands[static_cast<std::size_t>(best)].tp))
        best = static_cast<int>(i);
    return best;
  }
  double total = 0;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (!(cands[i].weight > 0)) continue;
    double& c = credit_[cands[i].id];
    c += cands[i].weight;
    total += cands[i].weight;
    if (best < 0 || c > credit_[cands[static_cast<std::size_t>(best)].id]) best = static_cast<int>(i);
  }
  if (best >= 0) credit_[cands[static_cast<std::size_t>(best)].id] -= total;
  return best;
}

}  // namespace ftp::control
