// SPDX-License-Identifier: Apache-2.0
#include "comm/running_ranks.hpp"

#include <atomic>

namespace ftp::comm {
namespace {
std::atomic<int> g_running{0};
}  // namespace

StepRanks::StepRanks(int collective_ranks) noexcept : ranks_(collective_ranks) {
  g_running.fetch_add(ranks_, std::memory_order_relaxed);
}

StepRanks::~StepRanks() { g_running.fetch_sub(ranks_, std::memory_order_relaxed); }

int running_ranks() noexcept { return g_running.load(std::memory_order_relaxed); }

}  // namespace ftp::comm
