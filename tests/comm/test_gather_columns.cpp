// SPDX-License-Identifier: Apache-2.0
// Collective::gather_columns (the vocabulary-parallel head's gather into
// rank 0's full rows) on InprocCommunicator and on GlooCommunicator, whose
// ranks here are threads of this process, each with its own communicator
// as if it were a process of its own (loopback TCP): uneven widths, a rank
// of width 0, one row, repeated calls, ranks that disagree, and abort.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo.hpp"
#include "comm/inproc.hpp"
#include "core/error.hpp"

namespace {

using ftp::comm::Collective;

/// The ranks of one stage: comm(r) is rank r's communicator.
struct Stage {
  std::vector<std::shared_ptr<Collective>> per_rank;
  Collective& comm(int r) { return *per_rank[static_cast<std::size_t>(r)]; }
};

enum class Kind { inproc, gloo };

std::atomic<int> g_prefix{0};

Stage make_stage(Kind kind, int n, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  Stage s;
  if (kind == Kind::inproc) {
    auto c = std::make_shared<ftp::comm::InprocCommunicator>(n);
    s.per_rank.assign(static_cast<std::size_t>(n), c);
    return s;
  }
  // One GlooCommunicator per rank, connected concurrently (as processes would).
  static ftp::comm::LocalStore store;
  const std::string prefix = "gather" + std::to_string(g_prefix++);
  s.per_rank.resize(static_cast<std::size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      s.per_rank[static_cast<std::size_t>(r)] = std::make_shared<ftp::comm::GlooCommunicator>(
          store, prefix, n, std::vector<int>{r}, ftp::comm::GlooOptions{"127.0.0.1", timeout});
    });
  for (auto& t : th) t.join();
  return s;
}

/// Runs fn(rank) on n threads; the error message of each rank ("" if none).
std::vector<std::string> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

// Rank r's element (row, c) of its slice in call `call`: distinct for
// every rank, row, column and call, and exact in float32.
float element(int call, int rank, std::size_t row, std::size_t c) {
  return static_cast<float>(call * 100000 + rank * 10000 + static_cast<int>(row) * 100 + static_cast<int>(c));
}

