// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/collective.hpp"
#include "engine/engine.hpp"
#include "engine/sampler.hpp"
#include "engine/weight_store.hpp"

/// The backend interface of the real engine (ARCHITECTURE.md, "Backend"):
/// what one tensor-parallel rank of one pipeline stage computes, on its
/// device. The executor (engine::Executor) arranges stages, ranks,
/// micro-batches and hand-offs and calls only this interface, so the
/// scheduler, the paged KV cache and the executor run unchanged on the CPU
/// backend (virtual devices, BLAS, lib/engine/ops) and on the CUDA backend
/// (lib/engine/cuda: kernels/, cuBLAS, NCCL).
namespace ftp::engine {

/// The rows of one micro-batch as the attention and the KV cache see them,
/// laid out on the host by the executor; a backend stages it on its device
/// with RankBackend::set_batch. Row r is a token of sequence seq[r] at
/// position pos[r]; it attends positions 0..pos[r] of its sequence.
struct BatchLayout {
  int n_rows = 0;
  std::vector<int> tokens;       ///< [n_rows] token ids (embedded on the first stage)
  std::vector<int> pos;          ///< [n_rows] position of each row in its sequence
  std::vector<int> seq;          ///< [n_rows] sequence of each row, index into the block table
  std::vector<int> slot;         ///< [n_rows] KV slot of each row: page x block_tokens + pos % block_tokens
  int n_seq = 0;
  int max_blocks = 0;            ///< columns of block_table
  std::vector<int> block_table;  ///< [n_seq][max_blocks] KV pages of each sequence, -1 past its end
  int max_pos = 0;               ///< 1 + the largest position (scratch for scores)
  bool decode_only = false;      ///< every sequence has one row (a decode step)
  std::vector<int> logit_rows;   ///< rows whose logits the last stage returns, in order
};

/// Fills a BatchLayout from the chunks of one micro-batch.
BatchLayout make_batch_layout(const std::vector<const SeqChunk*>& chunks, int block_tokens);

/// What a rank needs to know about its place in the domain.
struct RankSpec {
  int stage = 0;                 ///< pipeline stage
  int rank = 0;                  ///< tensor-parallel rank within the stage
  int tp = 1;
  int first_layer = 0, n_layers = 0;
  bool first_stage = false, last_stage = false;
  int kv_blocks = 0;             ///< KV pages of the domain
  int block_tokens = 16;         ///< positions per page
  int max_rows = 256;            ///< rows (tokens) of the largest micro-batch expected; buffers grow past it
  KvDtype kv_dtype = KvDtype::automatic;  ///< the KV pages' element type (the backend resolves automatic)
  hardware::VirtualDevice* device = nullptr;  ///< CPU: the virtual device (pinning, accounting); may be null
  int threads = 1;               ///< CPU: threads of the rank's operations (resolve_rank_threads)
  int gpu = -1;                  ///< CUDA: device ordinal; -1: the backend's default (0)
};

/// The threads of each rank of each stage of a domain laid out as `stages`
/// on the CPU backend ([stage][rank]): a stage's rank_threads where it is
/// set, else the CPUs of the rank's virtual device divided by the ranks of
/// the domain on that device, at least 1, and 1 for a rank without a
/// device (nothing says which CPUs are its own: tests, `generate`, and
/// domains beside each other in one process would oversubscribe them). So a TP 1 domain on a device of two CPUs splits its products
/// over both, and the ranks of a TP 2 domain on two one-CPU devices keep
/// one thread each: the domain never runs more threads than its CPUs.
std::vector<std::vector<int>> resolve_rank_threads(const std::vector<StageLayout>& stages);

/// The specs of the tp ranks of stage `stage` of `n_stages` laid out as `l`
/// (devices and GPUs from it where given); what Executor makes its stages
/// from and what Backend::kv_room_bytes is asked about. `threads`: each
/// rank's (resolve_rank_threads; empty: 1).
std::vector<RankSpec> stage_rank_specs(const StageLayout& l, int stage, int n_stages, int kv_blocks, int block_tokens,
                                       int max_rows, const std::vector<int>& threads = {});

/// Named scratch buffers of a rank (float32 activations on its device).
/// logits: the full rows (rank 0 of the last stage only at tp > 1);
/// logits_part: a rank's vocabulary slice; logits_gather: what a device
/// backend's rank 0 receives before it places it (NCCL, several rows).
enum class Buf : int { x, xn, q, k, v, att, part, gate, up, logits_in, logits, logits_part, logits_gather, count };

/// One rank's compute on its device. All calls of one rank come from one
/// thread (its rank thread), in order; calls of different ranks of a stage
/// run concurrently and meet in all_reduce. Device pointers come only from
/// buffer(); weight pointers and views are those of the WeightStore (host
/// addresses: a device backend translates them to its resident copy).
class RankBackend {
 public:
  virtual ~RankBackend() = default;

