// SPDX-License-Identifier: Apache-2.0
// comm::GlooGroup and GlooCommunicator: ranks that are threads of this
// process over loopback TCP (the same transport as between processes).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "comm/gloo.hpp"
#include "comm/inproc.hpp"
#include "core/error.hpp"

namespace {

using ftp::comm::GlooCommunicator;
using ftp::comm::GlooGroup;
using ftp::comm::GlooOptions;
using ftp::comm::LocalStore;

template <typename F>
void on_ranks(int n, F f) {
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back([&, r] { f(r); });
  for (auto& t : th) t.join();
}

// Values whose sum depends on the order: 1e8 + 1 - 1e8 is 0 one way, 1 the other.
std::vector<float> rank_values(int r, std::size_t n) {
  std::mt19937 g(static_cast<unsigned>(r) * 7919u + 1);
  std::uniform_real_distribution<float> d(-1e3f, 1e3f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) * (r == 1 ? 1e5f : 1.0f);
  return v;
}

TEST(Gloo, AllReduceAddsInRankOrderLikeInproc) {
  constexpr int n = 3;
  constexpr std::size_t count = 5000;
  // The expected sums by hand, serial, in rank order: ((x0 + x1) + x2).
  std::vector<float> want = rank_values(0, count);
  for (int r = 1; r < n; ++r) {
    auto v = rank_values(r, count);
    for (std::size_t i = 0; i < count; ++i) want[i] += v[i];
  }
  LocalStore store;
  std::vector<std::vector<float>> got(n);
  on_ranks(n, [&](int r) {
    GlooGroup g(store, "t1", r, n);
    got[static_cast<std::size_t>(r)] = rank_values(r, count);
    g.all_reduce_sum(got[static_cast<std::size_t>(r)].data(), count);
  });
  // The in-process communicator, the same inputs.
  ftp::comm::InprocCommunicator inproc(n);
  std::vector<std::vector<float>> ref(n);
  on_ranks(n, [&](int r) {
    ref[static_cast<std::size_t>(r)] = rank_values(r, count);
    inproc.all_reduce_sum(r, ref[static_cast<std::size_t>(r)].data(), count);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(0, std::memcmp(got[r].data(), want.data(), count * sizeof(float))) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(ref[r].data(), want.data(), count * sizeof(float))) << "inproc rank " << r;
  }
}

TEST(Gloo, CommunicatorSplitsLocalRanks) {
  // A stage of tp 3 whose ranks 0 and 2 are "here" and rank 1 "elsewhere".
  LocalStore store;
  std::vector<float> a{1, 2}, b{10, 20}, c{100, 200};
  std::unique_ptr<GlooCommunicator> here, there;
  on_ranks(2, [&](int which) {
    if (which == 0)
      here = std::make_unique<GlooCommunicator>(store, "t2", 3, std::vector<int>{0, 2});
    else
      there = std::make_unique<GlooCommunicator>(store, "t2", 3, std::vector<int>{1});
  });
  on_ranks(3, [&](int r) {
    if (r == 0) here->all_reduce_sum(0, a.data(), 2);
    if (r == 1) there->all_reduce_sum(1, b.data(), 2);
    if (r == 2) here->all_reduce_sum(2, c.data(), 2);
  });
  EXPECT_EQ(a, (std::vector<float>{111, 222}));
  EXPECT_EQ(b, a);
  EXPECT_EQ(c, a);
  EXPECT_THROW(there->all_reduce_sum(0, a.data(), 2), ftp::InputError);
  EXPECT_FALSE(here->reset());
}

TEST(Gloo, BroadcastSendRecv) {
  LocalStore store;
  std::vector<std::string> got(3);
  on_ranks(3, [&](int r) {
    GlooGroup g(store, "t3", r, 3);
    char buf[6] = {};
    if (r == 1) std::memcpy(buf, "hello", 6);
    g.broadcast(1, buf, 6);
    got[static_cast<std::size_t>(r)] = buf;
    int v = r == 0 ? 42 : 0;
    if (r == 0) g.send(2, &v, sizeof v, 7);
    if (r == 2) g.recv(0, &v, sizeof v, 7);
    if (r == 2) got[2] += std::to_string(v);
  });
  EXPECT_EQ(got[0], "hello");
  EXPECT_EQ(got[1], "hello");
  EXPECT_EQ(got[2], "hello42");
}

TEST(Gloo, AbortWakesAPendingRecv) {
  LocalStore store;
  std::string error;
  on_ranks(2, [&](int r) {
    GlooGroup g(store, "t4", r, 2, GlooOptions{"127.0.0.1", std::chrono::milliseconds(60000)});
    if (r == 0) {
      std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        g.abort();
      });
      int v = 0;
      try {
        g.recv(1, &v, sizeof v, 3);
      } catch (const ftp::Error& e) {
        error = e.what();
      }
      stopper.join();
      store.set("t4-done", {1});
    } else {
      store.get("t4-done", std::chrono::milliseconds(60000));  // rank 1 stays until rank 0 is done
    }
  });
  EXPECT_NE(error.find("aborted"), std::string::npos) << error;
}

TEST(Gloo, APeerThatNeverComesTimesOutNamingTheGroup) {
  LocalStore store;
  try {
    GlooGroup g(store, "lonely", 0, 2, GlooOptions{"127.0.0.1", std::chrono::milliseconds(200)});
    FAIL() << "connected without its peer";
  } catch (const ftp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
  }
}

}  // namespace
