// SPDX-License-Identifier: Apache-2.0
// The vocabulary-parallel head (engine::Executor, RankBackend::
// gather_columns): at TP 2 and 4 on a vocabulary that does not divide
// evenly, only rank 0 of the last stage asks for full logits rows, every
// rank asks for its slice only, the chosen tokens are TP 1's and the logits
// TP 1's to rounding (each logit is one product, copied; the layers'
// all-reduces round differently from TP 1), and the head's floats per row of each rank are what the
// planner counts for it (plan::head_floats_per_row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/executor.hpp"
#include "engine/rank_backend.hpp"
#include "model/model.hpp"
#include "plan/cost_model.hpp"
#include "plan/model_shape.hpp"
#include "forwarding_rank.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp::engine;

namespace {

/// The most floats each (stage, rank) asked for of each head buffer.
struct HeadBuffers {
  std::mutex mu;
  std::map<std::pair<int, int>, std::map<Buf, std::size_t>> asked;
};

struct RecordingRank final : ftp::testing::ForwardingRank {
  RecordingRank(std::unique_ptr<RankBackend> b, int stage, int rank, HeadBuffers& h)
      : ForwardingRank(std::move(b)), stage_(stage), rank_(rank), h_(h) {}
  float* buffer(Buf id, std::size_t n) override {
    if (id == Buf::logits || id == Buf::logits_part || id == Buf::logits_gather) {
      std::lock_guard lk(h_.mu);
      auto& m = h_.asked[{stage_, rank_}][id];
      m = std::max(m, n);
    }
    return b_->buffer(id, n);
  }

 private:
  int stage_, rank_;
  HeadBuffers& h_;
};

struct RecordingBackend final : Backend {
  HeadBuffers h;
  std::string name() const override { return "cpu"; }
  std::vector<std::unique_ptr<RankBackend>> make_stage(const WeightStore& w, const std::vector<RankSpec>& s) override {
    auto ranks = cpu_backend().make_stage(w, s);
    std::vector<std::unique_ptr<RankBackend>> out;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      out.push_back(std::make_unique<RecordingRank>(std::move(ranks[i]), s[i].stage, static_cast<int>(i), h));
    return out;
  }
};

struct VocabHead : ::testing::Test {
  static inline std::unique_ptr<ftp::model::Model> model;
  static inline std::unique_ptr<WeightStore> store;
  static constexpr int kVocab = 401;  // 201 + 200 at TP 2, 101 + 3 x 100 at TP 4
  static void SetUpTestSuite() {
    const std::string path = (std::filesystem::temp_directory_path() / "ftp-test-vocab-head.gguf").string();
    ftp::testing::write_synthetic_gguf(path, ftp::testing::small_shape(kVocab, 11));
    model = std::make_unique<ftp::model::Model>(ftp::model::load_model(path));
    store = std::make_unique<WeightStore>(*model);
  }
  static void TearDownTestSuite() {
    store.reset();
    model.reset();
  }
};

/// Three sequences' prompts in one step, each wanting its last logits.
struct Step {
  std::vector<std::vector<int>> blocks{{0}, {1}, {2}};
  std::vector<SeqChunk> chunks;
  Step() {
    const std::vector<std::vector<int>> prompts{{1, 17, 230}, {5, 399, 400, 42}, {200, 201}};
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      SeqChunk c;
      c.blocks = &blocks[i];
      c.tokens = prompts[i];
      c.want_logits = true;
      chunks.push_back(c);
    }
  }
};

TEST_F(VocabHead, OnlyRankZeroHoldsFullRowsAndTheLogitsAreTp1s) {
  Step step;
  Executor tp1(*store, {StageLayout(0, 2, 1)}, 8, 16);
  const auto ref = tp1.forward(step.chunks, 1);
  const std::vector<TokenChoice> greedy(step.chunks.size());
  const auto ref_tokens = tp1.forward_choose(step.chunks, 1, greedy);
  const std::size_t rows = step.chunks.size();
  for (const auto& stages : std::vector<std::vector<StageLayout>>{
           {StageLayout(0, 2, 2)}, {StageLayout(0, 2, 4)}, {StageLayout(0, 1, 4), StageLayout(1, 1, 2)}}) {
    RecordingBackend be;
    Executor ex(*store, stages, 8, 16, &be);
    const int last = static_cast<int>(stages.size()) - 1, tp = stages.back().tp;
    const std::string what = "last stage tp " + std::to_string(tp) + " of " + std::to_string(stages.size());
    const auto got = ex.forward(step.chunks, stages.size() > 1 ? 2 : 1);
    ASSERT_EQ(got.size(), ref.size()) << what;
    // The layers' all-reduces add partial products in another order than
    // TP 1's products, so the logits agree to rounding; a slice in the
    // wrong columns, or one missing, would not.
    for (std::size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(got[i].size(), ref[i].size()) << what;
      for (std::size_t v = 0; v < ref[i].size(); ++v)
        ASSERT_NEAR(got[i][v], ref[i][v], 1e-3f * std::max(1.0f, std::abs(ref[i][v])))
            << what << ": row " << i << " logit " << v;
    }
    EXPECT_EQ(ex.forward_choose(step.chunks, 1, greedy), ref_tokens) << what;

    ftp::plan::ModelShape shape = ftp::plan::model_shape_of(*model, "vocab-head");
    std::size_t sum_slices = 0;
    for (int r = 0; r < tp; ++r) {
      auto asked = be.h.asked[{last, r}];
      const std::size_t slice = asked[Buf::logits_part];
      EXPECT_EQ(slice % rows, 0u) << what;
      sum_slices += slice / rows;
      if (r == 0)
        EXPECT_EQ(asked[Buf::logits], rows * kVocab) << what << ": rank 0's full rows";
      else
        EXPECT_EQ(asked.count(Buf::logits), 0u) << what << ": rank " << r << " asked for full rows";
      EXPECT_EQ(asked.count(Buf::logits_gather), 0u) << what;  // the CPU places slices directly
      const std::size_t held = asked[Buf::logits] + asked[Buf::logits_part];
      EXPECT_EQ(static_cast<double>(held) / rows, ftp::plan::head_floats_per_row(shape, tp, r, false))
          << what << ": rank " << r;
      // No other stage computes logits.
      for (int s = 0; s < last; ++s) EXPECT_EQ(be.h.asked.count({s, r}), 0u) << what;
    }
    EXPECT_EQ(sum_slices, static_cast<std::size_t>(kVocab)) << what;
  }
}

}  // namespace
