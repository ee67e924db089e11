// SPDX-License-Identifier: Apache-2.0
// The domain scheduler's fairness between request groups (issue 20, item
// 7): one request of many prompts cannot starve a small one. Counted in
// scheduler steps, not seconds, over a counting engine that computes
// nothing (every step answers token 7), so the numbers are the scheduler's
// alone. A prompt never ends on its own: every request runs to max_tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/domain.hpp"

using namespace ftp::engine;

namespace {

/// An engine that runs no model: it checks nothing and picks token 7 for
/// every row that wants one. Test-only (the scheduler's view of an engine).
/// With `shapes`, it records each forward's (sequences, rows); it throws
/// from the forward after `fail_after` of them (-1: never).
struct CountingEngine final : Engine {
  explicit CountingEngine(const ftp::model::HParams& hp, std::shared_ptr<std::vector<std::pair<int, int>>> shapes = {},
                          int fail_after = -1)
      : hp_(hp), shapes_(std::move(shapes)), fail_after_(fail_after) {}
  const ftp::model::HParams& hparams() const override { return hp_; }
  int block_tokens() const override { return 16; }
  std::uint64_t kv_bytes() const override { return 0; }
  std::vector<std::vector<float>> forward(const std::vector<SeqChunk>& chunks, int) override {
    if (shapes_) {
      if (fail_after_ >= 0 && static_cast<int>(shapes_->size()) >= fail_after_) throw ftp::BackendError("device lost");
      int n = 0;
      for (const auto& c : chunks) n += static_cast<int>(c.tokens.size());
      shapes_->emplace_back(static_cast<int>(chunks.size()), n);
    }
    std::vector<std::vector<float>> rows;
    for (const auto& c : chunks)
      if (c.want_logits) {
        rows.emplace_back(static_cast<std::size_t>(hp_.n_vocab), 0.0f);
        rows.back()[7] = 1.0f;
      }
    return rows;
  }
  const std::vector<double>& stage_busy_s() const override { return busy_; }
  ftp::model::HParams hp_;
  std::shared_ptr<std::vector<std::pair<int, int>>> shapes_;
  int fail_after_;
  std::vector<double> busy_;
};

ftp::model::HParams hparams() {
  ftp::model::HParams hp;
  hp.n_vocab = 32;
  hp.n_ctx_train = 4096;
  hp.n_layer = 1;
  hp.n_head = 1;
  hp.n_head_kv = 1;
  hp.head_dim = 1;
  return hp;
}

struct Finished {
  int count = 0;
  std::map<std::string, int> tokens;  ///< request -> tokens it got
};

GenerationRequest request(const std::string& id, const std::string& group, int prompt_tokens, int max_tokens,
                          std::shared_ptr<Finished> done) {
  GenerationRequest r;
  r.id = id;
  r.group = group;
  r.prompt.assign(static_cast<std::size_t>(prompt_tokens), 3);
  r.max_tokens = max_tokens;
  r.on_event = [done, id](const GenerationEvent& e) {
    if (e.token >= 0) ++done->tokens[id];
    if (e.finished) ++done->count;
  };
  return r;
}

std::unique_ptr<Domain> domain(int kv_blocks) {
  DomainConfig c;
  c.kv_blocks = kv_blocks;
  c.block_tokens = 16;
  c.max_batched_tokens = 256;
  c.max_running = 64;
  return std::make_unique<Domain>(hparams(), c,
                                  [](const DomainConfig&) { return std::make_unique<CountingEngine>(hparams()); });
}

/// Steps until the request "small" (8 tokens, a 4-token prompt) finishes,
/// stepping `d` with it queued now.
int steps_until_small_finishes(Domain& d, const std::shared_ptr<Finished>& done) {
  d.submit(request("small", "small", 4, 8, done));
  for (int steps = 1; steps < 100000; ++steps) {
    d.step();
    if (done->tokens["small"] == 8 && done->count > 0) return steps;
  }
  return -1;
}

// The case: a 128-prompt x 1,900-token request running, and an
// 8-token request sent meanwhile completes within 2x its unloaded time.
// The full 1,900 tokens run here (the counting engine is instant); with
// arrival-order admission the small request waited for one of the 64
// slots, i.e. ~1,900 steps.
TEST(FairScheduling, ASmallRequestBesideA128PromptRequestFinishesWithin2xItsUnloadedSteps) {
  // KV for ~50 full requests: page preemption happens too.
  const int kv_blocks = 50 * kv_pages(20 + 1900, 16);
  int unloaded = 0;
  {
    auto d = domain(kv_blocks);
    auto done = std::make_shared<Finished>();
    unloaded = steps_until_small_finishes(*d, done);
  }
  ASSERT_GT(unloaded, 0);
  EXPECT_LE(unloaded, 9);  // prefill + 7 decodes (the prefill gives the first token), with slack of one

  auto d = domain(kv_blocks);
  auto big = std::make_shared<Finished>();
  for (int i = 0; i < 128; ++i) d->submit(request("big-" + std::to_string(i), "big", 20, 1900, big));
  for (int i = 0; i < 50; ++i) d->step();
  ASSERT_EQ(d->running(), 64) << "alone, the big request uses the whole batch";
  auto small = std::make_shared<Finished>();
  const int loaded = steps_until_small_finishes(*d, small);
  ASSERT_GT(loaded, 0);
  std::printf("small request: %d steps unloaded, %d beside the 128-prompt request\n", unloaded, loaded);
  EXPECT_LE(loaded, 2 * unloaded) << "unloaded " << unloaded << " steps, beside the big request " << loaded;
  EXPECT_EQ(small->tokens["small"], 8);

  // And the big request is served whole: every prompt gets its 1,900 tokens.
  for (int i = 0; i < 200000 && big->count < 128; ++i) d->step();
  ASSERT_EQ(big->count, 128);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(big->tokens["big-" + std::to_string(i)], 1900) << "big-" << i;
  EXPECT_TRUE(d->idle());
}

TEST(FairScheduling, GroupsTakeTurnsWhenBothWait) {
  // Two groups of 64 prompts queued at once into 64 slots: round robin
  // gives each half, not the first group all.
  auto d = domain(64 * kv_pages(4 + 100, 16));
  auto done = std::make_shared<Finished>();
  for (int i = 0; i < 64; ++i) d->submit(request("a-" + std::to_string(i), "a", 4, 100, done));
  for (int i = 0; i < 64; ++i) d->submit(request("b-" + std::to_string(i), "b", 4, 100, done));
  d->step();
  int a = 0, b = 0;
  for (const auto& [id, n] : done->tokens) (id[0] == 'a' ? a : b) += n;
  EXPECT_EQ(d->running(), 64);
  EXPECT_EQ(a, 32);
  EXPECT_EQ(b, 32);
}

TEST(FairScheduling, RequestsWithoutAGroupAreEachTheirOwn) {
  // No group: each request its own, as before. 3 requests fill the batch
  // cap of 2 in arrival order; the third runs once one finishes.
  DomainConfig c;
  c.kv_blocks = 64;
  c.max_running = 2;
  Domain d(hparams(), c, [](const DomainConfig&) { return std::make_unique<CountingEngine>(hparams()); });
  auto done = std::make_shared<Finished>();
  d.submit(request("r0", "", 4, 3, done));
  d.submit(request("r1", "", 4, 3, done));
  d.submit(request("r2", "", 4, 3, done));
  d.step();
  EXPECT_EQ(done->tokens["r0"], 1);
  EXPECT_EQ(done->tokens["r1"], 1);
  EXPECT_EQ(done->tokens["r2"], 0);
  for (int i = 0; i < 20 && done->count < 3; ++i) d.step();
  EXPECT_EQ(done->count, 3);
  EXPECT_EQ(done->tokens["r2"], 3);
}

}  // namespace

