// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.hpp"
#include "engine/engine.hpp"
#include "engine/executor.hpp"
#include "engine/group_ids.hpp"
#include "engine/sampler.hpp"
#include "engine/weight_store.hpp"

namespace ftp::engine {

/// The shape and limits of one domain (one running replica of a gear).
struct DomainConfig {
  std::string id = "d0";
  std::vector<StageLayout> stages{StageLayout{}};  ///< default: one stage, tp 1, filled in by the Domain
  int kv_blocks = 256;           ///< KV pages of the domain (the cap)
  int block_tokens = 16;         ///< positions per page
  int max_batched_tokens = 256;  ///< token budget of one step (chunked prefill)
  int max_running = 64;          ///< sequences in the running batch
  /// Fair scheduling: while more than one request group has work, one
  /// group (GenerationRequest::group) holds at most this share of the
  /// running batch (at least one sequence); alone, it may use all of it.
  double max_group_share = 0.5;
  int micro_batches = 1;         ///< pipeline micro-batches per step
  int max_context = 0;           ///< positions per sequence; 0: the model's trained context
  Backend* backend = nullptr;    ///< real engine: where its ranks run; null: the CPU backend
  /// Count the tokens still to prefill at the end of each step
  /// (Domain::queued_prompt_tokens), a pass over the waiting and running
  /// sequences. The engine replay turns it off: it keeps its own count from
  /// its request records, and the pass cost it about a third of its time.
  bool count_backlog = true;
};

/// Why a request ended. A string only at the JSON boundary (to_string).
enum class FinishReason {
  none,       ///< not finished
  stop,       ///< an end-of-generation token or the stop check
  length,     ///< max_tokens or the context
  cancelled,  ///< Domain::cancel: its client has gone
  error,      ///< the engine failed or the domain aborted it (GenerationEvent::error says why)
  /// Domain::withdraw_unstarted: given back before it ran, to be placed on
  /// another domain by whoever submitted it. Never reaches a client.
  withdrawn,
};
/// "" | "stop" | "length" | "cancelled" | "error" | "withdrawn".
std::string_view to_string(FinishReason r) noexcept;
inline std::ostream& operator<<(std::ostream& os, FinishReason r) { return os << to_string(r); }

/// Something that happened to a request, delivered on the domain's thread.
struct GenerationEvent {
  std::string request_id;
  std::string domain_id;
  int token = -1;                ///< the new token; -1 on a finish without one
  int index = 0;                 ///< its index in the output
  int choice = 0;                ///< which of the request's n choices (0..n-1)
  /// With GenerationRequest::logprobs >= 0: the new token's log-probability
  /// and the top ones (token_logprobs of the raw logits).
  std::optional<TokenLogprobs> logprobs;
  /// With GenerationRequest::prompt_logprobs, on the first token's event of
  /// each choice: entry j is prompt token j + 1's (chosen = that token; top
  /// as `logprobs` asks). The first prompt token has none.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::none;
  std::string error;             ///< with FinishReason::error: what went wrong
};

/// One completion to generate.
struct GenerationRequest {
  std::string id;
  /// The client request it belongs to (the prompts of one batched
  /// completion share it); the scheduler admits round robin across groups
  /// and caps one group's share of the batch. Empty: a group of its own (id).
  std::string group;
  std::vector<int> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  int eos = -1;                       ///< end-of-generation token; -1: none
  std::vector<int> stop_tokens;       ///< more tokens that end the generation
  /// Choices to generate from the prompt (each its own sequence and events).
  /// The prompt is computed once: the choices share its full KV pages, and
  /// each computes the rest of the prompt (less than a page) in a page of
  /// its own. Choice c samples with seed sampling.seed + c (mod 2^64), so
  /// its tokens are those of a request of n = 1 with that seed.
  int n = 1;
  /// eos and stop_tokens cannot be chosen (their logits are -inf) before
  /// the output has this many tokens (vLLM's min_tokens).
  int min_tokens = 0;
  /// -1: none; k in 0..kMaxTopLogprobs: each output token's log-probability
  /// and the k most likely tokens (GenerationEvent::logprobs).
  int logprobs = -1;
  /// The log-probabilities of the prompt's tokens (for echo), with the top
  /// `logprobs` of each. The prompt is then computed one token a step (each
  /// position's logits come back to the host).
  bool prompt_logprobs = false;
  /// Called after each token of a choice with its output so far; true ends
  /// that choice ("stop"), e.g. for stop strings.
  std::function<bool(int choice, const std::vector<int>& output)> stop_check;
  std::function<void(const GenerationEvent&)> on_event;
  /// Called once, on the domain's thread, when the request first joins the
  /// running batch (the end of its queue time); null: none.
  std::function<void()> on_scheduled;
};

/// Counters of a domain.
struct DomainStats {
  std::uint64_t steps = 0;
  std::uint64_t prompt_tokens = 0;    ///< prefill tokens computed (recomputation included)
  std::uint64_t generated_tokens = 0;
  std::uint64_t preemptions = 0;      ///< sequences preempted for KV pages, recomputed later
  std::uint64_t finished = 0;
  std::uint64_t failed = 0;
};

/// The dummy requests a domain runs before it serves (Domain::warm_up), so
/// that its first real requests find buffers sized, helper threads woken
/// and, on the CUDA backend, the graphs of their decode batch sizes
/// captured.
struct WarmUpPlan {
  /// Decode batch sizes (rows; Backend::warm_batch_sizes): at each, that
  /// many one-token prompts are prefilled in one step and decoded once in
  /// the next, as a decode of that batch size runs (a CUDA graph captured at
  /// the first, replayed at the second).
  std::vector<int> batch_sizes;
  /// First, one step of this many prompt tokens (at most the step's token
  /// budget) over as many sequences as the largest batch size run (each at
  /// least two tokens: not a decode's shape), so that the activation and
  /// logits buffers have their largest sizes before any graph is captured:
  /// a buffer that grows later drops the graphs. 0: none.
  int prefill_tokens = 0;
  int token = 0;  ///< the token id every dummy prompt repeats
};

/// A dummy request of a warm-up failed, or the domain could not finish them.
class WarmUpError : public Error {
 public:
  using Error::Error;
};

/// What a warm-up ran.
struct WarmUpResult {
  /// The plan's batch sizes that the domain can hold at once, ascending.
  std::vector<int> batch_sizes;
  int prefill_tokens = 0;  ///< the first step's prompt tokens (0: none)
  double ms = 0;           ///< wall time, ms
};

/// A domain's scheduler over its executor: continuous batching (requests
/// join and leave the batch at every step), chunked prefill under the
/// token budget, paged KV under the block cap. Fair between request
/// groups: waiting sequences are admitted round robin across groups, one
/// group holds at most max_group_share of the batch while others have
/// work (its newest sequences are preempted to make room for a group with
/// none running), and decodes are planned before prefill chunks. When
/// pages run out, the newest sequence of the group running the most is
/// preempted and recomputed later; a request is never dropped: it
/// finishes, or fails with an error event.
class Domain {
 public:
  /// Builds the engine of `config` with `make` (after filling in the
  /// default stage layout from `hp`): the real engine, the simulated one, or
  /// a test's.
  using EngineFactory = std::function<std::unique_ptr<Engine>(const DomainConfig&)>;
  Domain(const model::HParams& hp, DomainConfig config, const EngineFactory& make);
  /// A domain of the real engine (engine::Executor) over resident weights.
  Domain(const WeightStore& weights, DomainConfig config);
  /// The factory of the real engine over `weights` (which must outlive the
  /// engines): its stages, KV pages, backend and row budget from the config.
  static EngineFactory real_engine(const WeightStore& weights);
  ~Domain();

