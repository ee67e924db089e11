// SPDX-License-Identifier: Apache-2.0
#include "engine/domain.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "core/error.hpp"

namespace ftp::engine {

std::string_view to_string(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
    case FinishReason::withdrawn: return "withdrawn";
  }
  return "";
}

struct alignas(64) Domain::Seq {
  // Read by every pass of a step over the batch: kept together in the
  // first four cache lines (the step prefetches them), ahead of the rest of
  // the request and the sampler (whose random engine alone is 2.5 KB). A
  // replay of a 512-GPU cluster was bound by these misses.
  int computed = 0;          // leading tokens whose KV is in the cache
  int choice = 0;            // which of the request's choices
  int forks_left = 0;        // choice 0: the choices still to fork from it
  int shared_tokens = 0;     // choice 0: the prompt positions whose full pages the choices share
  int prompt_size = 0;       // req.prompt.size()
  int min_tokens = 0;        // req.min_tokens
  int max_tokens = 0;        // req.max_tokens
  int eos = -1;              // req.eos
  int group = 0;             // the id (Domain::groups_) of req.group, or of its id when empty
  int generated = 0;         // output tokens so far: tokens[prompt_size..]
  bool prompt_logprobs = false;  // req.prompt_logprobs
  bool prompt_lp_sent = false;
  bool engine_can_choose = true;  // sampler.engine_can_choose()
  bool stops = false;        // an eos or stop tokens to mask before min_tokens
  bool logprobs = false;     // req.logprobs >= 0
  bool greedy = false;       // temperature <= 0: a choice without a draw (Sampler::next_choice)
  bool checks_stop = false;  // req.stop_check is set
  float top_p = 1.0f;        // req.sampling.top_p
  float sampler_temperature = 0.0f;  // req.sampling.temperature (<= 0 when greedy)
  std::uint64_t arrival = 0;
  std::vector<int> tokens;   // prompt + generated: everything whose KV is wanted
  /// The output as stop_check takes it, kept only for a request with one;
  /// otherwise the output is tokens[prompt_size..] (output_copy), and a
  /// step writes to one vector a token instead of two.
  std::vector<int> output;
  std::vector<int> blocks;
  std::function<void(const GenerationEvent&)> on_event;  // req.on_event, moved here
  GenerationRequest req;     // its id (the events') first
  Sampler sampler;
  std::vector<TokenLogprobs> prompt_lp;  // with req.prompt_logprobs: entry j for prompt token j + 1

  Seq(GenerationRequest r, std::uint64_t a, int group_id, int c = 0)
      : choice(c), group(group_id), arrival(a), req(std::move(r)), sampler(choice_params(req.sampling, c)) {
    on_event = std::move(req.on_event);
    req.on_event = nullptr;
    // Room for the output up front (up to a bound): growing the vectors
    // token by token reallocated and copied each sequence's prompt.
    const auto out = static_cast<std::size_t>(std::clamp(req.max_tokens, 0, kReserveOutput));
    tokens.reserve(req.prompt.size() + out);
    tokens = req.prompt;
    if (req.stop_check) output.reserve(out);
    prompt_size = static_cast<int>(req.prompt.size());
    min_tokens = req.min_tokens;
    max_tokens = req.max_tokens;
    eos = req.eos;
    prompt_logprobs = req.prompt_logprobs;
    engine_can_choose = sampler.engine_can_choose();
    stops = req.eos >= 0 || !req.stop_tokens.empty();
    logprobs = req.logprobs >= 0;
    greedy = !(req.sampling.temperature > 0.0f);
    checks_stop = static_cast<bool>(req.stop_check);
    top_p = req.sampling.top_p;
    sampler_temperature = req.sampling.temperature;
  }
  /// Sampler::next_choice without touching the sampler when greedy (no draw).
  TokenChoice next_choice() {
    if (!greedy) return sampler.next_choice();
    TokenChoice c;
    c.temperature = sampler_temperature;
    c.top_p = top_p;
    return c;
  }
  int pending() const { return static_cast<int>(tokens.size()) - computed; }
  /// The output so far, as a vector of its own.
  std::vector<int> output_copy() const {
    return std::vector<int>(tokens.begin() + prompt_size, tokens.begin() + prompt_size + generated);
  }
  /// A prompt position whose logits give the next prompt token's log-probability.
  bool prompt_row() const { return prompt_logprobs && !prompt_lp_sent && computed + 1 < prompt_size; }
  /// Output tokens a sequence has room for from the start, at most.
  static constexpr int kReserveOutput = 4096;
  /// The group a request's sequences belong to: its own id when it names none.
  static const std::string& group_name(const GenerationRequest& r) { return r.group.empty() ? r.id : r.group; }
  static SamplingParams choice_params(SamplingParams p, int c) {
    p.seed += static_cast<std::uint64_t>(c);  // wraps mod 2^64
    return p;
  }
};