// The queue's token backlog (what the gear shifter weighs against a gear's
// prefill): tokens to prefill of the waiting and the prefilling sequences,
// none of the decoding ones. max_batched_tokens 24: a 20-token prompt
// prefills in one step, two do not fit one step.
TEST(DomainQueuedPromptTokens, CountsWhatIsLeftToPrefill) {
  DomainConfig c;
  c.kv_blocks = 64;
  c.block_tokens = 16;
  c.max_batched_tokens = 24;
  c.max_running = 4;
  Domain d(hparams(), c, [](const DomainConfig&) { return std::make_unique<CountingEngine>(hparams()); });
  auto req = [&](const std::string& id) {
    GenerationRequest r;
    r.id = id;
    r.prompt.assign(20, 3);
    r.max_tokens = 5;
    r.on_event = [](const GenerationEvent&) {};
    return r;
  };
  EXPECT_EQ(d.queued_prompt_tokens(), 0);
  d.submit(req("a"));
  d.submit(req("b"));
  d.submit(req("c"));
  EXPECT_EQ(d.queued_prompt_tokens(), 60) << "submitted, not yet stepped";
  d.step();  // a prefills (20 tokens), b its first 4
  EXPECT_EQ(d.queued_prompt_tokens(), 16 + 20);
  d.step();  // a decodes, b's 16 and 7 of c's
  EXPECT_EQ(d.queued_prompt_tokens(), 13);
  for (int i = 0; i < 50 && !d.idle(); ++i) d.step();
  EXPECT_EQ(d.queued_prompt_tokens(), 0);
}