  const DomainConfig& config() const noexcept { return cfg_; }

  /// Queues a request (thread-safe). Throws ftp::InputError when it can
  /// never be served: empty prompt, token ids outside the vocabulary, prompt
  /// plus max_tokens beyond the context or beyond the whole KV cache.
  void submit(GenerationRequest request);
  /// Cancels request `id` if this domain holds it: at its next step the
  /// request finishes with reason "cancelled" (no error) and gives back its
  /// KV pages. For a client that has gone away. Thread-safe; an id this
  /// domain does not hold is forgotten at that step.
  void cancel(const std::string& id);
  /// Ends every request the domain holds at its next step with reason
  /// "error" and the message "domain ID: `why`", giving back their KV pages:
  /// for a shutdown that cannot wait any longer. Thread-safe.
  void abort_all(const std::string& why);
  /// From the next step on, gives back every request that has not started:
  /// nothing computed or streamed, all its choices still waiting (a drain
  /// whose requests other domains can serve: the domain then finishes only
  /// what it has begun). Each ends with reason "withdrawn" and no error,
  /// once per choice, and counts as neither finished nor failed; requests
  /// queued later are given back too. Thread-safe.
  void withdraw_unstarted();

  /// One iteration: schedule, forward, sample, deliver events. Returns the
  /// tokens computed (0 when there was nothing to do).
  int step();

  /// Runs `plan`'s dummy requests to their end on the calling thread,
  /// before the domain serves: it must be idle, and no other thread may
  /// step it or submit to it meanwhile (serve::DomainRunner calls it before
  /// its thread starts). A batch size the domain cannot hold at once (over
  /// max_running, the step's token budget or its KV pages) is skipped. After
  /// it every KV page is free again, stats() are what they were, and
  /// nothing of the dummies is left to change a later request's output.
  /// Throws WarmUpError naming the domain when a dummy fails (its engine's
  /// error) or the domain cannot finish them.
  WarmUpResult warm_up(const WarmUpPlan& plan);

