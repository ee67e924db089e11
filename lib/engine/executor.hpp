// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "engine/engine.hpp"
#include "engine/kv_cache.hpp"
#include "engine/rank_backend.hpp"
#include "engine/step_plan.hpp"
#include "engine/weight_store.hpp"

namespace ftp::engine {

/// A thread that runs one task at a time (a rank of a stage).
class RankThread {
 public:
  RankThread();
  ~RankThread();
  RankThread(const RankThread&) = delete;
  RankThread& operator=(const RankThread&) = delete;
  void post(std::function<void()> task);
  /// Waits for the posted task; rethrows its exception.
  void wait();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

/// Runs the forward pass of one domain: pp stages of tp ranks over views of
/// the resident weights, each rank a RankBackend (its device, paged KV
/// cache, buffers, and the stage's communicator for the all-reduces) driven
/// by its own thread. Micro-batches are pipelined: at tick t stage s runs
/// micro-batch t - s, all stages at once.
class Executor final : public Engine {
 public:
  /// `backend`: where the ranks run; null: the CPU backend. `max_rows`: the
  /// largest micro-batch expected, in tokens (buffers are sized for it and
  /// grow past it).
  /// `placement`: the domain's ranks span processes (engine/step_plan.hpp);
  /// this executor makes only the ranks placed here (their devices from
  /// `stages`, null for the others). Null: every rank is here.
  Executor(const WeightStore& weights, std::vector<StageLayout> stages, int n_kv_blocks, int block_tokens,
           Backend* backend = nullptr, int max_rows = 256, std::shared_ptr<const Placement> placement = nullptr);
  ~Executor() override;

  const model::HParams& hparams() const override { return hp_; }
  int block_tokens() const override { return block_tokens_; }
  const std::vector<StageLayout>& stages() const noexcept { return stages_; }
  /// Bytes of KV storage over all ranks.
  std::uint64_t kv_bytes() const override;

  /// Forward over chunks, split into `micro_batches` groups of sequences.
  /// Returns logits [n_vocab] for each chunk with want_logits, in order.
  std::vector<std::vector<float>> forward(const std::vector<SeqChunk>& chunks, int micro_batches = 1) override;
  void recycle(std::vector<std::vector<float>>&& logits) override;
  /// forward() with the tokens chosen where the logits are
  /// (RankBackend::choose_tokens): the CUDA backend sends back ids only.
  std::vector<int> forward_choose(const std::vector<SeqChunk>& chunks, int micro_batches,
                                  const std::vector<TokenChoice>& choices) override;
  /// forward_choose with log-probabilities computed by the backend where
  /// the logits are (RankBackend::choose_tokens with `lp`).
  std::vector<int> forward_choose_logprobs(const std::vector<SeqChunk>& chunks, int micro_batches,
                                           const std::vector<TokenChoice>& choices,
                                           std::vector<TokenLogprobs>& logprobs) override;

  /// A worker's share of a step the leader planned (Placement::recv_plan):
  /// its ranks' part, the activations to the next stage's processes and,
  /// where it holds the last stage's rank 0, the results to the leader.
  void run_plan(const StepPlan& plan);

  /// Busy seconds of each stage in the last forward (for the bubble ratio).
  const std::vector<double>& stage_busy_s() const override { return stage_busy_s_; }

  /// Each rank thread lowers its own priority (nice + 10) before its next task.
  void set_background() override { background_ = true; }

  std::string failure() const override;

 private:
  struct Rank {
    int index = 0;                       // its rank in the stage
    std::vector<RankLayerView> layers;   // views of the stage's layers
    std::unique_ptr<RankBackend> be;     // its device, KV pages and buffers
    std::unique_ptr<RankThread> thread;
    bool background = false;             // its thread runs at the lower priority
  };
  struct Stage {
    StageLayout layout;
    std::vector<Rank> ranks;
    bool first = false, last = false;
    std::vector<std::size_t> vocab_widths;  // each rank's vocabulary rows (the head's gather)
  };
  struct MicroBatch {
    std::vector<const SeqChunk*> chunks;
    BatchLayout layout;
    std::vector<float> x;                // [tokens][n_embd] on the host, handed from stage to stage
    std::vector<float*> logits;          // [logit rows]: where the last stage puts each row's n_vocab logits
    const TokenChoice* choices = nullptr;  // or, with forward_choose: the rows' choices
    int* tokens = nullptr;                 // and where the chosen ids go
    TokenLogprobs* logprobs = nullptr;     // and, with forward_choose_logprobs, their log-probabilities
    int n_tokens = 0;
  };

  /// One rank's share of one stage for one micro-batch; rank 0 hands the
  /// activations (or, on the last stage, the logits) back to the host.
  void run_stage_rank(Stage& st, int rank, MicroBatch& mb);
  /// forward_choose and forward_choose_logprobs (`logprobs` null: none).
  std::vector<int> choose(const std::vector<SeqChunk>& chunks, int micro_batches, const std::vector<TokenChoice>& choices,
                          std::vector<TokenLogprobs>* logprobs);
  /// The pipeline over micro-batches (forward and forward_choose: their
  /// micro-batches say where the results go).
  void run_micro_batches(std::vector<MicroBatch>& mbs);
  /// With a placement: the pipeline, then the results of the micro-batches
  /// whose last stage ran elsewhere (the leader) or sent to the leader (a
  /// worker). A failure fails the engine: the group's messages are out of step.
  void run_placed(std::vector<MicroBatch>& mbs);
  /// Group rank holding stage s's rank r (this process without a placement).
  int owner(int s, int r) const { return placement_ ? placement_->owner[s][r] : 0; }
  int self() const { return placement_ ? placement_->self : 0; }
  std::vector<MicroBatch> plan_micro_batches(const std::vector<SeqChunk>& chunks, int micro_batches,
                                             std::size_t& logit_rows);

  const WeightStore& w_;
  model::HParams hp_;
  /// Logit rows given back by recycle() for the next forward; at most as
  /// many as the largest forward has returned.
  std::mutex spare_mu_;
  std::vector<std::vector<float>> spare_logits_;
  std::size_t most_logit_rows_ = 0;
  std::vector<StageLayout> stages_;
  std::vector<Stage> st_;
  int block_tokens_;
  std::vector<double> stage_busy_s_;
  int collective_ranks_ = 0;  // ranks of the stages of more than one rank
  mutable std::mutex failure_mu_;
  std::string failure_;       // set when a failed step's stage could not recover
  std::atomic<bool> background_{false};
  std::shared_ptr<const Placement> placement_;
};

}  // namespace ftp::engine
