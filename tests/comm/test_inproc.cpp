// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "comm/nccl.hpp"
#include "core/error.hpp"

using namespace ftp::comm;

namespace {

/// Runs fn(rank) on n threads; returns the first exception's message or "".
std::string run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errors)
    if (!e.empty()) return e;
  return "";
}

// Integer-valued floats below 2^24 add exactly: the expected sums are exact.
float value(int rank, std::size_t i) { return static_cast<float>((i % 1000) * (rank + 1) + rank); }

}  // namespace

class AllReduce : public ::testing::TestWithParam<int> {};

TEST_P(AllReduce, ExactSumsForAnyCount) {
  const int n = GetParam();
  InprocCommunicator comm(n);
  EXPECT_EQ(comm.size(), n);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{15},
                            std::size_t{16}, std::size_t{17}, std::size_t{1023}, std::size_t{1025},
                            std::size_t{100003}, std::size_t{1} << 20}) {
    std::vector<std::vector<float>> bufs(n);
    for (int r = 0; r < n; ++r) {
      bufs[r].resize(count);
      for (std::size_t i = 0; i < count; ++i) bufs[r][i] = value(r, i);
    }
    std::string err = run_ranks(n, [&](int r) { comm.all_reduce_sum(r, bufs[r].data(), count); });
    ASSERT_EQ(err, "");
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) {
        float expect = 0;
        for (int j = 0; j < n; ++j) expect += value(j, i);
        ASSERT_EQ(bufs[r][i], expect) << "n=" << n << " count=" << count << " rank=" << r << " i=" << i;
      }
    }
  }
}

TEST_P(AllReduce, RepeatedCallsAndBroadcast) {
  const int n = GetParam();
  InprocCommunicator comm(n);
  const std::size_t count = 37;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
  std::string err = run_ranks(n, [&](int r) {
    for (int it = 0; it < 50; ++it) {
      std::fill(bufs[r].begin(), bufs[r].end(), static_cast<float>(r + it));
      comm.all_reduce_sum(r, bufs[r].data(), count);
      comm.barrier(r);
    }
    const int root = n - 1;
    if (r == root)
      for (std::size_t i = 0; i < count; ++i) bufs[r][i] = static_cast<float>(i) * 0.5f;
    comm.broadcast(r, root, bufs[r].data(), count);
  });
  ASSERT_EQ(err, "");
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(bufs[r][i], static_cast<float>(i) * 0.5f);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduce, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(AllReduceOrder, DeterministicAndSerialRankOrder) {
  // Values whose float sum depends on the order: the result must equal the
  // serial sum in rank order 0..n-1, bit for bit, on every run.
  const int n = 7;
  const std::size_t count = 50000;
  auto v = [](int r, std::size_t i) {
    return static_cast<float>(std::sin(static_cast<double>(i * 31 + r * 17)) * std::pow(10.0, (r * 3 + i) % 9 - 4));
  };
  std::vector<float> serial(count);
  for (std::size_t i = 0; i < count; ++i) {
    float s = v(0, i);
    for (int r = 1; r < n; ++r) s += v(r, i);
    serial[i] = s;
  }
  InprocCommunicator comm(n);
  for (int run = 0; run < 5; ++run) {
    std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) bufs[r][i] = v(r, i);
    ASSERT_EQ(run_ranks(n, [&](int r) { comm.all_reduce_sum(r, bufs[r].data(), count); }), "");
    for (int r = 0; r < n; ++r) ASSERT_EQ(std::memcmp(bufs[r].data(), serial.data(), count * sizeof(float)), 0);
  }
}

TEST(Barrier, NoRankPassesEarly) {
  const int n = 6;
  InprocCommunicator comm(n);
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  ASSERT_EQ(run_ranks(n,
                      [&](int r) {
                        for (int phase = 1; phase <= 100; ++phase) {
                          if (r == phase % n) std::this_thread::yield();
                          arrived.fetch_add(1);
                          comm.barrier(r);
                          if (arrived.load() < phase * n) early = true;
                          comm.barrier(r);
                        }
                      }),
            "");
  EXPECT_FALSE(early.load());
  EXPECT_EQ(arrived.load(), 100 * n);
}