  bool idle() const;
  int running() const;
  int waiting() const;
  /// Tokens still to prefill (prompts, and a preempted sequence's tokens to
  /// recompute) of the waiting sequences and the running ones not yet at
  /// their first token, as of the end of the last step (submits since
  /// counted): the queue's token backlog the gear shifter weighs. 0 where
  /// DomainConfig::count_backlog is off.
  std::int64_t queued_prompt_tokens() const;
  /// KV pages in use / all pages.
  double kv_usage() const;
  DomainStats stats() const;
  /// Slow start: at most `cap` running sequences for the next `steps` steps.
  void limit_running(int cap, int steps);

  /// Busy seconds of each pipeline stage in the last step.
  std::vector<double> stage_busy_s() const { return exec_->stage_busy_s(); }
  /// The engine's later steps run at a lower CPU priority (Engine::set_background).
  void set_background() { exec_->set_background(); }
  /// Why the engine cannot run another step, or empty (Engine::failure).
  std::string failure() const { return exec_->failure(); }

 private:
  struct Seq;
  bool ensure_blocks(Seq& s, int upto_tokens);
  /// Asks the cache for the lines of `s` the rest of its step touches.
  static void prefetch_step_lines(const Seq& s);
  void release(Seq& s);
  /// Events of one step, delivered after it: each names its request's
  /// callback, which stays alive (the sequence is retired, not destroyed,
  /// until they are delivered).
  using EventList = std::vector<std::pair<const std::function<void(const GenerationEvent&)>*, GenerationEvent>>;
  EventList spare_events_;  // the last step's list, emptied: its capacity for the next
  void finish(Seq& s, FinishReason reason, const std::string& error, EventList& events);
  /// The choices 1..n-1 of `s` (choice 0), sharing its prompt's full pages.
  void fork(Seq& s, std::vector<std::unique_ptr<Seq>>& out);
  /// Whether a row of `s` needs the logits on the host (top-k, penalties,
  /// min_tokens masking, prompt log-probabilities).
  bool host_samples(const Seq& s) const;
  /// Tokens still to prefill of waiting_ and running_ (the step thread's).
  std::int64_t to_prefill() const;
  /// The same of incoming_ (under mu_).
  std::int64_t incoming_to_prefill() const;
  /// Preempts running_[i] (its pages back, recomputed later), returns it to waiting.
  void preempt_at(std::size_t i);
  /// The index in running_ of the sequence to preempt among running_[from..]:
  /// the newest of the group that runs the most sequences.
  std::size_t victim(std::size_t from);
  /// Running sequences per group id into `n` (indexed by GroupIds id).
  void running_per_group(std::vector<int>& n) const;
  /// A new stamp for mark(): every group id unmarked again.
  void new_marks();
  /// Marks group id `g` under the current stamp; false when it already was.
  bool mark(int g);

  model::HParams hp_;
  DomainConfig cfg_;
  std::unique_ptr<Engine> exec_;
  BlockAllocator blocks_;
  mutable std::mutex mu_;                 // guards incoming_ and the counters read by others
  std::deque<std::unique_ptr<Seq>> incoming_;
  std::unordered_set<std::string> cancelled_;  // ids to cancel at the next step (under mu_)
  std::string abort_;                          // abort_all's reason, until the next step (under mu_)
  bool withdraw_ = false;                      // withdraw_unstarted (under mu_)
  GroupIds groups_;                            // the live sequences' groups (under mu_)
  int group_bound_ = 0;                        // groups_.bound() at the step's start
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  // Buffers of the step, kept from step to step (cleared, not freed).
  std::vector<int> per_group_, victim_count_;
  std::vector<std::uint64_t> marks_;  // per group id: the stamp that marked it
  std::uint64_t stamp_ = 0;
  std::vector<std::pair<Seq*, int>> plan_;
  std::vector<char> prompt_row_;
  std::vector<TokenChoice> choices_;
  std::vector<int> chosen_;
  std::vector<Seq*> done_;
  // The chunks of a step, kept from step to step with their token vectors
  // (and spare ones) so that a step allocates none in the steady state.
  std::vector<SeqChunk> chunks_;
  std::vector<std::vector<int>> spare_tokens_;
  std::uint64_t arrivals_ = 0;
  DomainStats stats_;
  int n_running_ = 0, n_waiting_ = 0;
  std::int64_t n_queued_prompt_ = 0;  // queued_prompt_tokens (under mu_)
  int cap_ = 0, cap_steps_ = 0;  // slow start
};

/// Bytes one KV page takes on one rank of `stage`: K and V of its KV heads
/// (one, replicated, when tp exceeds the model's KV heads) for the stage's
/// layers, in the stage's kv_dtype (2 bytes an element unless f32).
std::uint64_t kv_block_bytes_per_rank(const model::HParams& hp, const StageLayout& stage, int block_tokens);
/// KV pages that hold `tokens` positions, `block_tokens` to a page.
int kv_pages(std::int64_t tokens, int block_tokens);

/// KV positions a request holds at its peak: every token but the last it
/// generates (that one ends it and is never computed), never more than the
/// context less one. In 64 bits: max_tokens may be as large as an int goes.
int peak_kv_tokens(std::int64_t prompt_tokens, std::int64_t max_tokens, int max_context);

}  // namespace ftp::engine
