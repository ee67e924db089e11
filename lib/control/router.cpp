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

void Router::set_candidates(const std::vector<RouteCandidate>& cands) {
  bool same = cands.size() == cands_.size();
  for (std::size_t i = 0; same && i < cands.size(); ++i) same = cands[i].id == cands_[i].id;
  if (same) {
    for (std::size_t i = 0; i < cands.size(); ++i) {
      cands_[i].weight = cands[i].weight;
      cands_[i].tp = cands[i].tp;
    }
    return;
  }
  // Park every credit, then take back those of the ids that stay.
  for (std::size_t i = 0; i < cands_.size(); ++i) parked_[cands_[i].id] = credit_[i];
  cands_ = cands;
  credit_.assign(cands_.size(), 0.0);
  for (std::size_t i = 0; i < cands_.size(); ++i) {
    auto it = parked_.find(cands_[i].id);
    if (it == parked_.end()) continue;
    credit_[i] = it->second;
    parked_.erase(it);
  }
}

int Router::pick(const RouteRequest& r) {
  const bool to_largest_tp = r.priority > 0 || (long_prompt_tokens_ > 0 && r.prompt_tokens >= long_prompt_tokens_);
  int best = -1;
  if (to_largest_tp) {
    for (std::size_t i = 0; i < cands_.size(); ++i)
      if (cands_[i].weight > 0 && (best < 0 || cands_[i].tp > cands_[static_cast<std::size_t>(best)].tp))
        best = static_cast<int>(i);
    return best;
  }
  double total = 0;
  for (std::size_t i = 0; i < cands_.size(); ++i) {
    if (!(cands_[i].weight > 0)) continue;
    credit_[i] += cands_[i].weight;
    total += cands_[i].weight;
    if (best < 0 || credit_[i] > credit_[static_cast<std::size_t>(best)]) best = static_cast<int>(i);
  }
  if (best >= 0) credit_[static_cast<std::size_t>(best)] -= total;
  return best;
}

int Router::pick(const std::vector<RouteCandidate>& cands, const RouteRequest& r) {
  set_candidates(cands);
  return pick(r);
}

void Router::forget(const std::string& id) {
  parked_.erase(id);
  for (std::size_t i = 0; i < cands_.size(); ++i)
    if (cands_[i].id == id) credit_[i] = 0;
}

}  // namespace ftp::control