std::uint64_t kv_block_bytes_per_rank(const model::HParams& hp, const StageLayout& st, int block_tokens) {
  const auto kv_heads = static_cast<std::uint64_t>(split_rank(hp, st.tp, 0).kv_heads.size());  // the same on every rank
  return 2ull * st.n_layers * kv_heads * block_tokens * hp.head_dim * kv_element_bytes(st.kv_dtype);
}

int peak_kv_tokens(std::int64_t prompt_tokens, std::int64_t max_tokens, int max_context) {
  return static_cast<int>(std::min<std::int64_t>(prompt_tokens + max_tokens - 1, max_context - 1));
}

int kv_pages(std::int64_t tokens, int block_tokens) {
  return static_cast<int>((tokens + block_tokens - 1) / block_tokens);
}

Domain::EngineFactory Domain::real_engine(const WeightStore& weights) {
  return [&weights](const DomainConfig& c) -> std::unique_ptr<Engine> {
    return std::make_unique<Executor>(weights, c.stages, c.kv_blocks, c.block_tokens, c.backend, c.max_batched_tokens);
  };
}

Domain::Domain(const WeightStore& weights, DomainConfig config)
    : Domain(weights.hparams(), std::move(config), real_engine(weights)) {}

Domain::Domain(const model::HParams& hp, DomainConfig config, const EngineFactory& make)
    : hp_(hp), cfg_(std::move(config)), blocks_(cfg_.kv_blocks) {
  if (cfg_.stages.size() == 1 && cfg_.stages[0].n_layers == 0) {
    cfg_.stages[0].first_layer = 0;
    cfg_.stages[0].n_layers = hp.n_layer;
  }
  if (cfg_.max_context <= 0) cfg_.max_context = hp.n_ctx_train;
  if (cfg_.max_batched_tokens < 1) throw InputError("domain " + cfg_.id + ": max_batched_tokens must be positive");
  if (cfg_.max_running < 1) throw InputError("domain " + cfg_.id + ": max_running must be positive");
  exec_ = make(cfg_);
  if (!exec_) throw Error("domain " + cfg_.id + ": no engine");
}

Domain::~Domain() = default;

void Domain::submit(GenerationRequest r) {
  const auto& hp = hp_;
  // Made only for an error: a replay submits millions that pass.
  auto who = [&r] { return "request " + r.id + ": "; };
  if (r.prompt.empty()) throw InputError(who() + "prompt: must hold at least one token");
  for (std::size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= hp.n_vocab)
      throw InputError(who() + "prompt[" + std::to_string(i) + "]: token id " + std::to_string(r.prompt[i]) +
                       " outside the vocabulary (0.." + std::to_string(hp.n_vocab - 1) + ")");
  if (r.max_tokens < 1) throw InputError(who() + "max_tokens: must be positive, got " + std::to_string(r.max_tokens));
  if (static_cast<int>(r.prompt.size()) >= cfg_.max_context)
    throw InputError(who() + "prompt of " + std::to_string(r.prompt.size()) + " tokens does not fit the context of " +
                     std::to_string(cfg_.max_context));
  if (r.n < 1 || r.n > cfg_.max_running)
    throw InputError(who() + "n: must be between 1 and the domain's " + std::to_string(cfg_.max_running) +
                     " running sequences, got " + std::to_string(r.n));
  if (r.min_tokens < 0) throw InputError(who() + "min_tokens: must not be negative, got " + std::to_string(r.min_tokens));
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs)
    throw InputError(who() + "logprobs: must be between 0 and " + std::to_string(kMaxTopLogprobs) + ", got " +
                     std::to_string(r.logprobs));
  const int held = peak_kv_tokens(static_cast<std::int64_t>(r.prompt.size()), r.max_tokens, cfg_.max_context);
  // The choices share the full pages before the prompt's last token; each
  // holds the rest of its sequence alone.
  const int shared = (static_cast<int>(r.prompt.size()) - 1) / cfg_.block_tokens * cfg_.block_tokens;
  const std::int64_t shared_pages = r.n > 1 ? shared / cfg_.block_tokens : 0;
  const std::int64_t pages = shared_pages + static_cast<std::int64_t>(r.n) * (kv_pages(held, cfg_.block_tokens) - shared_pages);
  if (pages > cfg_.kv_blocks)
    throw InputError(who() + (r.n > 1 ? std::to_string(r.n) + " choices of " : std::string()) + std::to_string(held) +
                     " tokens need " + std::to_string(pages) +
                     " KV pages, domain " + cfg_.id + " has " + std::to_string(cfg_.kv_blocks));
  std::lock_guard lk(mu_);
  cancelled_.erase(r.id);  // an earlier cancel of a request of the same id is not for this one
  const int n = r.n;
  const std::uint64_t arrival = arrivals_++;
  if (n > 1 && shared > 0) {
    // Choice 0 computes the shared pages; the others fork from it then.
    const int g = groups_.acquire(Seq::group_name(r));
    auto first = std::make_unique<Seq>(std::move(r), arrival, g);
    first->forks_left = n - 1;
    first->shared_tokens = shared;
    incoming_.push_back(std::move(first));
  } else if (n == 1) {
    const int g = groups_.acquire(Seq::group_name(r));
    incoming_.push_back(std::make_unique<Seq>(std::move(r), arrival, g));
  } else {
    // Nothing to share (a prompt within one page): n sequences from the start.
    for (int c = 0; c < n; ++c) incoming_.push_back(std::make_unique<Seq>(r, arrival, groups_.acquire(Seq::group_name(r)), c));
  }
  const int seqs = 1 + (n > 1 && shared == 0 ? n - 1 : 0);
  n_waiting_ += seqs;
  if (cfg_.count_backlog) n_queued_prompt_ += static_cast<std::int64_t>(seqs) * incoming_.back()->prompt_size;
}

