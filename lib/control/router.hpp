// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ftp::control {

/// What the router knows of a domain that may take new requests.
struct RouteCandidate {
  std::string id;
  double weight = 0;  ///< share of new requests, 0..1 (0: takes none)
  int tp = 1;         ///< tensor-parallel degree
};

/// What the router reads of a request.
struct RouteRequest {
  int priority = 0;       ///< > 0: to the largest-TP domain
  int prompt_tokens = 0;
};

/// Shares of new requests for domains of unequal capacity: `share` split in
/// proportion to `capacity` (requests/s, or any unit common to all), so
/// that each domain runs at the same fraction of what it can do. Equal
/// shares when any capacity is not above 0 (unknown); empty for none.
std::vector<double> capacity_shares(const std::vector<double>& capacity, double share);

/// Assigns each new request to one domain (ARCHITECTURE.md section 2):
/// by weight, with smooth weighted round robin (deterministic, each
/// domain's share of picks follows its weight); a high-priority request,
/// or a prompt of at least `long_prompt_tokens` tokens, goes to the
/// candidate of the largest TP degree. It never moves an in-flight request.
/// Pure: no clock, no locks (the caller serialises its calls). The daemon
/// (serve::Service) and the engine-model replay (sim::replay_engine) both
/// route with it; both give domains of unequal capacity capacity_shares.
///
/// The candidates are set apart from the picks: a pick works on indices
/// and doubles only, so a replay of millions of requests over tens of
/// domains sets them when a weight or a domain's state changes and picks
/// without touching a string. Each domain's round-robin credit follows its
/// id across set_candidates calls, also while it is left out of them,
/// until forget.
class Router {
 public:
  /// `long_prompt_tokens` 0: no long-prompt rule.
  explicit Router(int long_prompt_tokens = 0) : long_prompt_tokens_(long_prompt_tokens) {}

  /// The domains that may take new requests, in the order pick's index
  /// refers to. Ids must be distinct. O(n) when the ids are those of the
  /// last call in the same order (only weights or TP changed), O(n log n)
  /// otherwise.
  void set_candidates(const std::vector<RouteCandidate>& candidates);
  /// The candidates of the last set_candidates.
  const std::vector<RouteCandidate>& candidates() const noexcept { return cands_; }
  /// Index in candidates() of the domain that takes `request`; -1 when no
  /// candidate has a weight above 0.
  int pick(const RouteRequest& request);
  /// set_candidates(candidates), then pick(request): for a caller whose
  /// candidates may change between any two requests (the daemon).
  int pick(const std::vector<RouteCandidate>& candidates, const RouteRequest& request);
  /// Drops what the router keeps of a retired domain: its credit starts
  /// afresh should the id come back.
  void forget(const std::string& id);

 private:
  int long_prompt_tokens_;
  std::vector<RouteCandidate> cands_;
  std::vector<double> credit_;             // smooth weighted round robin, of cands_[i]
  std::map<std::string, double> parked_;   // credit of ids not among the candidates now
};

}  // namespace ftp::control
