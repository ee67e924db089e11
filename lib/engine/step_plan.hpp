// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/collective.hpp"
#include "comm/gloo.hpp"
#include "engine/engine.hpp"
#include "engine/sampler.hpp"

namespace ftp::engine {

/// One step of a domain whose ranks span processes, as the leader sends it
/// to the domain's other processes (vLLM's and TensorRT-LLM's leader do the
/// same): the batch (token ids, positions, KV page tables), the pipeline's
/// micro-batches, and what comes back (logits, or chosen ids with the
/// choices). Every process derives the same BatchLayouts from it.
struct StepPlan {
  enum class Kind : std::int32_t { logits = 0, choose = 1, stop = 2 };
  Kind kind = Kind::logits;
  int micro_batches = 1;
  std::vector<SeqChunk> chunks;          ///< blocks point into `tables`
  std::vector<std::vector<int>> tables;  ///< the KV pages of each chunk
  std::vector<TokenChoice> choices;      ///< Kind::choose: one per chunk that wants logits
};

/// The plan of `chunks` (their page tables copied).
StepPlan make_step_plan(StepPlan::Kind kind, const std::vector<SeqChunk>& chunks, int micro_batches,
                        const std::vector<TokenChoice>& choices = {});
/// Bytes of a plan (int32 and float64 fields, host order: the processes of
/// one domain run one build of one program).
std::vector<char> encode_step_plan(const StepPlan& plan);
/// Throws ftp::InputError naming the field when `bytes` is not a plan.
StepPlan decode_step_plan(const std::vector<char>& bytes);

/// Where the ranks of a domain live when they span processes. The domain's
/// processes form one Gloo group (`group`, the leader is its rank 0); the
/// plan, the activations between stages (Gloo send/recv) and the results
/// travel in it. A stage whose ranks are in several processes meets in the
/// Collective that `stage_comm` makes for the ranks held here.
struct Placement {
  int self = 0;                                ///< this process's rank in `group`
  std::vector<std::vector<int>> owner;         ///< [stage][tp rank]: the group rank holding it
  std::shared_ptr<comm::GlooGroup> group;
  std::function<std::shared_ptr<comm::Collective>(int stage, const std::vector<int>& local_ranks)> stage_comm;
  /// Sends `plan` to every other process of the group (the leader).
  void send_plan(const StepPlan& plan) const;
  /// The leader's next plan (a worker), waiting up to `timeout`.
  StepPlan recv_plan(std::chrono::milliseconds timeout) const;
};

/// Message tags of a domain's group.
namespace step_tag {
constexpr std::uint32_t plan_size = 1u << 28, plan = 2u << 28;
inline std::uint32_t activations(int stage, int micro_batch) {
  return (3u << 28) | (static_cast<std::uint32_t>(stage) << 12) | static_cast<std::uint32_t>(micro_batch);
}
inline std::uint32_t results(int micro_batch) { return (4u << 28) | static_cast<std::uint32_t>(micro_batch); }
}  // namespace step_tag

}  // namespace ftp::engine
