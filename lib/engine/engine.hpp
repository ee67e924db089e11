// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hardware/cpu/virtual_device.hpp"
#include "engine/kv_cache.hpp"
#include "engine/sampler.hpp"
#include "model/model.hpp"

namespace ftp::engine {

/// One pipeline stage of a domain: a contiguous layer range run by `tp`
/// tensor-parallel ranks, each on its own thread (a CPU virtual device).
struct StageLayout {
  StageLayout() = default;
  StageLayout(int first, int n, int tp_, std::vector<hardware::VirtualDevice*> devices_ = {}, std::vector<int> gpus_ = {})
      : first_layer(first), n_layers(n), tp(tp_), devices(std::move(devices_)), gpus(std::move(gpus_)) {}

  int first_layer = 0;
  int n_layers = 0;
  int tp = 1;
  /// The virtual device of each rank (tp of them), or empty: then the ranks
  /// run unpinned and nothing is accounted. With devices, each rank's thread
  /// is pinned to its device's CPUs and its KV pages are reserved against
  /// the device's memory budget (an OutOfDeviceMemory error names it).
  std::vector<hardware::VirtualDevice*> devices;
  /// CUDA backend: the device ordinal of each rank (tp of them), or empty:
  /// every rank on device 0 (several ranks on one GPU).
  std::vector<int> gpus;
  /// The element type of the stage's KV pages (default: 16 bits in the
  /// model's compute type, resolve_kv_dtype).
  KvDtype kv_dtype = KvDtype::automatic;
  /// CPU backend: threads of each rank's operations (its rank thread and
  /// rank_threads - 1 helpers over which its matrix products are split by
  /// rows). 0: automatic -- the CPUs of the rank's virtual device over the
  /// domain's ranks on that device, at least 1; one thread for a rank
  /// without a device (resolve_rank_threads).
  int rank_threads = 0;
};

/// One sequence's share of a forward pass: `tokens` at positions
/// start_pos.. of the sequence whose KV pages are `blocks`.
struct SeqChunk {
  const std::vector<int>* blocks = nullptr;
  int start_pos = 0;
  std::vector<int> tokens;
  bool want_logits = false;   ///< logits of the chunk's last token
};

/// Checks the chunks of one forward: none empty, each with the KV pages its
/// positions need, token ids inside the vocabulary. Errors start with `who`.
void check_chunks(const std::vector<SeqChunk>& chunks, int n_vocab, int block_tokens, const std::string& who);

/// Checks forward_choose's choices: one per chunk that wants logits
/// (`rows`). Errors start with `who`.
void check_choices(std::size_t choices, std::size_t rows, const std::string& who);

/// The micro-batches of one forward: contiguous groups of chunks of about
/// equal token counts, at most `micro_batches` of them, none empty (a chunk
/// goes to the group whose share of the tokens holds its middle). The real
/// and the simulated engine split the same way.
std::vector<std::vector<const SeqChunk*>> split_micro_batches(const std::vector<SeqChunk>& chunks, int micro_batches);
/// The same split as the micro-batch of each chunk (0, 1, ... in order)
/// into `out`, whose storage is reused: for an engine that only sums over
/// each micro-batch, without a vector per group each step.
void micro_batch_indices(const std::vector<SeqChunk>& chunks, int micro_batches, std::vector<int>& out);

/// The forward pass of one domain. Two implementations sit behind it
/// (ARCHITECTURE.md, "Engine"): the real one (engine::Executor, the model's
/// math on a backend) and the simulated one, which returns the same results
/// in the time a cost model gives. The scheduler above it (engine::Domain:
/// continuous batching, chunked prefill, paged KV) cannot tell them apart.
class Engine {
 public:
  virtual ~Engine() = default;

  /// The model's shape (vocabulary, layers, heads, context).
  virtual const model::HParams& hparams() const = 0;
  /// Positions per KV page.
  virtual int block_tokens() const = 0;
  /// Bytes of KV storage over all ranks.
  virtual std::uint64_t kv_bytes() const = 0;

  /// Forward over chunks, split into `micro_batches` groups of sequences.
  /// Returns logits [n_vocab] for each chunk with want_logits, in order.
  /// Throws on a failure of the domain's devices (the caller fails the
  /// step's requests with the message).
  virtual std::vector<std::vector<float>> forward(const std::vector<SeqChunk>& chunks, int micro_batches) = 0;
  /// Gives a forward's logits back once read, for a later forward to fill
  /// instead of allocating afresh (a step of batch 64 over a 128k
  /// vocabulary returns 33 MB; new pages for it cost more than the GPU's
  /// step). Optional; the default drops them.
  virtual void recycle(std::vector<std::vector<float>>&& logits) { logits.clear(); }

  /// Forward, then the next token of each chunk with want_logits, chosen
  /// by choices[i] (one per such chunk, in order) as choose_token does;
  /// only the ids come back. An engine whose logits stay on its devices
  /// chooses there (the CUDA backend: argmax or top-p kernels), instead of
  /// sending n_vocab floats per row to the host. Default: forward() and
  /// choose_token here.
  virtual std::vector<int> forward_choose(const std::vector<SeqChunk>& chunks, int micro_batches,
                                          const std::vector<TokenChoice>& choices);

  /// forward_choose, and for each row whose choices[i].logprobs >= 0 its
  /// log-probabilities (token_logprobs of its raw logits), computed where
  /// the logits are; `logprobs` gets one entry per row (empty for a row
  /// that asked none). Default: forward(), choose_token and token_logprobs
  /// here.
  virtual std::vector<int> forward_choose_logprobs(const std::vector<SeqChunk>& chunks, int micro_batches,
                                                   const std::vector<TokenChoice>& choices,
                                                   std::vector<TokenLogprobs>& logprobs);

  /// Busy seconds of each pipeline stage in the last forward (for the
  /// bubble ratio).
  virtual const std::vector<double>& stage_busy_s() const = 0;

  /// Runs the rest of this engine's steps at a lower CPU priority: a domain
  /// that drains on CPUs it shares with the domain replacing it finishes
  /// its requests without holding up the new domain's first tokens. Not
  /// undone (a draining domain only retires). Default: nothing to do.
  virtual void set_background() {}

  /// Why this engine cannot run another step (a failure it could not
  /// recover from, e.g. a rank's collectives gone), or empty while it can.
  /// A failed engine's domain takes no new requests and fails the ones it
  /// has; the daemon serves on with its other domains.
  virtual std::string failure() const { return {}; }
};

}  // namespace ftp::engine