TEST(Errors, CountMismatchThrowsOnEveryRank) {
  InprocCommunicator comm(3);
  std::atomic<int> throws{0};
  std::vector<float> buf(3 * 10);
  run_ranks(3, [&](int r) {
    try {
      comm.all_reduce_sum(r, buf.data() + r * 10, r == 2 ? 9 : 10);
    } catch (const ftp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ranks disagree on count"), std::string::npos);
      throws++;
    }
  });
  EXPECT_EQ(throws.load(), 3);
  // The communicator is still usable after a rejected call.
  ASSERT_EQ(run_ranks(3, [&](int r) { comm.all_reduce_sum(r, buf.data() + r * 10, 10); }), "");
}

TEST(Errors, BadArgumentsAndAbort) {
  EXPECT_THROW(InprocCommunicator(0), ftp::InputError);
  InprocCommunicator comm(2);
  float x = 0;
  EXPECT_THROW(comm.all_reduce_sum(2, &x, 1), ftp::InputError);
  EXPECT_THROW(comm.broadcast(0, 5, &x, 1), ftp::InputError);
  // Rank 0 waits in a barrier that rank 1 never reaches: abort wakes it.
  std::string err;
  std::thread waiter([&] {
    try {
      comm.barrier(0);
    } catch (const ftp::Error& e) {
      err = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comm.abort();
  waiter.join();
  EXPECT_EQ(err, "inproc communicator aborted");
  EXPECT_TRUE(comm.aborted());
  EXPECT_THROW(comm.barrier(1), ftp::Error);
}

TEST(BusBandwidth, NcclTestsFormula) {
  EXPECT_DOUBLE_EQ(allreduce_busbw(10.0, 1), 0.0);
  EXPECT_DOUBLE_EQ(allreduce_busbw(10.0, 2), 10.0);
  EXPECT_DOUBLE_EQ(allreduce_busbw(10.0, 4), 15.0);
  EXPECT_DOUBLE_EQ(allreduce_busbw(8.0, 8), 14.0);
  AllReduceMeasurement m;
  m.n_ranks = 4;
  m.bytes = 1000000;
  m.iterations = 10;
  finish_allreduce_measurement(m, 0.01);  // 1 ms per all-reduce
  EXPECT_DOUBLE_EQ(m.time_us, 1000.0);
  EXPECT_DOUBLE_EQ(m.algbw_gb_s, 1.0);
  EXPECT_DOUBLE_EQ(m.busbw_gb_s, 1.5);
}

TEST(BusBandwidth, InprocMeasurement) {
  for (int n : {1, 2, 4}) {
    AllReduceMeasurement m = measure_inproc_allreduce(n, 1 << 20, true);
    EXPECT_EQ(m.n_ranks, n);
    EXPECT_EQ(m.bytes, std::size_t{1} << 20);
    EXPECT_GE(m.iterations, 3);
    EXPECT_GT(m.time_us, 0.0);
    EXPECT_GT(m.algbw_gb_s, 0.0);
    EXPECT_DOUBLE_EQ(m.busbw_gb_s, allreduce_busbw(m.algbw_gb_s, n));
  }
  EXPECT_THROW(measure_inproc_allreduce(0, 1024, true), ftp::InputError);
  EXPECT_THROW(measure_inproc_allreduce(2, 2, true), ftp::InputError);
}

TEST(Nccl, WithoutGpuItIsABackendErrorNotACrash) {
  if (!nccl_available()) {
    EXPECT_THROW(measure_nccl_allreduce({0, 1}, 1 << 20, true), ftp::BackendError);
    return;
  }
  EXPECT_THROW(measure_nccl_allreduce({}, 1 << 20, true), ftp::InputError);
  // Built with NCCL: a device that does not exist is a backend error.
  EXPECT_THROW(measure_nccl_allreduce({1000}, 1 << 20, true), ftp::BackendError);
}