// Issue 20, a drain under full load: a draining domain gives back what has
// not started (Domain::withdraw_unstarted) and finishes only what it has
// begun. max_running 2: two requests run, the rest wait; the waiting ones
// end "withdrawn" with no token, the running ones run to max_tokens.
TEST(DomainWithdraw, GivesBackOnlyTheUnstartedAndFinishesTheRest) {
  DomainConfig c;
  c.kv_blocks = 64;
  c.block_tokens = 16;
  c.max_batched_tokens = 256;
  c.max_running = 2;
  Domain d(hparams(), c, [](const DomainConfig&) { return std::make_unique<CountingEngine>(hparams()); });
  std::map<std::string, FinishReason> reason;
  std::map<std::string, int> tokens, ends;
  auto req = [&](const std::string& id, int n) {
    GenerationRequest r;
    r.id = id;
    r.n = n;
    r.prompt.assign(20, 3);  // past one page: n > 1 choices share it
    r.max_tokens = 10;
    r.on_event = [&, id](const GenerationEvent& e) {
      if (e.token >= 0) ++tokens[id];
      if (e.finished) {
        reason[id] = e.finish_reason;
        ++ends[id];
      }
    };
    return r;
  };
  d.submit(req("a", 1));
  d.submit(req("b", 1));
  d.step();  // a and b start
  ASSERT_GT(tokens["a"] + tokens["b"], 0);
  d.submit(req("c", 1));
  d.submit(req("d", 2));
  EXPECT_EQ(d.waiting(), 2);
  d.withdraw_unstarted();
  d.step();
  EXPECT_EQ(reason["c"], FinishReason::withdrawn);
  EXPECT_EQ(reason["d"], FinishReason::withdrawn);
  EXPECT_EQ(ends["d"], 2) << "once per choice";
  EXPECT_EQ(tokens["c"] + tokens["d"], 0);
  EXPECT_EQ(d.waiting(), 0);
  // Requests queued after the call are given back too.
  d.submit(req("e", 1));
  d.step();
  EXPECT_EQ(reason["e"], FinishReason::withdrawn);
  for (int i = 0; i < 50 && !d.idle(); ++i) d.step();
  EXPECT_TRUE(d.idle());
  EXPECT_EQ(reason["a"], FinishReason::length);
  EXPECT_EQ(reason["b"], FinishReason::length);
  EXPECT_EQ(tokens["a"], 10);
  EXPECT_EQ(tokens["b"], 10);
  EXPECT_EQ(d.stats().finished, 2u) << "the withdrawn count as neither finished nor failed";
  EXPECT_EQ(d.stats().failed, 0u);
}

// Without the call nothing is given back: the queue runs on that domain.
TEST(DomainWithdraw, NothingIsGivenBackUnasked) {
  auto d = domain(64);
  auto done = std::make_shared<Finished>();
  for (int i = 0; i < 70; ++i) d->submit(request("r" + std::to_string(i), "g" + std::to_string(i), 4, 3, done));
  for (int i = 0; i < 200 && !d->idle(); ++i) d->step();
  EXPECT_EQ(done->count, 70);
  for (int i = 0; i < 70; ++i) EXPECT_EQ(done->tokens["r" + std::to_string(i)], 3);
}

namespace {

std::unique_ptr<Domain> recorded_domain(int kv_blocks, int max_running, int max_batched_tokens,
                                        std::shared_ptr<std::vector<std::pair<int, int>>> shapes, int fail_after = -1) {
  DomainConfig c;
  c.kv_blocks = kv_blocks;
  c.block_tokens = 16;
  c.max_batched_tokens = max_batched_tokens;
  c.max_running = max_running;
  return std::make_unique<Domain>(hparams(), c, [shapes, fail_after](const DomainConfig&) {
    return std::make_unique<CountingEngine>(hparams(), shapes, fail_after);
  });
}

}  // namespace

