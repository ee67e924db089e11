// SPDX-License-Identifier: Apache-2.0
#pragma once

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
/// the resident weights, with a paged KV cache per rank and the inproc
/// communicator for the all-reduces of each stage. Micro-batches are
/// pipelined: at tick t stage s runs micro-batch t - s, all stages at once.
class Executor final : public Engine {
 public:
  Executor(const WeightStore& weights, std::vector<StageLayout> stages, int n_kv_blocks, int block_tokens);
  ~Executor() override;

  const model::HParams& hparams() const override { return hp_; }
  int block_tokens() const override { return block_tokens_; }
  const std::vector<StageLayout>& stages() const noexcept { return stages_; }
  /// Bytes of KV storage over all ranks.
  std::uint64_t kv_bytes() const override;

  /// Forward over chunks, split into `micro_batches` groups of sequences.
  /// Returns logits [n_vocab] for each chunk with want_logits, in order.
  std::vector<std::vector<float>> forward(const std::vector<SeqChunk>& chunks, int micro_batches = 1) override;

  /// Busy seconds of each stage in the last forward (for the bubble ratio).
  const std::vector<double>& stage_busy_s() const override { return stage_busy_s_; }

 private:
  struct Rank {
    std::vector<RankLayerView> layers;   // views of the stage's layers
    std::unique_ptr<KvStore> kv;
    std::unique_ptr<RankThread> thread;
    backend::VirtualDevice* device = nullptr;  // KV bytes reserved on it, released by ~Executor
  };
  struct Stage {
    StageLayout layout;
    std::vector<Rank> ranks;
    std::unique_ptr<comm::InprocCommunicator> comm;
  };
  struct MicroBatch {
    std::vector<const SeqChunk*> chunks;
    std::vector<float> x;                // [tokens][n_embd], handed from stage to stage
    int n_tokens = 0;
  };

  void run_stage_rank(Stage& st, int rank, MicroBatch& mb, std::vector<float>& x_out, bool last);
  void final_logits(MicroBatch& mb, const std::vector<float>& x, std::vector<std::vector<float>>& out,
                    const std::vector<int>& out_index);

  const WeightStore& w_;
  model::HParams hp_;
  std::vector<StageLayout> stages_;
  std::vector<Stage> st_;
  int block_tokens_;
  std::vector<double> stage_busy_s_;
};

}  // namespace ftp::engine
