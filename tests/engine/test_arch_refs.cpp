// SPDX-License-Identifier: Apache-2.0
// The CPU engine against llama.cpp on the synthetic architecture and
// quantization models of ../shared/data/models/arch-refs: for every model
// file the engine supports (tests/support/llama_refs.cpp) and every prompt
// of references.jsonl, at TP 1 and at the largest TP x PP the shapes allow,
// the first-step logits within the model's relative tolerance and the 32
// greedy tokens equal to llama.cpp's, except at a near-tie.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "engine/weight_store.hpp"
#include "llama_refs.hpp"
#include "model/model.hpp"

namespace {

using namespace ftp::test;

class ArchRefs : public ::testing::TestWithParam<RefModel> {
 protected:
  static inline std::vector<LlamaRef> refs;
  static inline std::string missing;
  static void SetUpTestSuite() {
    const std::string path = arch_refs_dir() + "/references.jsonl";
    if (!std::filesystem::exists(path)) {
      missing = path;
      return;
    }
    refs = read_llama_refs(path);
  }
};

TEST_P(ArchRefs, MatchesLlamaCpp) {
  if (!missing.empty()) GTEST_SKIP() << missing << " not found (set FTP_TEST_DATA)";
  const RefModel& rm = GetParam();
  const std::string file = arch_refs_dir() + "/" + rm.file;
  if (!std::filesystem::exists(file)) GTEST_SKIP() << file << " not found";
  const auto mine = refs_of_model(refs, rm.file);
  ASSERT_FALSE(mine.empty()) << rm.file << " has no line in references.jsonl";
  const RefTolerance tol = tolerance_of(rm.weights);

  const auto model = std::make_unique<ftp::model::Model>(ftp::model::load_model(file));
  const ftp::engine::WeightStore store(*model);
  for (const RefGear& gear : ref_gears(store)) {
    for (const LlamaRef& ref : mine) {
      const std::string what = std::string(rm.file) + " \"" + ref.prompt + "\" at " + gear.name;
      const RefOutcome o = run_llama_ref(store, gear, ref, tol);
      EXPECT_EQ(o.tokenize_failure, "") << what;
      EXPECT_LT(o.logit_error, tol.logit_rel) << what << ": first-step logits differ from llama.cpp's";
      EXPECT_EQ(o.token_failure, "") << what;
      std::printf("%-28s %-18s %-26s logits %.2e%s\n", rm.file, ("\"" + ref.prompt + "\"").c_str(), gear.name.c_str(),
                  o.logit_error,
                  o.excused_step >= 0 ? (" (near-tie at step " + std::to_string(o.excused_step) + ")").c_str() : "");
    }
  }
}

TEST(ArchRefsRules, NearTieExcusesOnlyTheRunnerUpBelowTheTolerance) {
  LlamaRef r;
  r.tokens = {5, 6, 7};
  r.margins = {0.5f, 0.05f, 0.5f};
  r.runner_up = {9, 8, 4};
  int step = 0;
  EXPECT_EQ(compare_greedy(r, {5, 6, 7}, 1e-3, &step), "");
  EXPECT_EQ(step, -1);
  // The runner-up at margin 0.05: excused under 0.1, not under 1e-3.
  EXPECT_EQ(compare_greedy(r, {5, 8, 1}, 0.1, &step), "");
  EXPECT_EQ(step, 1);
  EXPECT_NE(compare_greedy(r, {5, 8, 1}, 1e-3), "");
  // Another id than the runner-up, or a divergence at a wide margin.
  EXPECT_NE(compare_greedy(r, {5, 3, 7}, 0.1), "");
  EXPECT_NE(compare_greedy(r, {9, 6, 7}, 0.1), "");
  EXPECT_NE(compare_greedy(r, {5, 6}, 0.1), "");
  EXPECT_DOUBLE_EQ(relative_logit_error({2, -4}, {2.5f, -4}), 0.125);
  EXPECT_GT(relative_logit_error({1, 2}, {1, std::nanf("")}), 1.0);
}

TEST_F(ArchRefs, AnotherModelsReferencesFail) {
  // The harness must tell models apart: llama-BF16's weights are llama-f32's
  // rounded, and fail llama-f32's references at the F32 tolerance.
  if (!missing.empty()) GTEST_SKIP() << missing << " not found (set FTP_TEST_DATA)";
  const std::string file = arch_refs_dir() + "/llama-BF16.gguf";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << file << " not found";
  const auto model = std::make_unique<ftp::model::Model>(ftp::model::load_model(file));
  const ftp::engine::WeightStore store(*model);
  const auto f32 = refs_of_model(refs, "llama-f32.gguf");
  ASSERT_FALSE(f32.empty());
  const RefOutcome o = run_llama_ref(store, ref_gears(model->hparams).at(0), f32[0], kF32Tolerance);
  EXPECT_GT(o.logit_error, kF32Tolerance.logit_rel);
}

TEST_F(ArchRefs, EachArchitectureFeatureIsNeeded) {
  // The arch-refs README's sensitivity table, on the engine: each model with
  // one of its features turned off fails its references at TP 1, so passing
  // them shows that feature is applied. Ignoring rope_freqs changes no token
  // at these positions, only the logits (by ~4e-4 of max |logit|).
  if (!missing.empty()) GTEST_SKIP() << missing << " not found (set FTP_TEST_DATA)";
  struct Variant {
    const char* file;
    const char* change;
    void (*apply)(ftp::model::Model&);
  };
  const Variant variants[] = {
      {"llama3-ropefreqs-f32.gguf", "without rope_freqs", [](ftp::model::Model& m) { m.weights.rope_freqs = {}; }},
      {"llama-f32.gguf", "with NEOX RoPE", [](ftp::model::Model& m) { m.hparams.rope_type = ftp::model::RopeType::neox; }},
      {"qwen2-f32.gguf", "with llama's RoPE", [](ftp::model::Model& m) { m.hparams.rope_type = ftp::model::RopeType::norm; }},
      {"qwen2-f32.gguf", "without q/k/v biases",
       [](ftp::model::Model& m) {
         for (auto& l : m.weights.layers) l.bq = l.bk = l.bv = {};
       }},
      {"qwen3-f32.gguf", "without q/k norms",
       [](ftp::model::Model& m) {
         for (auto& l : m.weights.layers) l.q_norm = l.k_norm = {};
       }},
  };
  for (const Variant& var : variants) {
    const std::string file = arch_refs_dir() + "/" + var.file;
    if (!std::filesystem::exists(file)) GTEST_SKIP() << file << " not found";
    auto model = std::make_unique<ftp::model::Model>(ftp::model::load_model(file));
    var.apply(*model);
    const ftp::engine::WeightStore store(*model);
    int failed = 0;
    for (const LlamaRef& ref : refs_of_model(refs, var.file)) {
      const RefOutcome o = run_llama_ref(store, ref_gears(model->hparams).at(0), ref, kF32Tolerance);
      failed += o.logit_error >= kF32Tolerance.logit_rel || !o.token_failure.empty();
    }
    // The BOS-only prompt cannot see RoPE in its first logits; the others must fail.
    EXPECT_GE(failed, 3) << var.file << " " << var.change << " passed llama.cpp's references";
  }
}

std::string test_name(const ::testing::TestParamInfo<RefModel>& info) {
  std::string s = info.param.file;
  if (auto dot = s.rfind(".gguf"); dot != std::string::npos) s.resize(dot);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Models, ArchRefs, ::testing::ValuesIn(supported_ref_models()), test_name);

}  // namespace
