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

// The pool spans the gear table's devices only (issue 17, as the NCCL root
// spans the table's GPUs): sets with another device are dropped when idle,
// and a leased one when it comes back; sets inside stay.
TEST(InprocPool, KeepsCommunicatorsOfTheSpannedDevicesOnly) {
  InprocPool pool;
  const InprocPool::Key in{"vd1", "vd0"}, out{"vd2", "vd3"}, mixed{"vd0", "vd2"};
  EXPECT_TRUE(pool.devices().empty());
  pool.prepare(in, 1);
  pool.prepare(out, 1);
  pool.prepare(mixed, 1);
  auto leased = pool.acquire(mixed);
  pool.span({"vd1", "vd0", "vd4", "vd0"});
  EXPECT_EQ(pool.devices(), (std::vector<std::string>{"vd0", "vd1", "vd4"}));
  EXPECT_EQ(pool.idle(in), 1u);
  EXPECT_EQ(pool.idle(out), 0u) << "a set outside the table's devices is dropped";
  leased.reset();
  EXPECT_EQ(pool.idle(mixed), 0u) << "a leased one outside them is dropped on its way back";
  // Made again on demand when asked, and counted.
  const auto before = pool.created();
  auto again = pool.acquire(out);
  EXPECT_EQ(pool.created(), before + 1);
  // A reload back to those devices keeps them from then on.
  pool.span({"vd2", "vd3"});
  again.reset();
  EXPECT_EQ(pool.idle(out), 1u);
  EXPECT_EQ(pool.idle(in), 0u);
}
