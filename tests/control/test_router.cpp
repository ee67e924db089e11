// SPDX-License-Identifier: Apache-2.0
// The router by itself (no domains): weighted shares, the largest-TP rules,
// no pick without weight, candidates set apart from the picks with each
// domain's credit following its id. Expected counts are worked out from
// the weights.
#include <gtest/gtest.h>

#include <map>

#include "control/router.hpp"

using ftp::control::RouteCandidate;
using ftp::control::RouteRequest;
using ftp::control::Router;

namespace {

std::map<std::string, int> picks(Router& r, const std::vector<RouteCandidate>& c, int n, RouteRequest req = {}) {
  std::map<std::string, int> out;
  for (int i = 0; i < n; ++i) {
    const int k = r.pick(c, req);
    if (k >= 0) ++out[c[static_cast<std::size_t>(k)].id];
  }
  return out;
}

}  // namespace

TEST(Router, SharesFollowWeightsExactly) {
  // Smooth weighted round robin gives each domain its share of every full
  // cycle: 10 % and 90 % of 100 picks are 10 and 90, not about that.
  Router r;
  auto n = picks(r, {{"old", 0.9, 1}, {"new", 0.1, 2}}, 100);
  EXPECT_EQ(n["old"], 90);
  EXPECT_EQ(n["new"], 10);
  Router half;
  auto h = picks(half, {{"a", 0.5, 1}, {"b", 0.5, 1}}, 10);
  EXPECT_EQ(h["a"], 5);
  EXPECT_EQ(h["b"], 5);
}

TEST(Router, InterleavesRatherThanBursts) {
  // With 1:1 weights the picks alternate: a ramp step's share reaches the
  // new domain from its first requests on.
  Router r;
  std::vector<RouteCandidate> c = {{"a", 0.5, 1}, {"b", 0.5, 1}};
  int first = r.pick(c, {});
  for (int i = 0; i < 6; ++i) {
    int next = r.pick(c, {});
    EXPECT_NE(next, first) << "pick " << i;
    first = next;
  }
}

TEST(Router, ZeroWeightTakesNothingAndNoneLeavesNoPick) {
  Router r;
  auto n = picks(r, {{"drained", 0.0, 4}, {"serving", 1.0, 1}}, 20);
  EXPECT_EQ(n["serving"], 20);
  EXPECT_EQ(n.count("drained"), 0u);
  EXPECT_EQ(r.pick({}, {}), -1);
  EXPECT_EQ(r.pick({{"x", 0.0, 1}}, {}), -1);
}

TEST(Router, PriorityAndLongPromptsGoToTheLargestTp) {
  Router r(1000);
  std::vector<RouteCandidate> c = {{"tp1", 0.7, 1}, {"tp4", 0.2, 4}, {"tp2", 0.1, 2}};
  EXPECT_EQ(r.pick(c, RouteRequest{1, 10}), 1);
  EXPECT_EQ(r.pick(c, RouteRequest{0, 1000}), 1);
  // Just under the threshold: by weight, so the heaviest first.
  EXPECT_EQ(r.pick(c, RouteRequest{0, 999}), 0);
  // The largest-TP rule still needs a weight: a draining TP-8 domain gets nothing.
  std::vector<RouteCandidate> d = {{"tp8", 0.0, 8}, {"tp1", 1.0, 1}};
  EXPECT_EQ(r.pick(d, RouteRequest{5, 0}), 1);
}

TEST(Router, LongPromptRuleOffByDefault) {
  Router r;
  std::vector<RouteCandidate> c = {{"tp1", 1.0, 1}, {"tp4", 0.0001, 4}};
  EXPECT_EQ(r.pick(c, RouteRequest{0, 1 << 20}), 0);
}

TEST(Router, ForgetStartsADomainsCreditAfresh) {
  Router r;
  std::vector<RouteCandidate> c = {{"a", 0.5, 1}, {"b", 0.5, 1}};
  EXPECT_EQ(r.pick(c, {}), 0);  // a's credit is now below b's
  r.forget("a");
  r.forget("b");
  EXPECT_EQ(r.pick(c, {}), 0);  // as from a fresh router: the first wins ties
}

TEST(Router, PicksOnTheCandidatesSetBefore) {
  // set_candidates once, then picks by index: the same picks as passing the
  // candidates with each request (1:3 weights, 8 picks: 2 and 6).
  Router set, each;
  const std::vector<RouteCandidate> c = {{"a", 0.25, 1}, {"b", 0.75, 2}};
  set.set_candidates(c);
  ASSERT_EQ(set.candidates().size(), 2u);
  EXPECT_EQ(set.candidates()[1].id, "b");
  int n_a = 0;
  for (int i = 0; i < 8; ++i) {
    const int k = set.pick(RouteRequest{});
    EXPECT_EQ(k, each.pick(c, {})) << "pick " << i;
    n_a += k == 0;
  }
  EXPECT_EQ(n_a, 2);
  Router none;
  EXPECT_EQ(none.pick(RouteRequest{}), -1);  // no candidates set
}