void Domain::fork(Seq& s, std::vector<std::unique_ptr<Seq>>& out) {
  const int pages = s.shared_tokens / cfg_.block_tokens;
  for (int c = 1; c <= s.forks_left; ++c) {
    int g;
    {
      std::lock_guard lk(mu_);
      g = groups_.acquire(Seq::group_name(s.req));
    }
    auto child = std::make_unique<Seq>(s.req, s.arrival, g, c);
    child->on_event = s.on_event;
    child->computed = s.shared_tokens;
    child->blocks.assign(s.blocks.begin(), s.blocks.begin() + pages);
    for (int b : child->blocks) blocks_.share(b);
    child->prompt_lp.assign(s.prompt_lp.begin(),
                            s.prompt_lp.begin() + std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(s.prompt_lp.size()),
                                                                           s.shared_tokens));
    out.push_back(std::move(child));
  }
  s.forks_left = 0;
}

bool Domain::host_samples(const Seq& s) const {
  if (!s.engine_can_choose || s.prompt_row()) return true;
  const bool masks = s.generated < s.min_tokens && s.stops;
  return masks;
}

bool Domain::idle() const {
  std::lock_guard lk(mu_);
  return n_running_ == 0 && n_waiting_ == 0;
}

int Domain::running() const {
  std::lock_guard lk(mu_);
  return n_running_;
}

int Domain::waiting() const {
  std::lock_guard lk(mu_);
  return n_waiting_;
}

std::int64_t Domain::queued_prompt_tokens() const {
  std::lock_guard lk(mu_);
  return n_queued_prompt_;
}

std::int64_t Domain::to_prefill() const {
  std::int64_t n = 0;
  for (const auto& w : waiting_) n += w->pending();
  // A running sequence with more than one token pending is still in
  // prefill (a decode feeds one).
  for (const auto& r : running_)
    if (r->pending() > 1) n += r->pending();
  return n;
}

std::int64_t Domain::incoming_to_prefill() const {
  std::int64_t n = 0;
  for (const auto& w : incoming_) n += w->pending();
  return n;
}

double Domain::kv_usage() const {
  return 1.0 - static_cast<double>(blocks_.free_blocks()) / blocks_.total_blocks();
}

DomainStats Domain::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Domain::prefetch_step_lines(const Seq& s) {
  // The chunk's tokens, where the next one goes, the callback and the id.
  __builtin_prefetch(s.tokens.data() + s.computed);
  const char* line = reinterpret_cast<const char*>(&s);
  __builtin_prefetch(line + 128);
  __builtin_prefetch(line + 192);
}

bool Domain::ensure_blocks(Seq& s, int upto_tokens) {
  // Those it can get are kept when the pages run out (as one by one).
  const int need = kv_pages(upto_tokens, cfg_.block_tokens) - static_cast<int>(s.blocks.size());
  return need <= 0 || blocks_.allocate(need, s.blocks) == need;
}

void Domain::release(Seq& s) {
  blocks_.free(s.blocks);
  s.blocks.clear();
}

void Domain::running_per_group(std::vector<int>& n) const {
  n.assign(static_cast<std::size_t>(group_bound_), 0);
  for (const auto& s : running_) ++n[static_cast<std::size_t>(s->group)];
}

