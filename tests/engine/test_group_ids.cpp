// SPDX-License-Identifier: Apache-2.0
// The request groups of a domain as small ids (lib/engine/group_ids): one
// id per live name, reused once no sequence holds it.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "engine/group_ids.hpp"

using namespace ftp::engine;

TEST(GroupIds, OneIdPerLiveName) {
  GroupIds g;
  const int a = g.acquire("alice"), b = g.acquire("bob");
  EXPECT_NE(a, b);
  EXPECT_EQ(g.acquire("alice"), a);  // held twice now
  EXPECT_EQ(g.live(), 2u);
  EXPECT_EQ(g.bound(), 2);
  g.release(a);
  EXPECT_EQ(g.acquire("alice"), a) << "alice still had a holder";
  g.release(a);
  g.release(a);
  EXPECT_EQ(g.live(), 1u);
  // alice's id is free: the next new name gets it, the bound does not grow.
  EXPECT_EQ(g.acquire("carol"), a);
  EXPECT_EQ(g.bound(), 2);
  EXPECT_NE(g.acquire("alice"), a) << "carol holds alice's old id";
  EXPECT_EQ(g.bound(), 3);
}

TEST(GroupIds, ReleaseOfAnIdNobodyHoldsIsAnError) {
  GroupIds g;
  const int a = g.acquire("");
  g.release(a);
  try {
    g.release(a);
    FAIL() << "a second release accepted";
  } catch (const ftp::Error& e) {
    EXPECT_EQ(std::string(e.what()), "request groups: release of group id 0, which no sequence holds");
  }
  EXPECT_THROW(g.release(7), ftp::Error);
}