// The warm-up (issue 17: graphs captured at warm-up): one prefill of the
// step's budget over the largest batch's sequences (buffers at their
// largest), then at each batch size b one step of b one-row sequences
// (a decode's shape: the CUDA backend captures the graph of b there) and
// one decode of the same b; sizes the domain cannot hold at once are
// skipped; afterwards every page is free and the counters untouched.
TEST(WarmUp, RunsEachBatchSizeAsStepsOfThatManyOneRowSequencesAndLeavesNothing) {
  auto shapes = std::make_shared<std::vector<std::pair<int, int>>>();
  auto d = recorded_domain(100, 16, 64, shapes);
  WarmUpPlan plan;
  plan.batch_sizes = {8, 1, 2, 4, 32, 16, 16};
  plan.prefill_tokens = 500;
  plan.token = 3;
  const WarmUpResult r = d->warm_up(plan);
  EXPECT_EQ(r.batch_sizes, (std::vector<int>{1, 2, 4, 8, 16})) << "32 is over max_running";
  EXPECT_EQ(r.prefill_tokens, 64) << "the step's token budget";
  std::vector<std::pair<int, int>> want = {{16, 64}};  // 64 tokens over the largest batch's 16 sequences
  for (int b : {1, 2, 4, 8, 16}) {
    want.emplace_back(b, b);  // b prompts of one token: one row each
    want.emplace_back(b, b);  // their decode
  }
  EXPECT_EQ(*shapes, want);
  EXPECT_TRUE(d->idle());
  EXPECT_EQ(d->kv_usage(), 0.0) << "the dummies' pages are free again";
  const DomainStats s = d->stats();
  EXPECT_EQ(s.steps + s.prompt_tokens + s.generated_tokens + s.finished + s.failed + s.preemptions, 0u)
      << "the dummies count as no traffic";
  // A request after it runs as on a fresh domain.
  auto done = std::make_shared<Finished>();
  d->submit(request("real", "real", 4, 3, done));
  while (!d->idle()) d->step();
  EXPECT_EQ(done->tokens["real"], 3);
  EXPECT_EQ(d->stats().finished, 1u);
}

TEST(WarmUp, SkipsBatchSizesItsKvPagesOrTokenBudgetCannotHold) {
  auto shapes = std::make_shared<std::vector<std::pair<int, int>>>();
  // 5 pages of 16: at most 5 one-page sequences, a prefill of at most 80 tokens.
  auto d = recorded_domain(5, 64, 256, shapes);
  WarmUpPlan plan;
  plan.batch_sizes = {1, 2, 4, 8};
  plan.prefill_tokens = 256;
  const WarmUpResult r = d->warm_up(plan);
  EXPECT_EQ(r.batch_sizes, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(r.prefill_tokens, 80);
  EXPECT_EQ(shapes->front(), (std::pair<int, int>{1, 80})) << "5 pages hold 80 tokens as one sequence only";
  EXPECT_EQ(d->kv_usage(), 0.0);
  shapes->clear();
  auto tight = recorded_domain(100, 64, 3, shapes);  // a step of 3 tokens
  plan.prefill_tokens = 0;
  EXPECT_EQ(tight->warm_up(plan).batch_sizes, (std::vector<int>{1, 2}));
  EXPECT_EQ(shapes->front(), (std::pair<int, int>{1, 1})) << "no prefill asked";
}

TEST(WarmUp, AFailedDummyFailsTheWarmUpNamingTheDomainAndTheError) {
  auto shapes = std::make_shared<std::vector<std::pair<int, int>>>();
  auto d = recorded_domain(100, 16, 64, shapes, 2);
  WarmUpPlan plan;
  plan.batch_sizes = {1, 2, 4};
  try {
    d->warm_up(plan);
    FAIL() << "no error";
  } catch (const WarmUpError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("domain d0: warm-up: "), std::string::npos) << what;
    EXPECT_NE(what.find("device lost"), std::string::npos) << what;
  }
  EXPECT_EQ(d->kv_usage(), 0.0);
}