void Domain::new_marks() {
  if (marks_.size() < static_cast<std::size_t>(group_bound_)) marks_.resize(static_cast<std::size_t>(group_bound_), 0);
  ++stamp_;
}

bool Domain::mark(int g) {
  auto& m = marks_[static_cast<std::size_t>(g)];
  if (m == stamp_) return false;
  m = stamp_;
  return true;
}

std::size_t Domain::victim(std::size_t from) {
  // The newest sequence of the group that runs the most: with one sequence
  // per group, the newest of all. It gives its pages back and waits to be
  // recomputed (prompt + output so far); it is never dropped.
  std::vector<int>& per_group = victim_count_;
  running_per_group(per_group);
  std::size_t best = from;
  for (std::size_t j = from + 1; j < running_.size(); ++j) {
    const int nj = per_group[static_cast<std::size_t>(running_[j]->group)],
              nb = per_group[static_cast<std::size_t>(running_[best]->group)];
    if (nj > nb || (nj == nb && running_[j]->arrival > running_[best]->arrival)) best = j;
  }
  return best;
}

void Domain::preempt_at(std::size_t i) {
  Seq& s = *running_[i];
  release(s);
  s.computed = 0;
  waiting_.push_front(std::move(running_[i]));
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  std::lock_guard lk(mu_);
  ++stats_.preemptions;
}

void Domain::finish(Seq& s, FinishReason reason, const std::string& error, EventList& events) {
  release(s);
  GenerationEvent e;
  e.request_id = s.req.id;
  e.domain_id = cfg_.id;
  e.index = s.generated;
  e.finished = true;
  e.finish_reason = reason;
  e.error = error;
  e.choice = s.choice;
  const int ends = 1 + s.forks_left;
  if (s.on_event) {
    events.emplace_back(&s.on_event, e);
    // Choices not forked yet (a cancel or failure before the prompt's
    // shared pages were computed) finish with choice 0.
    for (int c = 1; c <= s.forks_left; ++c) {
      e.choice = c;
      e.index = 0;
      events.emplace_back(&s.on_event, e);
    }
  }
  s.forks_left = 0;
  std::lock_guard lk(mu_);
  groups_.release(s.group);  // the sequence ends: it is never scheduled again
  if (reason == FinishReason::error)
    stats_.failed += static_cast<std::uint64_t>(ends);
  else if (reason != FinishReason::withdrawn)
    stats_.finished += static_cast<std::uint64_t>(ends);
}

