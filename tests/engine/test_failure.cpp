// SPDX-License-Identifier: Apache-2.0
// Failures inside a step: a rank of a TP-2 stage that throws (rank 0 or
// rank 1) fails that step's requests with an error event and nothing hangs;
// the stage's collectives are restored, so the domain serves on with the
// same outputs; where a backend cannot restore them the domain reports its
// failure and fails later requests with it. A request that finishes in a
// step that then fails for another request keeps its one finish event. And
// the micro-batch split of a step's chunks, and cancellation.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/domain.hpp"
#include "engine/rank_backend.hpp"
#include "model/model.hpp"
#include "forwarding_rank.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp::engine;

namespace {

/// The CPU backend with a failure injected once into one rank's set_batch
/// (before any collective of the step), and optionally no recovery.
struct Faults {
  std::atomic<int> fail_rank{-1};  ///< rank whose next set_batch throws; -1: none
  bool can_recover = true;
  /// Stage -> the call of set_batch at which its rank 1 throws (1: the first).
  std::map<int, int> stage_call;
};

struct FaultyRank final : ftp::testing::ForwardingRank {
  FaultyRank(std::unique_ptr<RankBackend> b, int rank, int stage, Faults& f)
      : ForwardingRank(std::move(b)), rank_(rank), stage_(stage), f_(f) {}
  void set_batch(const BatchLayout& l) override {
    int want = rank_;
    if (f_.fail_rank.compare_exchange_strong(want, -1)) throw std::runtime_error("injected: out of memory");
    if (auto it = f_.stage_call.find(stage_); rank_ == 1 && it != f_.stage_call.end() && ++calls_ == it->second)
      throw std::runtime_error("injected: out of memory");
    b_->set_batch(l);
  }
  bool recover() noexcept override { return f_.can_recover && b_->recover(); }

 private:
  int rank_, stage_, calls_ = 0;
  Faults& f_;
};

struct FaultyBackend final : Backend {
  explicit FaultyBackend(Faults& f) : f_(f) {}
  std::string name() const override { return "cpu"; }
  std::vector<std::unique_ptr<RankBackend>> make_stage(const WeightStore& w, const std::vector<RankSpec>& s) override {
    auto ranks = cpu_backend().make_stage(w, s);
    std::vector<std::unique_ptr<RankBackend>> out;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      out.push_back(std::make_unique<FaultyRank>(std::move(ranks[i]), static_cast<int>(i), s[i].stage, f_));
    return out;
  }
  Faults& f_;
};

struct Outcome {
  std::string reason, error;
  std::vector<int> tokens;
  int finishes = 0;
};

struct FailureTest : ::testing::Test {
  static inline std::unique_ptr<ftp::model::Model> model;
  static inline std::unique_ptr<WeightStore> store;
  static void SetUpTestSuite() {
    const std::string path = (std::filesystem::temp_directory_path() / "ftp-test-failure.gguf").string();
    ftp::testing::write_synthetic_gguf(path, ftp::testing::small_shape(400, 7));
    model = std::make_unique<ftp::model::Model>(ftp::model::load_model(path));
    store = std::make_unique<WeightStore>(*model);
  }
  static void TearDownTestSuite() {
    store.reset();
    model.reset();
  }

  /// An on_event that records each request's outcome into `out`.
  static std::function<void(const GenerationEvent&)> recorder(std::shared_ptr<std::map<std::string, Outcome>> out) {
    return [out](const GenerationEvent& e) {
      Outcome& o = (*out)[e.request_id];
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (e.finished) {
        ++o.finishes;
        o.reason = ftp::engine::to_string(e.finish_reason);
        o.error = e.error;
      }
    };
  }
  /// Runs the requests (submitted together) to the end; each one's outcome.
  static std::map<std::string, Outcome> run(Domain& d, const std::vector<GenerationRequest>& reqs) {
    auto out = std::make_shared<std::map<std::string, Outcome>>();
    for (GenerationRequest r : reqs) {
      r.on_event = recorder(out);
      d.submit(r);
    }
    for (int guard = 0; !d.idle() && guard < 10000; ++guard) d.step();
    EXPECT_TRUE(d.idle());
    return *out;
  }
  static GenerationRequest req(const std::string& id, int max_tokens = 6) {
    GenerationRequest r;
    r.id = id;
    r.prompt = {1, 5, 9};
    r.max_tokens = max_tokens;
    return r;
  }
  static DomainConfig tp2(Backend& b) {
    DomainConfig c;
    c.stages = {StageLayout{0, 2, 2}};
    c.kv_blocks = 32;
    c.backend = &b;
    return c;
  }
};

}  // namespace