TEST(Router, CreditFollowsTheIdWhenTheOrderChanges) {
  // a and b at 1:1: a wins the first pick (ties go to the first), so b is
  // ahead (b +0.5, a -0.5). Turned round and at 0.4:0.6, b (now index 0)
  // still has its lead: 0.9 against a's 0.1, b wins. Credits kept by index
  // (-0.1 against 1.1) or started afresh (0.4 against 0.6) would give a.
  Router r;
  r.set_candidates({{"a", 0.5, 1}, {"b", 0.5, 1}});
  EXPECT_EQ(r.pick(RouteRequest{}), 0);  // a
  r.set_candidates({{"b", 0.4, 1}, {"a", 0.6, 1}});
  EXPECT_EQ(r.pick(RouteRequest{}), 0);  // b
}

TEST(Router, ALeftOutDomainKeepsItsCreditUntilForgotten) {
  // a, b at 1:1, a picked: a's credit is -0.5, b's +0.5. b leaves the
  // candidates for a while (only a picks), then comes back: it is still
  // ahead and wins the next pick at 1:1, though it is second in the list.
  Router r;
  r.set_candidates({{"a", 0.5, 1}, {"b", 0.5, 1}});
  EXPECT_EQ(r.pick(RouteRequest{}), 0);
  r.set_candidates({{"a", 1.0, 1}});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.pick(RouteRequest{}), 0);
  r.set_candidates({{"a", 0.5, 1}, {"b", 0.5, 1}});
  EXPECT_EQ(r.pick(RouteRequest{}), 1);
  // Forgotten while left out: it comes back from 0 credit, the tie goes to a.
  Router f;
  f.set_candidates({{"a", 0.5, 1}, {"b", 0.5, 1}});
  EXPECT_EQ(f.pick(RouteRequest{}), 0);
  f.set_candidates({{"a", 1.0, 1}});
  f.forget("b");
  f.forget("a");
  f.set_candidates({{"a", 0.5, 1}, {"b", 0.5, 1}});
  EXPECT_EQ(f.pick(RouteRequest{}), 0);
}

TEST(Router, NewWeightsOnTheSameIdsKeepTheCredits) {
  // 1:1, a picked (a -0.5, b +0.5); then 0.9:0.1 on the same ids: b's lead
  // stays, 0.6 against a's 0.4, and b wins (afresh, a would at 0.9). Over
  // the next full cycle of 10 picks a gets 9, b 1.
  Router r;
  r.set_candidates({{"a", 0.5, 1}, {"b", 0.5, 1}});
  EXPECT_EQ(r.pick(RouteRequest{}), 0);
  r.set_candidates({{"a", 0.9, 1}, {"b", 0.1, 1}});
  EXPECT_EQ(r.candidates()[0].weight, 0.9);
  EXPECT_EQ(r.pick(RouteRequest{}), 1);
  int n_a = 0;
  for (int i = 0; i < 10; ++i) n_a += r.pick(RouteRequest{}) == 0;
  EXPECT_EQ(n_a, 9);
}

TEST(CapacityShares, InProportionToCapacity) {
  // 30 and 10 req/s of capacity split 0.8: 0.6 and 0.2 (each at the same
  // fraction of what it can do).
  const std::vector<double> s = ftp::control::capacity_shares({30, 10}, 0.8);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_DOUBLE_EQ(s[0], 0.6);
  EXPECT_DOUBLE_EQ(s[1], 0.2);
}

TEST(CapacityShares, EqualWhenACapacityIsUnknown) {
  const std::vector<double> s = ftp::control::capacity_shares({30, 0, 10}, 0.9);
  ASSERT_EQ(s.size(), 3u);
  for (double x : s) EXPECT_DOUBLE_EQ(x, 0.3);
  EXPECT_TRUE(ftp::control::capacity_shares({}, 1.0).empty());
}

TEST(CapacityShares, RoutedPicksFollowCapacity) {
  // Through the router: 3:1 capacity, 400 picks, 300 and 100 exactly.
  ftp::control::Router r;
  const std::vector<double> w = ftp::control::capacity_shares({3, 1}, 1.0);
  std::vector<RouteCandidate> c = {{"big", w[0], 2}, {"small", w[1], 1}};
  auto n = picks(r, c, 400);
  EXPECT_EQ(n["big"], 300);
  EXPECT_EQ(n["small"], 100);
}
