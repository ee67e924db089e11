// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "control/clock.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "engine/domain.hpp"
#include "engine/engine.hpp"
#include "model/model.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"

/// The simulated engine (ARCHITECTURE.md, "Engine"): the forward pass of a
/// domain in the time the cost model gives, without weights, so a 70 B model
/// on a described cluster runs behind the same scheduler as the real engine.
namespace ftp::sim {

/// How the simulated engine lets its time pass.
enum class Pacing {
  /// Time is a number: each forward adds its cost-model time at once (tests,
  /// benchmarks, replays: hours in seconds, deterministic).
  virtual_time,
  /// Each forward returns only when its cost-model time has passed on the
  /// steady clock (it waits: sleeps, and spins the last 200 us, since a
  /// sleep overshoots by about as much as a small model's step), so a daemon
  /// in real time serves at the speed of the simulated cluster. The only way
  /// a simulated engine can look like a real one to clients that measure time.
  wait_real_time,
};

struct SimulatedEngineOptions {
  plan::ModelShape shape;
  /// The domain's stages in pipeline order: layers (span), the speed of
  /// their tensor-parallel group, the link to the next stage.
  std::vector<plan::ReplicaStage> stages;
  plan::Calibration calibration;
  int kv_blocks = 256;
  int block_tokens = 16;
  /// Tokens the simulated stream picks from; empty: every id but `avoid`.
  std::vector<int> token_ids;
  std::vector<int> avoid;       ///< e.g. BOS, EOS and control tokens: never produced
  std::uint64_t seed = 0;
  Pacing pacing = Pacing::virtual_time;
  /// With virtual_time: also moved forward by each forward's time (whole
  /// milliseconds; the remainder is carried). May be null.
  control::VirtualClock* clock = nullptr;
};

/// engine::Engine in simulated time. A forward's chunks are split into
/// micro-batches as the real engine splits them, each micro-batch costs
/// plan::step_time_s on each stage (tokens, attention pairs, KV positions
/// read, logits rows), and the stages run the same tick schedule as the real
/// pipeline: sum over ticks of the slowest active (stage, micro-batch), plus
/// the send to the next stage. Logits are a deterministic stand-in: -inf but
/// for one token (logit 0) chosen from the chunk's last token, its position
/// and the seed (the simulated token stream), so decoding is reproducible at
/// any temperature, sampling costs a scan of the row, and EOS never comes
/// unless it is in token_ids.
class SimulatedEngine final : public engine::Engine {
 public:
  /// Throws InputError naming the field when the options cannot describe a
  /// domain (no stages, layers that do not add up, a stage without speeds).
  explicit SimulatedEngine(SimulatedEngineOptions options);

  const model::HParams& hparams() const override { return hp_; }
  int block_tokens() const override { return o_.block_tokens; }
  std::uint64_t kv_bytes() const override;
  std::vector<std::vector<float>> forward(const std::vector<engine::SeqChunk>& chunks, int micro_batches) override;
  /// forward's step and times, with each row's one finite token returned as
  /// is: what choose_token picks from forward's row for any choice, without
  /// the n_vocab floats (a simulated 128k vocabulary at batch 64 is 33 MB a
  /// step).
  std::vector<int> forward_choose(const std::vector<engine::SeqChunk>& chunks, int micro_batches,
                                  const std::vector<engine::TokenChoice>& choices) override;
  const std::vector<double>& stage_busy_s() const override { return busy_; }

  /// Seconds of the given forward (what forward would take), without running it.
  double forward_time_s(const std::vector<engine::SeqChunk>& chunks, int micro_batches) const;
 private:
  /// The step of forward and forward_choose: times it, lets the time pass;
  /// returns the next token of each chunk that wants logits, and with
  /// `logits` their stand-in rows (made before the pacing's wait).
  std::vector<int> run_step(const std::vector<engine::SeqChunk>& chunks, int micro_batches,
                            std::vector<std::vector<float>>* logits);

 public:
  /// Simulated seconds since construction: the sum of forwards' times and of
  /// idle time added by advance_idle_to.
  double now_s() const noexcept { return now_s_; }
  /// With virtual_time: lets simulated time pass while the domain is idle,
  /// up to `t_s` (no-op when already later).
  void advance_idle_to(double t_s);
  /// The token the stand-in logits choose after `last` at `position`.
  int next_token(int last, int position) const;

 private:
  void pass(double dt_s);
  /// Seconds of a forward of these micro-batches on the pipeline; fills each
  /// stage's busy seconds when `busy` is given.
  double schedule_s(const std::vector<plan::StepWork>& work, std::vector<double>* busy) const;
  SimulatedEngineOptions o_;
  model::HParams hp_;
  std::vector<double> busy_;
  std::vector<plan::StepWork> work_;  // run_step's micro-batches, kept from step to step
  std::vector<int> work_index_;
  std::vector<int> ids_;
  double now_s_ = 0, clock_carry_ms_ = 0;
};

/// Llama hyper-parameters of a model shape (for the scheduler and the API).
model::HParams hparams_of(const plan::ModelShape& shape);

/// The byte-level stand-in tokenizer of a model without a vocabulary (a
/// model-shape JSON): ids 0..2 are <unk>, <s>, </s>; ids 3..258 the 256
/// bytes (SentencePiece byte tokens <0x00>..<0xFF>, so any text encodes
/// byte by byte and decodes back); id 259 the space ("\u2581", as
/// SentencePiece writes it); ids above are unused <sim-N> tokens. Needs
/// n_vocab >= 260.
model::TokenizerData sim_byte_tokenizer(int n_vocab);

/// Reads a topology for the simulated engine: a ftp.topology/v1 (ftp-probe)
/// or a ftp.cluster/v1 cluster spec, told apart by "kind". Errors name the file.
doc::Topology read_topology(const std::string& path);

/// The cost-model stages of one domain: its layer ranges (from `config`),
/// each stage's tensor-parallel group from the devices named in `replica`
/// (plan::group_perf), the link to the next stage. Throws InputError when a
/// device is unknown or lacks the speeds the cost model needs
/// ("topology: device gpu3: gemm_tflop_s is 0; the simulated engine needs ...").
std::vector<plan::ReplicaStage> replica_stages(const plan::ModelShape& shape, const doc::Topology& topo,
                                               const doc::Replica& replica, const engine::DomainConfig& config);

/// The same stages on virtual devices that all have `perf` (the fidelity
/// benchmark: one calibrated CPU device per rank).
std::vector<plan::ReplicaStage> uniform_stages(const plan::ModelShape& shape, const engine::DomainConfig& config,
                                               const plan::GroupPerf& perf);

/// The work of each micro-batch of a forward, in the real engine's split.
std::vector<plan::StepWork> micro_batch_work(const std::vector<engine::SeqChunk>& chunks, int micro_batches);
/// The same into `out`, with `index` as scratch: both keep their storage
/// (a simulated step allocates none).
void micro_batch_work(const std::vector<engine::SeqChunk>& chunks, int micro_batches, std::vector<plan::StepWork>& out,
                      std::vector<int>& index);

}  // namespace ftp::sim
