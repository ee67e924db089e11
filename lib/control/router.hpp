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
class Router {
 public:
  /// `long_prompt_tokens` 0: no long-prompt rule.
  explicit Router(int long_prompt_tokens = 0) : long_prompt_tokens_(long_prompt_tokens) {}

  /// Index in `candidates` of the domain that takes `request`; -1 when no
  /// candidate has a weight above 0.
  int pick(const std::vector<RouteCandidate>& candidates, const RouteRequest& request);
  /// Drops what the router keeps of a retired domain.
  void forget(const std::string& id) { credit_.erase(id); }

 private:
  int long_prompt_tokens_;
  std::map<std::string, double> credit_;  // smooth weighted round robin
};

}  // namespace ftp::control