TEST_F(FailureTest, EitherRankFailingFailsOnlyThatStepAndTheDomainServesOn) {
  for (int rank : {0, 1}) {
    SCOPED_TRACE("failing rank " + std::to_string(rank));
    Faults f;
    FaultyBackend b(f);
    Domain d(*store, tp2(b));
    auto before = run(d, {req("before")})["before"];
    ASSERT_EQ(before.reason, "length");
    f.fail_rank = rank;  // before any collective of its next step: its peer waits in the first all-reduce
    auto hit = run(d, {req("hit")})["hit"];
    EXPECT_EQ(hit.reason, "error");
    EXPECT_NE(hit.error.find("injected"), std::string::npos) << hit.error;
    EXPECT_EQ(hit.finishes, 1);
    EXPECT_TRUE(d.failure().empty()) << d.failure();
    auto after = run(d, {req("after")})["after"];
    EXPECT_EQ(after.reason, "length") << after.error;
    EXPECT_EQ(after.tokens, before.tokens);
    EXPECT_EQ(d.kv_usage(), 0.0);
  }
}

TEST_F(FailureTest, UnrecoverableStageFailsTheDomainWithAClearError) {
  Faults f;
  f.can_recover = false;
  FaultyBackend b(f);
  Domain d(*store, tp2(b));
  f.fail_rank = 1;
  EXPECT_EQ(run(d, {req("hit")})["hit"].reason, "error");
  EXPECT_NE(d.failure().find("cannot be restored"), std::string::npos) << d.failure();
  auto later = run(d, {req("later")})["later"];
  EXPECT_EQ(later.reason, "error");
  EXPECT_NE(later.error.find("cannot be restored"), std::string::npos) << later.error;
  EXPECT_EQ(d.kv_usage(), 0.0);
}

TEST_F(FailureTest, ARequestFinishedInAFailingStepKeepsItsOneFinish) {
  DomainConfig c;
  c.kv_blocks = 32;
  Domain d(*store, c);
  GenerationRequest a = req("a", 3);  // ends with "length" at its third token
  GenerationRequest b = req("b", 10);
  int calls = 0;
  b.stop_check = [&calls](int, const std::vector<int>&) {
    if (++calls == 3) throw std::runtime_error("stop check failed");
    return false;
  };
  auto out = run(d, {a, b});
  EXPECT_EQ(out["a"].finishes, 1);
  EXPECT_EQ(out["a"].reason, "length");
  EXPECT_EQ(out["b"].finishes, 1);
  EXPECT_EQ(out["b"].reason, "error");
  EXPECT_EQ(d.stats().finished + d.stats().failed, 2u);
}

namespace {
std::vector<int> group_tokens(const std::vector<std::vector<const SeqChunk*>>& groups) {
  std::vector<int> out;
  for (const auto& g : groups) {
    int n = 0;
    for (const SeqChunk* c : g) n += static_cast<int>(c->tokens.size());
    out.push_back(n);
  }
  return out;
}
std::vector<SeqChunk> chunks_of(const std::vector<int>& sizes) {
  std::vector<SeqChunk> out;
  for (int n : sizes) {
    SeqChunk c;
    c.tokens.assign(static_cast<std::size_t>(n), 1);
    out.push_back(std::move(c));
  }
  return out;
}
}  // namespace