  /// Called once on the rank's thread before any other call: pins the
  /// thread to the virtual device's CPUs, or selects the CUDA device.
  virtual void bind_thread() = 0;
  /// Called on the rank's thread when it lowers its own priority (a
  /// draining domain): threads the rank runs besides its own (the CPU
  /// backend's IntraOpPool helpers) lower theirs by `delta` too.
  virtual void lower_helpers_priority(int delta) { (void)delta; }
  /// Bytes of this rank's KV pages (reserved on its device).
  virtual std::uint64_t kv_bytes() const = 0;

  /// A buffer of at least n floats on the device, kept between calls; its
  /// address changes only when it has to grow.
  virtual float* buffer(Buf id, std::size_t n) = 0;
  /// Stages the micro-batch's layout for the calls that follow.
  virtual void set_batch(const BatchLayout& b) = 0;
  /// Host -> device and device -> host copies of n floats; download
  /// returns when the data is on the host (it waits for earlier work).
  virtual void upload(const float* host, float* dev, std::size_t n) = 0;
  virtual void download(const float* dev, float* host, std::size_t n) = 0;
  /// n_rows rows of row_len floats, contiguous from `dev`, to the host
  /// rows dst[i] (the logits of a step straight into the vectors the
  /// engine returns); returns when they are there. Default: a download each.
  virtual void download_rows(const float* dev, std::size_t row_len, float* const* dst, std::size_t n_rows) {
    for (std::size_t i = 0; i < n_rows; ++i) download(dev + i * row_len, dst[i], row_len);
  }
  /// out[i] = choose_token(row i of n_rows rows of n_vocab logits at
  /// `logits`, choices[i]) (engine/sampler.hpp); returns when the ids are
  /// on the host. With `lp`, lp[i] = token_logprobs(row i, out[i],
  /// choices[i].logprobs) for each row whose choices[i].logprobs >= 0 (the
  /// others are left as they are). Default: each row downloaded and chosen
  /// on the host.
  virtual void choose_tokens(const float* logits, std::size_t n_vocab, std::size_t n_rows, const TokenChoice* choices,
                             int* out, TokenLogprobs* lp = nullptr) {
    std::vector<float> row(n_vocab);
    for (std::size_t i = 0; i < n_rows; ++i) {
      download(logits + i * n_vocab, row.data(), n_vocab);
      out[i] = choose_token(row.data(), n_vocab, choices[i]);
      if (lp && choices[i].logprobs >= 0) lp[i] = token_logprobs(row.data(), n_vocab, out[i], choices[i].logprobs);
    }
  }