WarmUpResult Domain::warm_up(const WarmUpPlan& plan) {
  const std::string who = "domain " + cfg_.id + ": warm-up: ";
  if (!idle()) throw WarmUpError(who + "the domain has requests already; it warms up before it serves");
  if (plan.token < 0 || plan.token >= hp_.n_vocab)
    throw WarmUpError(who + "token id " + std::to_string(plan.token) + " outside the vocabulary (0.." +
                      std::to_string(hp_.n_vocab - 1) + ")");
  const auto t0 = std::chrono::steady_clock::now();
  const DomainStats before = stats();
  WarmUpResult out;
  std::string failed;
  int pending = 0;
  auto dummy = [&](const std::string& id, int prompt_tokens, int max_tokens) {
    GenerationRequest r;
    r.id = "warmup-" + cfg_.id + "-" + id;
    r.group = "warmup";  // one group: alone, it may fill the running batch
    r.prompt.assign(static_cast<std::size_t>(prompt_tokens), plan.token);
    r.max_tokens = max_tokens;  // no eos: each runs exactly its steps
    r.on_event = [&failed, &pending](const GenerationEvent& e) {
      if (!e.finished) return;
      --pending;
      if (e.finish_reason == FinishReason::error && failed.empty()) failed = e.error;
    };
    submit(std::move(r));
    ++pending;
  };
  auto run = [&] {
    // Every dummy fits at once, so each step computes something until they end.
    while (pending > 0)
      if (step() == 0 && pending > 0)
        throw WarmUpError(who + std::to_string(pending) + " dummy request(s) could not be scheduled");
    if (!failed.empty()) throw WarmUpError(who + failed);
  };
  const int bt = cfg_.block_tokens;
  // The batch sizes the domain holds at once: one page or so each.
  const int pages_each = kv_pages(peak_kv_tokens(1, 2, cfg_.max_context), bt);
  std::vector<int> sizes;
  for (int b : plan.batch_sizes)
    if (b >= 1 && b <= cfg_.max_running && b <= cfg_.max_batched_tokens &&
        static_cast<std::int64_t>(b) * pages_each <= cfg_.kv_blocks)
      sizes.push_back(b);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // The largest step first, over as many sequences as the largest batch
  // (at least two tokens each: not a decode's shape), so that activation
  // and logits buffers have their largest sizes before any graph is
  // captured: a buffer that grows later drops the graphs.
  const int prefill = std::min({plan.prefill_tokens, cfg_.max_batched_tokens, cfg_.max_context - 1, cfg_.kv_blocks * bt});
  if (prefill > 0) {
    int n = std::max(1, std::min(sizes.empty() ? 1 : sizes.back(), prefill / 2));
    auto pages = [&](int seqs) {
      const int each = prefill / seqs;
      return static_cast<std::int64_t>(seqs - 1) * kv_pages(each, bt) + kv_pages(each + prefill % seqs, bt);
    };
    while (n > 1 && pages(n) > cfg_.kv_blocks) --n;
    for (int i = 0; i < n; ++i) dummy("prefill-" + std::to_string(i), prefill / n + (i == 0 ? prefill % n : 0), 1);
    run();
    out.prefill_tokens = prefill;
  }
  for (int b : sizes) {
    // Queued before the step: the first step prefills all b at once (one row
    // each, a decode's shape) and the second decodes all b.
    for (int i = 0; i < b; ++i) dummy(std::to_string(b) + "-" + std::to_string(i), 1, 2);
    run();
    out.batch_sizes.push_back(b);
  }
  if (blocks_.free_blocks() != blocks_.total_blocks())
    throw WarmUpError(who + std::to_string(blocks_.total_blocks() - blocks_.free_blocks()) +
                      " KV page(s) still held after the dummy requests ended");
  {
    std::lock_guard lk(mu_);
    stats_ = before;  // the dummies are no traffic
  }
  out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void Domain::limit_running(int cap, int steps) {
  std::lock_guard lk(mu_);
  cap_ = std::max(1, cap);
  cap_steps_ = steps;
}

void Domain::cancel(const std::string& id) {
  std::lock_guard lk(mu_);
  cancelled_.insert(id);
}

void Domain::abort_all(const std::string& why) {
  std::lock_guard lk(mu_);
  abort_ = why.empty() ? "aborted" : why;
}

void Domain::withdraw_unstarted() {
  std::lock_guard lk(mu_);
  withdraw_ = true;
}

int Domain::step() {
  int max_running = cfg_.max_running;
  std::unordered_set<std::string> cancel;
  std::string abort;
  bool withdraw = false;
  {
    std::lock_guard lk(mu_);
    cancel.swap(cancelled_);
    abort.swap(abort_);
    withdraw = withdraw_;
    if (cap_steps_ > 0) {
      max_running = std::min(max_running, cap_);
      --cap_steps_;
    }
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
    group_bound_ = groups_.bound();
  }
  if (!cancel.empty() || !abort.empty()) {
    // Cancelled (or, after abort_all, all) requests leave before the plan:
    // their pages go back now.
    EventList gone;
    std::vector<std::unique_ptr<Seq>> retired;  // alive until their events are delivered
    auto drop = [&](auto& seqs) {
      for (auto it = seqs.begin(); it != seqs.end();) {
        if (!abort.empty()) {
          finish(**it, FinishReason::error, "domain " + cfg_.id + ": " + abort, gone);
        } else if (cancel.count((*it)->req.id)) {
          finish(**it, FinishReason::cancelled, "", gone);
        } else {
          ++it;
          continue;
        }
        retired.push_back(std::move(*it));
        it = seqs.erase(it);
      }
    };
    drop(running_);
    drop(waiting_);
    for (auto& [fn, e] : gone) (*fn)(e);  // the counters follow after admission below
  }
  if (withdraw && !waiting_.empty()) {
    // Not started: nothing computed, sent or forked yet, and every choice
    // still here (a request of n choices without a shared prompt page has n
    // sequences, which may have begun apart: those stay).
    auto unstarted = [](const Seq& s) {
      return s.computed == 0 && s.generated == 0 && s.blocks.empty() && s.prompt_lp.empty() && !s.prompt_lp_sent &&
             (s.req.n == 1 || s.forks_left == s.req.n - 1);
    };
    EventList back;
    std::vector<std::unique_ptr<Seq>> retired;  // alive until their events are delivered
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (unstarted(**it)) {
        finish(**it, FinishReason::withdrawn, "", back);
        retired.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    if (!back.empty()) {
      {
        std::lock_guard lk(mu_);
        n_waiting_ = static_cast<int>(waiting_.size() + incoming_.size());
      }
      for (auto& [fn, e] : back) (*fn)(e);
    }
  }
  // The running sequences are cold when many domains take turns (a
  // replay's 64 domains of 256 each): the two lines every pass reads are
  // asked for all at once here instead of one miss at a time below (the
  // planning asks for the rest of what the step touches).
  for (const auto& p : running_) {
    const char* line = reinterpret_cast<const char*>(p.get());
    __builtin_prefetch(line);
    __builtin_prefetch(line + 64);
  }
  int budget = cfg_.max_batched_tokens;
  std::vector<std::pair<Seq*, int>>& plan = plan_;  // sequence, tokens this step
  plan.clear();

  // 0. Fairness: while several groups have work, one holds at most `cap`
  // of the batch. A waiting group with nothing running gets a place from
  // the group over its cap that runs the most (its newest sequence).
  bool several_groups = false;
  {
    int first = -1;
    auto look = [&](const auto& seqs) {
      for (const auto& s : seqs) {
        if (first < 0) {
          first = s->group;
        } else if (s->group != first) {
          several_groups = true;
          return;
        }
      }
    };
    look(running_);
    if (!several_groups) look(waiting_);
  }
  const int cap = several_groups
                      ? std::max(1, static_cast<int>(cfg_.max_group_share * max_running))
                      : max_running;
  std::vector<int>& per_group = per_group_;  // running sequences per group id
  running_per_group(per_group);
  auto count = [&](int g) -> int& { return per_group[static_cast<std::size_t>(g)]; };
  {
    // The first waiting sequence of each group with nothing running wants
    // a slot and the pages of its first chunk. (Collected first: a
    // preemption pushes onto waiting_.)
    new_marks();
    std::vector<const Seq*> starved;
    for (const auto& w : waiting_)
      if (count(w->group) == 0 && mark(w->group)) starved.push_back(w.get());
    // Once the victim's group is within its cap nothing changes, and every
    // later starved group would find the same victim: one look, not one per
    // waiting group (an overloaded daemon has thousands).
    bool settled = false;
    for (std::size_t k = 0; k < starved.size() && !settled; ++k) {
      const int need = kv_pages(std::min(starved[k]->pending(), cfg_.max_batched_tokens), cfg_.block_tokens);
      while (!running_.empty() &&
             (static_cast<int>(running_.size()) >= max_running || blocks_.free_blocks() < need)) {
        const std::size_t v = victim(0);
        if (count(running_[v]->group) <= cap) {
          settled = true;
          break;
        }
        --count(running_[v]->group);
        preempt_at(v);
      }
    }
  }

  // 1. Running sequences: decodes (one token) first, then prefill chunks,
  // oldest first within each.
  auto before = [](const auto& a, const auto& b) {
    const bool da = a->pending() <= 1, db = b->pending() <= 1;
    return da != db ? da : a->arrival < b->arrival;
  };
  // Usually in order already: a batch strictly in order is the one order
  // the sort can give, so it is left as it is.
  if (std::adjacent_find(running_.begin(), running_.end(), [&](const auto& a, const auto& b) { return !before(a, b); }) !=
      running_.end())
    std::sort(running_.begin(), running_.end(), before);
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Seq& s = *running_[i];
    int n = std::min(s.pending(), budget);
    if (s.prompt_row()) n = std::min(n, 1);  // each prompt position's logits
    bool self_went = false;
    while (!ensure_blocks(s, s.computed + n)) {
      // Out of pages: preempt a sequence not yet planned (victim), this one
      // if it is the one.
      const std::size_t v = victim(i);
      preempt_at(v);
      if (v == i) {
        self_went = true;
        break;
      }
    }
    if (self_went) continue;  // running_[i] is now the next one
    prefetch_step_lines(s);
    plan.emplace_back(&s, n);
    budget -= n;
    ++i;
  }
  // 2. Admit waiting sequences while pages and budget last: round robin
  // across groups (each group's own in arrival order), a group under `cap`.
  running_per_group(per_group);
  bool out_of_pages = false;
  for (bool admitted = true; admitted && !out_of_pages;) {
    admitted = false;
    new_marks();  // a mark: the group had its turn in this round
    for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 &&
                                     static_cast<int>(running_.size()) < max_running;) {
      Seq& s = **it;
      if (marks_[static_cast<std::size_t>(s.group)] == stamp_ || count(s.group) >= cap) {
        ++it;
        continue;
      }
      mark(s.group);
      int n = std::min(s.pending(), budget);
      if (s.prompt_row()) n = std::min(n, 1);  // each prompt position's logits
      if (!ensure_blocks(s, s.computed + n)) {
        release(s);
        out_of_pages = true;
        break;
      }
      plan.emplace_back(&s, n);
      budget -= n;
      ++count(s.group);
      if (s.req.on_scheduled) std::exchange(s.req.on_scheduled, nullptr)();
      running_.push_back(std::move(*it));
      it = waiting_.erase(it);
      admitted = true;
    }
  }
  const bool backlog = plan.empty() && cfg_.count_backlog;  // else after the step
  const std::int64_t queued = backlog ? to_prefill() : 0;
  {
    std::lock_guard lk(mu_);
    n_running_ = static_cast<int>(running_.size());
    n_waiting_ = static_cast<int>(waiting_.size() + incoming_.size());
    if (backlog) n_queued_prompt_ = queued + incoming_to_prefill();
  }
  if (plan.empty()) return 0;

  std::vector<SeqChunk>& chunks = chunks_;
  while (chunks.size() > plan.size()) {
    spare_tokens_.push_back(std::move(chunks.back().tokens));
    chunks.pop_back();
  }
  while (chunks.size() < plan.size()) {
    chunks.emplace_back();
    if (!spare_tokens_.empty()) {
      chunks.back().tokens = std::move(spare_tokens_.back());
      spare_tokens_.pop_back();
    }
  }
  std::vector<char>& prompt_row = prompt_row_;  // logits for a prompt token's log-probability, not a choice
  prompt_row.assign(plan.size(), 0);
  int computed_tokens = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    auto [s, n] = plan[i];
    SeqChunk& c = chunks[i];
    c.blocks = &s->blocks;
    c.start_pos = s->computed;
    if (n == 1) {  // a decode: most rows, without a copy call
      c.tokens.resize(1);
      c.tokens[0] = s->tokens[static_cast<std::size_t>(s->computed)];
    } else {
      c.tokens.assign(s->tokens.begin() + s->computed, s->tokens.begin() + s->computed + n);
    }
    prompt_row[i] = s->prompt_row();
    c.want_logits = s->computed + n == static_cast<int>(s->tokens.size()) || prompt_row[i];
    computed_tokens += n;
  }
  std::vector<std::unique_ptr<Seq>> forked;

  EventList events;
  events.swap(spare_events_);
  events.reserve(plan.size() + 1);
  std::vector<Seq*>& done = done_;
  done.clear();
  // The step's counters, added under the lock once (one lock per token
  // was a quarter of a simulated replay's time).
  std::uint64_t prompt_tokens = 0, generated = 0;
  try {
    // The engine chooses the tokens where the logits are (only ids and the
    // log-probabilities asked come back) unless a row needs the host's
    // sampler (top-k, penalties, min_tokens, prompt log-probabilities); the
    // draws are the ones sample() would make, so a request's random stream
    // is the same either way.
    bool engine_chooses = true, want_lp = false;
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (chunks[i].want_logits) {
        engine_chooses = engine_chooses && !host_samples(*plan[i].first);
        want_lp = want_lp || plan[i].first->logprobs;
      }
    std::vector<std::vector<float>> logits;
    std::vector<int>& chosen = chosen_;
    chosen.clear();
    std::vector<TokenLogprobs> chosen_lp;
    if (engine_chooses) {
      std::vector<TokenChoice>& choices = choices_;
      choices.clear();
      for (std::size_t i = 0; i < plan.size(); ++i)
        if (chunks[i].want_logits) {
          choices.push_back(plan[i].first->next_choice());
          choices.back().logprobs = plan[i].first->logprobs ? plan[i].first->req.logprobs : -1;
        }
      chosen = want_lp ? exec_->forward_choose_logprobs(chunks, cfg_.micro_batches, choices, chosen_lp)
                       : exec_->forward_choose(chunks, cfg_.micro_batches, choices);
      if (chosen.size() != choices.size() || (want_lp && chosen_lp.size() != choices.size()))
        throw Error("engine returned " + std::to_string(chosen.size()) + " tokens for " +
                    std::to_string(choices.size()) + " choices");
    } else {
      logits = exec_->forward(chunks, cfg_.micro_batches);
    }
    std::size_t li = 0;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      Seq& s = *plan[i].first;
      bool was_prefill = plan[i].second > 1 || s.computed < s.prompt_size;
      const int pos = s.computed + plan[i].second - 1;  // the chunk's last position
      s.computed += plan[i].second;
      if (was_prefill) prompt_tokens += static_cast<std::uint64_t>(plan[i].second);
      if (s.forks_left > 0 && s.computed >= s.shared_tokens) fork(s, forked);
      if (!chunks[i].want_logits) continue;
      if (prompt_row[i]) {
        // Position pos's logits: the log-probability of prompt token pos + 1.
        const auto& row = logits[li++];
        if (s.prompt_lp.size() < static_cast<std::size_t>(pos + 1)) s.prompt_lp.resize(static_cast<std::size_t>(pos + 1));
        s.prompt_lp[static_cast<std::size_t>(pos)] =
            token_logprobs(row.data(), row.size(), s.req.prompt[static_cast<std::size_t>(pos + 1)], std::max(0, s.req.logprobs));
        continue;
      }
      int tok;
      std::optional<TokenLogprobs> lp;
      if (engine_chooses) {
        tok = chosen[li];
        if (s.logprobs) lp = std::move(chosen_lp[li]);
        ++li;
      } else {
        auto& row = logits[li++];
        std::vector<float> raw;  // the logits before penalties and masks, for the log-probabilities
        if (s.req.logprobs >= 0) raw = row;
        if (s.sampler.params().penalized())  // the host's path: a copy of the output is nothing to the logits
          apply_penalties(row.data(), row.size(), s.sampler.params(), s.req.prompt, s.output_copy());
        if (s.generated < s.req.min_tokens) {
          auto mask = [&](int t) {
            if (t >= 0 && static_cast<std::size_t>(t) < row.size()) row[static_cast<std::size_t>(t)] = -INFINITY;
          };
          mask(s.req.eos);
          for (int t : s.req.stop_tokens) mask(t);
        }
        tok = s.sampler.sample(row);
        if (s.req.logprobs >= 0) lp = token_logprobs(raw.data(), raw.size(), tok, s.req.logprobs);
      }
      ++s.generated;
      if (s.checks_stop) s.output.push_back(tok);
      s.tokens.push_back(tok);
      ++generated;
      // The event is made in its place in the list (a request without a
      // callback gets none).
      GenerationEvent* e = nullptr;
      if (s.on_event)
        e = &events.emplace_back(std::piecewise_construct, std::forward_as_tuple(&s.on_event), std::forward_as_tuple())
                 .second;
      if (e) {
        e->request_id = s.req.id;
        e->domain_id = cfg_.id;
        e->token = tok;
        e->index = s.generated - 1;
        e->choice = s.choice;
        e->logprobs = std::move(lp);
      }
      if (s.prompt_logprobs && !s.prompt_lp_sent) {
        if (e) e->prompt_logprobs = std::move(s.prompt_lp);
        s.prompt_lp.clear();
        s.prompt_lp_sent = true;
      }
      FinishReason reason = FinishReason::none;
      // eos and stop tokens cannot come before min_tokens (masked above).
      if (tok == s.eos ||
          (s.stops && std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), tok) != s.req.stop_tokens.end()) ||
          (s.checks_stop && s.req.stop_check(s.choice, s.output)))
        reason = FinishReason::stop;
      else if (s.generated >= s.max_tokens ||
               static_cast<int>(s.tokens.size()) >= cfg_.max_context)
        reason = FinishReason::length;
      if (reason != FinishReason::none) {
        finish(s, reason, "", events);
        done.push_back(&s);
      }
    }
    if (!engine_chooses) exec_->recycle(std::move(logits));
  } catch (const std::exception& ex) {
    // A failed forward fails the requests of this step with an error event;
    // the domain keeps serving the others.
    // Requests that already finished in this step (their events are in
    // `events`) keep their outcome: one finish per request.
    for (auto [s, n] : plan) {
      if (std::find(done.begin(), done.end(), s) != done.end()) continue;
      finish(*s, FinishReason::error, std::string("domain ") + cfg_.id + ": " + ex.what(), events);
      done.push_back(s);
    }
  }
  // Finished sequences leave the batch, alive until their events are delivered.
  std::vector<std::unique_ptr<Seq>> retired;
  if (!done.empty()) {
    std::sort(done.begin(), done.end());
    auto is_done = [&](const std::unique_ptr<Seq>& p) { return std::binary_search(done.begin(), done.end(), p.get()); };
    std::size_t kept = 0;
    for (auto& p : running_) {
      if (is_done(p))
        retired.push_back(std::move(p));
      else
        running_[kept++] = std::move(p);
    }
    running_.resize(kept);
  }
  // Forked choices wait first in line: their prompt is (almost) computed.
  for (auto it = forked.rbegin(); it != forked.rend(); ++it) waiting_.push_front(std::move(*it));
  const std::int64_t left = cfg_.count_backlog ? to_prefill() : 0;
  {
    std::lock_guard lk(mu_);
    if (cfg_.count_backlog) n_queued_prompt_ = left + incoming_to_prefill();
    ++stats_.steps;
    stats_.prompt_tokens += prompt_tokens;
    stats_.generated_tokens += generated;
    n_running_ = static_cast<int>(running_.size());
    n_waiting_ = static_cast<int>(waiting_.size() + incoming_.size());
  }
  for (auto& [fn, e] : events) (*fn)(e);
  events.clear();
  spare_events_.swap(events);
  return computed_tokens;
}

}  // namespace ftp::engine
