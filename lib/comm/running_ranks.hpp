// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace ftp::comm {

/// Counts the ranks of one forward step as running while it lives.
///
/// The in-process communicator lets a waiting rank spin only while the
/// ranks that may be waiting can each have a CPU (running_ranks() against
/// the CPUs): the ranks of the steps running now. A domain that exists but
/// is idle -- a shadow domain before its ramp, a drained one -- does not
/// count, so the domain that serves keeps spinning; two domains stepping at
/// once (a shift's ramp) count together.
class StepRanks {
 public:
  /// `collective_ranks`: ranks of the step that take part in collectives
  /// (those of stages of more than one rank).
  explicit StepRanks(int collective_ranks) noexcept;
  ~StepRanks();
  StepRanks(const StepRanks&) = delete;
  StepRanks& operator=(const StepRanks&) = delete;

 private:
  int ranks_;
};

/// Collective ranks of the steps running now, in this process.
int running_ranks() noexcept;

}  // namespace ftp::comm