  /// x[r] = token embedding of batch row r, as float32 (first stage), from
  /// the rank's vocabulary rows (WeightStore::embedding): zeros for a token
  /// outside them, so that the stage's all-reduce gives every rank the
  /// embedding exactly (each row one nonzero term).
  virtual void embed(float* x) = 0;
  /// The vocabulary-parallel head's gather (comm::Collective::gather_columns,
  /// every rank of the stage calls it in order): rank r's `slice`, `rows`
  /// rows of widths[r] logits, goes to columns [sum(widths[0, r)), +
  /// widths[r]) of rank 0's `full` rows of sum(widths); the other ranks
  /// pass full = null and hold no full rows. At tp 1 a copy of the slice
  /// into `full`. Copies only: bit-exact.
  virtual void gather_columns(const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                              float* full) = 0;
  /// out[r] = rmsnorm(x[r]) * w, for every batch row, rows of n_embd.
  virtual void rmsnorm(const float* x, const float* w, float* out, int rows) = 0;
  /// out[rows][w.rows] = x[rows][w.cols] . W^T (ops::matmul's contract).
  virtual void matmul(const float* x, const MatView& w, float* out, int rows) = 0;
  /// x[r][i] += b[i] for every batch row r and i < b.n (rows of b.n).
  virtual void add_bias(float* x, const VecView& b) = 0;
  /// In place, every head of every batch row (rows of n_heads x head_dim):
  /// RMSNorm over its head_dim values (eps rms_eps) times w[head_dim]
  /// (qwen3's per-head q and k norms).
  virtual void head_rmsnorm(float* v, const float* w, int n_heads) = 0;
  /// Rotary embedding of every batch row at its position: `v` holds rows of
  /// n_heads x head_dim; the model's RoPE type and frequency factors
  /// (WeightStore::rope_freqs), as ops::rope.
  virtual void rope(float* v, int n_heads) = 0;
  /// Writes the batch rows' K and V (rows of kv_heads x head_dim) into the
  /// pages of `layer` (index within the stage) at their slots.
  virtual void kv_write(int layer, const float* k, const float* v) = 0;
  /// Causal attention of every batch row over its sequence's pages of
  /// `layer`: q and out are rows of n_q_heads x head_dim; query head h of
  /// this rank is global head q_head0 + h and reads global KV head
  /// (q_head0 + h) / group, stored at local index that - kv_head0.
  virtual void attention(int layer, const float* q, float* out, int n_q_heads, int q_head0, int kv_head0) = 0;
  /// g[i] = silu(g[i]) * u[i].
  virtual void silu_mul(float* g, const float* u, std::size_t n) = 0;
  /// x[i] = 0 for i < n.
  virtual void zero(float* x, std::size_t n) = 0;
  /// x[i] += y[i].
  virtual void add(float* x, const float* y, std::size_t n) = 0;
  /// Sum over the stage's ranks, in place (every rank calls it in order).
  virtual void all_reduce(float* x, std::size_t n) = 0;
  /// out[i] = x[logit_rows[i]] for the batch's logit rows (rows of n_embd).
  virtual void gather_logit_rows(const float* x, float* out) = 0;
  /// Wakes ranks waiting in all_reduce or gather_columns with an error (a peer failed).
  virtual void abort() noexcept = 0;
  /// After abort(), once every rank of the stage has returned from its
  /// task: makes the stage's collectives usable again and returns true, or
  /// returns false where the backend cannot (an aborted NCCL communicator
  /// is gone), and the domain cannot run again. Default: cannot.
  virtual bool recover() noexcept { return false; }