TEST(MicroBatches, ALargeChunkAfterSmallOnesGetsAGroupOfItsOwn) {
  std::vector<int> decodes_then_prefill(8, 1);
  decodes_then_prefill.push_back(200);
  auto c1 = chunks_of(decodes_then_prefill);
  EXPECT_EQ(group_tokens(split_micro_batches(c1, 2)), (std::vector<int>{8, 200}));
  auto c2 = chunks_of({30, 30, 30, 100});
  EXPECT_EQ(group_tokens(split_micro_batches(c2, 4)), (std::vector<int>{60, 30, 100}));
  auto c3 = chunks_of({10, 10, 10, 10});
  EXPECT_EQ(group_tokens(split_micro_batches(c3, 2)), (std::vector<int>{20, 20}));
  EXPECT_EQ(group_tokens(split_micro_batches(c3, 4)), (std::vector<int>{10, 10, 10, 10}));
  EXPECT_EQ(group_tokens(split_micro_batches(c3, 8)), (std::vector<int>{10, 10, 10, 10}));
  // Every chunk once, in order, in at most m non-empty groups, for many shapes.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int> sizes(1 + rng() % 12);
    for (int& s : sizes) s = 1 + static_cast<int>(rng() % 300);
    auto cs = chunks_of(sizes);
    const int m = 1 + static_cast<int>(rng() % 6);
    auto groups = split_micro_batches(cs, m);
    ASSERT_LE(static_cast<int>(groups.size()), m);
    std::size_t next = 0;
    for (const auto& g : groups) {
      ASSERT_FALSE(g.empty());
      for (const SeqChunk* c : g) ASSERT_EQ(c, &cs[next++]);
    }
    ASSERT_EQ(next, cs.size());
  }
}

TEST_F(FailureTest, CancelledRequestsLeaveAtTheNextStepAndOthersAreUntouched) {
  DomainConfig c;
  c.kv_blocks = 32;
  c.max_running = 1;  // "later" waits while "running" runs
  Domain d(*store, c);
  auto alone = run(d, {req("alone", 20)})["alone"];
  auto out = std::make_shared<std::map<std::string, Outcome>>();
  for (const char* id : {"running", "later", "kept"}) {
    GenerationRequest r = req(id, 20);
    r.on_event = recorder(out);
    d.submit(r);
  }
  d.step();
  d.step();
  d.cancel("running");
  d.cancel("later");
  d.cancel("not-here");  // forgotten at the next step
  for (int guard = 0; !d.idle() && guard < 1000; ++guard) d.step();
  EXPECT_EQ((*out)["running"].reason, "cancelled");
  EXPECT_EQ((*out)["running"].finishes, 1);
  EXPECT_LT((*out)["running"].tokens.size(), 20u);
  EXPECT_EQ((*out)["later"].reason, "cancelled");
  EXPECT_TRUE((*out)["later"].tokens.empty());
  EXPECT_EQ((*out)["kept"].reason, "length");
  EXPECT_EQ((*out)["kept"].tokens, alone.tokens);
  EXPECT_EQ(d.kv_usage(), 0.0);
  EXPECT_EQ(d.stats().failed, 0u);
}

// Two stages of one pipeline tick fail together (TP 2 x PP 2, two
// micro-batches: stage 0's second micro-batch and stage 1's first): each
// aborts its own collectives, so the forward throws instead of leaving a
// peer waiting for ever, and the next forward runs.
TEST_F(FailureTest, TwoStagesFailingInOneTickBothRecover) {
  Faults f;
  f.stage_call = {{0, 2}, {1, 1}};
  FaultyBackend be(f);
  Executor ex(*store, {{0, 1, 2}, {1, 1, 2}}, 16, 16, &be);
  std::vector<int> ba = {0}, bb = {1};
  std::vector<SeqChunk> cs(2);
  cs[0].blocks = &ba, cs[0].tokens = {1, 2, 3}, cs[0].want_logits = true;
  cs[1].blocks = &bb, cs[1].tokens = {4, 5, 6}, cs[1].want_logits = true;
  auto run = [&] {
    return std::async(std::launch::async, [&] {
      try {
        ex.forward(cs, 2);
        return std::string("ok");
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    });
  };
  auto first = run();
  ASSERT_EQ(first.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the forward hung";
  EXPECT_NE(first.get().find("injected"), std::string::npos);
  auto second = run();
  ASSERT_EQ(second.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the forward hung";
  EXPECT_EQ(second.get(), "ok");
}