/// Gathers `calls` times over a fresh stage of widths.size() ranks and
/// checks rank 0's full rows element by element: column j of a row is
/// rank r's column j - (widths of the ranks before r). Rank 0's rows start
/// as -1 so that a column nobody wrote shows.
void expect_gathered(Kind kind, const std::vector<std::size_t>& widths, std::size_t rows, int calls = 3) {
  const int n = static_cast<int>(widths.size());
  const std::size_t ld = std::accumulate(widths.begin(), widths.end(), std::size_t{0});
  Stage st = make_stage(kind, n);
  std::vector<float> full;
  std::string wrong;  // rank 0's first wrong element (the ranks go on: none waits for a rank that stopped)
  const auto errors = run_ranks(n, [&](int r) {
    for (int call = 0; call < calls; ++call) {
      const std::size_t w = widths[static_cast<std::size_t>(r)];
      std::vector<float> slice(rows * w);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t c = 0; c < w; ++c) slice[i * w + c] = element(call, r, i, c);
      if (r == 0) full.assign(rows * ld, -1.0f);
      st.comm(r).gather_columns(r, slice.data(), rows, widths, r == 0 ? full.data() : nullptr);
      if (r != 0) continue;
      std::size_t col = 0;
      for (int owner = 0; owner < n; ++owner)
        for (std::size_t c = 0; c < widths[static_cast<std::size_t>(owner)]; ++c, ++col)
          for (std::size_t i = 0; i < rows; ++i)
            if (wrong.empty() && full[i * ld + col] != element(call, owner, i, c))
              wrong = "call " + std::to_string(call) + " row " + std::to_string(i) + " column " + std::to_string(col) +
                      " (rank " + std::to_string(owner) + "'s " + std::to_string(c) + "): " +
                      std::to_string(full[i * ld + col]) + ", want " + std::to_string(element(call, owner, i, c));
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(wrong, "");
}

class GatherColumns : public ::testing::TestWithParam<Kind> {};

TEST_P(GatherColumns, UnevenWidthsLandInTheirColumns) {
  expect_gathered(GetParam(), {3, 5, 2}, 4);
  expect_gathered(GetParam(), {101, 100, 100, 100}, 3);  // a vocabulary of 401 at TP 4
}

TEST_P(GatherColumns, OneRowAndOneRank) {
  expect_gathered(GetParam(), {201, 200}, 1);  // a decode step of one sequence
  expect_gathered(GetParam(), {7}, 2);
}

TEST_P(GatherColumns, ARankOfWidthZeroSendsNothingAndTheOthersStillLand) {
  expect_gathered(GetParam(), {4, 0, 3}, 2);
  expect_gathered(GetParam(), {0, 6}, 3);
  expect_gathered(GetParam(), {2, 3, 0}, 1);
}

TEST_P(GatherColumns, RanksThatDisagreeOnRowsOrWidthsFail) {
  const Kind kind = GetParam();
  Stage st = make_stage(kind, 3);
  const std::vector<std::size_t> widths{2, 2, 2};
  std::vector<float> full(4 * 6), slices(3 * 8, 1.0f);
  // Rank 2 thinks there are 3 rows.
  auto errors = run_ranks(3, [&](int r) {
    st.comm(r).gather_columns(r, slices.data() + r * 8, r == 2 ? 3 : 4, widths, r == 0 ? full.data() : nullptr);
  });
  EXPECT_NE(errors[0].find("disagree"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 2"), std::string::npos) << errors[0];
  if (kind == Kind::inproc) {
    // Every rank learns it.
    EXPECT_NE(errors[1].find("disagree"), std::string::npos) << errors[1];
    EXPECT_NE(errors[2].find("disagree"), std::string::npos) << errors[2];
  }
  // Rank 1 thinks rank 1 has 3 columns (its widths differ from the others').
  errors = run_ranks(3, [&](int r) {
    const std::vector<std::size_t> mine = r == 1 ? std::vector<std::size_t>{2, 1, 2} : widths;
    st.comm(r).gather_columns(r, slices.data() + r * 8, 2, mine, r == 0 ? full.data() : nullptr);
  });
  EXPECT_NE(errors[0].find("disagree"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
  // Rejected calls leave the stage in step: a correct one gathers.
  errors = run_ranks(3, [&](int r) {
    std::vector<float> s(2 * 2, static_cast<float>(r + 1));
    st.comm(r).gather_columns(r, s.data(), 2, widths, r == 0 ? full.data() : nullptr);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(std::vector<float>(full.begin(), full.begin() + 12),
            (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
}

TEST_P(GatherColumns, AbortWakesRankZeroWaitingForAPeer) {
  Stage st = make_stage(GetParam(), 2, std::chrono::milliseconds(60000));
  const std::vector<std::size_t> widths{2, 2};
  std::vector<float> full(4), slice(2, 1.0f);
  std::string error;
  std::thread waiter([&] {
    try {
      st.comm(0).gather_columns(0, slice.data(), 1, widths, full.data());  // rank 1 never comes
    } catch (const ftp::Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  st.comm(0).abort();
  waiter.join();
  EXPECT_NE(error.find("aborted"), std::string::npos) << error;
  // Later calls fail at once.
  EXPECT_THROW(st.comm(0).gather_columns(0, slice.data(), 1, widths, full.data()), ftp::Error);
}

TEST_P(GatherColumns, AbortWakesAPeerWaitingForRankZero) {
  // Gloo: a send waits until its receive is posted, so rank 1 waits too.
  Stage st = make_stage(GetParam(), 2, std::chrono::milliseconds(60000));
  const std::vector<std::size_t> widths{1, 1};
  float slice = 1;
  std::string error;
  std::thread peer([&] {
    try {
      st.comm(1).gather_columns(1, &slice, 1, widths, nullptr);  // rank 0 never comes
    } catch (const ftp::Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  st.comm(1).abort();
  peer.join();
  EXPECT_NE(error.find("aborted"), std::string::npos) << error;
  // In one process the stage is usable again after reset; Gloo's is not.
  EXPECT_EQ(st.comm(1).reset(), GetParam() == Kind::inproc);
}

INSTANTIATE_TEST_SUITE_P(Communicators, GatherColumns, ::testing::Values(Kind::inproc, Kind::gloo),
                         [](const auto& info) { return info.param == Kind::inproc ? "Inproc" : "Gloo"; });

}  // namespace