  /// Runs `ops`, a sequence of the calls above that reads nothing back to
  /// the host. `graph_key` >= 0 names a replayable shape (a decode batch of
  /// that many rows): a backend with graphs (CUDA) may capture `ops` once and
  /// replay it for later calls with the same key. The CPU runs `ops`.
  virtual void run(int graph_key, const std::function<void()>& ops) {
    (void)graph_key;
    ops();
  }
  /// Waits for the rank's queued work (device backends).
  virtual void sync() {}
};

/// What a backend's communicator pool has made so far.
struct CommunicatorStats {
  std::uint64_t created = 0;  ///< communicators made (ahead or on demand)
  double create_ms = 0;       ///< wall time spent making them, ms
};

/// Makes the ranks of a stage, with the communicator they share.
class Backend {
 public:
  virtual ~Backend() = default;
  /// "cpu" or "cuda".
  virtual std::string name() const = 0;
  /// The tp ranks of one stage (specs[r].rank == r), sharing one
  /// communicator; KV pages are allocated (and reserved on the device).
  virtual std::vector<std::unique_ptr<RankBackend>> make_stage(const WeightStore& weights,
                                                               const std::vector<RankSpec>& specs) = 0;
  /// Some ranks of a stage whose other ranks run in other processes
  /// (specs[i].rank: each one's rank in the stage, specs[i].tp the stage's
  /// degree), meeting them through `comm` (comm::GlooCommunicator). Default:
  /// ftp::BackendError, the backend cannot split a stage across processes.
  virtual std::vector<std::unique_ptr<RankBackend>> make_stage_ranks(const WeightStore& weights,
                                                                     const std::vector<RankSpec>& specs,
                                                                     std::shared_ptr<comm::Collective> comm);
  /// For the ranks of a domain about to be made (every stage): bytes each
  /// rank's device has free for KV pages now, less the weights those ranks
  /// read that are not resident there yet, shared out evenly among the
  /// ranks on the same device; one value per rank, in order. Empty where the
  /// backend keeps no device memory of its own (the CPU backend: virtual
  /// devices are accounted by their owner).
  virtual std::vector<std::uint64_t> kv_room_bytes(const WeightStore& weights, const std::vector<RankSpec>& ranks) {
    (void)weights;
    (void)ranks;
    return {};
  }
  /// Device backends (CUDA): makes each device's resident weights the
  /// union of its shards over the gear table (`shards`: CUDA ordinal ->
  /// every rank it serves in any gear), before any domain is built, so
  /// that a shift takes views and copies nothing. Returns the bytes each
  /// device holds. Default (CPU: WeightStore::copy_to_device does it on
  /// virtual devices): nothing.
  virtual std::map<int, std::uint64_t> make_resident(const WeightStore& weights,
                                                     const std::map<int, std::vector<RankShard>>& shards) {
    (void)weights;
    (void)shards;
    return {};
  }
  /// Weight bytes the backend holds on each device now (the accounting a
  /// test compares with plan::device_memory); empty on the CPU backend.
  virtual std::map<int, std::uint64_t> resident_bytes(const WeightStore& weights) const {
    (void)weights;
    return {};
  }
  /// The communicator pool (ARCHITECTURE.md, resource pool): makes now the
  /// communicators of these stages (each the specs of one stage's ranks;
  /// only their device and gpu are read), one per time a device set appears,
  /// so that building their domains later makes none. A gear table's every
  /// stage at start, again on reload. Default: nothing.
  virtual void prepare_communicators(const std::vector<std::vector<RankSpec>>& stages) { (void)stages; }
  /// What the pool has made so far: a shift's warm phase adds nothing once
  /// pooled. Default: nothing made.
  virtual CommunicatorStats communicator_stats() const { return {}; }
  /// The devices the communicator pool spans now: the union of the devices
  /// of the stages last given to prepare_communicators (the table in
  /// force), sorted; the NCCL root communicator and its CUDA contexts live
  /// on these GPUs only ("cuda:K"), the CPU pool keeps communicators of
  /// these virtual devices only (their names). Default: none.
  virtual std::vector<std::string> communicator_devices() const { return {}; }
  /// Decode batch sizes (rows) that a domain's warm-up runs, so that its
  /// first real steps find everything made (Domain::warm_up): up to
  /// `max_running`, ascending. The CUDA backend's are the batch sizes it
  /// captures as CUDA graphs; by default the powers of two (CPU: buffers
  /// and helper threads sized and woken at each size).
  virtual std::vector<int> warm_batch_sizes(int max_running) const {
    std::vector<int> out;
    for (int b = 1; b > 0 && b <= max_running; b *= 2) out.push_back(b);
    return out;
  }
  /// CUDA graphs this backend's ranks have captured so far, in the whole
  /// process (0 where the backend has none): a warm-up's captures are the
  /// difference across it.
  virtual std::uint64_t graphs_captured() const { return 0; }
  /// GPU release mode: frees `device`'s resident weights (no domain on it
  /// may remain); returns the bytes freed. Default: 0.
  virtual std::uint64_t release_device(const WeightStore& weights, int device) {
    (void)weights;
    (void)device;
    return 0;
  }
};

/// The CPU backend (BLAS and lib/engine/ops on virtual devices), shared.
Backend& cpu_backend();

/// The CUDA backend (lib/engine/cuda), shared by every domain of the
/// process so that each device holds the weights once. Throws
/// ftp::BackendError saying why where it cannot run: a build without CUDA
/// (lib/engine/cuda_none.cpp), no GPU, a driver error.
Backend& cuda_backend();

/// "cpu" or "cuda"; anything else is an ftp::InputError naming the choices.
Backend& backend_named(const std::string& name);

}  // namespace ftp::engine
