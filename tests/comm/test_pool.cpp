// SPDX-License-Identifier: Apache-2.0
// The in-process communicator pool (comm::InprocPool): made ahead, leased,
// given back, and what it counts as created.
#include <gtest/gtest.h>

#include <thread>

#include "comm/pool.hpp"
#include "core/error.hpp"

using ftp::comm::InprocPool;

TEST(InprocPool, PreparedCommunicatorsAreLeasedAndComeBack) {
  InprocPool pool;
  const InprocPool::Key two{"cpu:0", "cpu:1"};
  pool.prepare(two, 2);
  pool.prepare(two, 2);  // already there: nothing more
  EXPECT_EQ(pool.created(), 2u);
  EXPECT_EQ(pool.idle(two), 2u);
  {
    auto a = pool.acquire(two);
    auto b = pool.acquire(two);
    EXPECT_NE(a.get(), b.get());  // two domains of one device set each lease their own
    EXPECT_EQ(a->size(), 2);
    EXPECT_EQ(pool.idle(two), 0u);
    EXPECT_EQ(pool.created(), 2u);  // no new one
    // It works: two ranks sum.
    float x[2] = {1, 2}, y[2] = {10, 20};
    std::thread t([&] { b->all_reduce_sum(1, y, 2); });
    b->all_reduce_sum(0, x, 2);
    t.join();
    EXPECT_EQ(x[1], 22);
    EXPECT_EQ(y[0], 11);
    auto c = pool.acquire(two);  // past what was prepared: made now, counted
    EXPECT_EQ(pool.created(), 3u);
  }
  EXPECT_EQ(pool.idle(two), 3u);
  // Another set is another key.
  auto one = pool.acquire({"cpu:2"});
  EXPECT_EQ(one->size(), 1);
  EXPECT_EQ(pool.created(), 4u);
}

TEST(InprocPool, AnAbortedCommunicatorIsResetOnItsWayBack) {
  InprocPool pool;
  const InprocPool::Key two{"a", "b"};
  {
    auto c = pool.acquire(two);
    c->abort();
  }
  EXPECT_EQ(pool.idle(two), 1u);
  auto again = pool.acquire(two);
  EXPECT_EQ(pool.created(), 1u);
  float x = 1, y = 2;
  std::thread t([&] { again->all_reduce_sum(1, &y, 1); });
  again->all_reduce_sum(0, &x, 1);  // usable: it was reset
  t.join();
  EXPECT_EQ(x, 3);
}

TEST(InprocPool, AnEmptySetIsRefused) {
  InprocPool pool;
  EXPECT_THROW(pool.acquire({}), ftp::InputError);
  EXPECT_THROW(pool.prepare({}, 1), ftp::InputError);
}
