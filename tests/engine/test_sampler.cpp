// SPDX-License-Identifier: Apache-2.0
// The sampler against answers computed by hand: temperature, top-k and
// top-p on a few logits with known uniform draws, and the frequencies of
// many seeded draws against the renormalized distribution. Sampler and
// choose_token share one rule (pick), so comparing the two cannot see a
// bug inside it; these tests compare against arithmetic done here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/sampler.hpp"

using namespace ftp::engine;

namespace {

/// Logits whose softmax at temperature 1 is `probs` exactly (up to float rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

int choose(const std::vector<float>& l, float temperature, float top_p, double u) {
  return choose_token(l.data(), l.size(), TokenChoice{temperature, top_p, u});
}

/// The first uniform draw of a request with this seed: the Sampler's random
/// stream is std::mt19937_64(seed) through uniform_real_distribution<double>(0, 1)
/// (sampler.hpp: "same seed, same tokens"), computed here independently.
double first_draw(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  return std::uniform_real_distribution<double>(0.0, 1.0)(g);
}

/// The token a cumulative distribution `cdf` (hand-computed) gives for draw u:
/// the first whose cumulative mass exceeds u.
int token_of(const std::vector<double>& cdf, double u) {
  for (std::size_t i = 0; i < cdf.size(); ++i)
    if (u < cdf[i]) return static_cast<int>(i);
  return static_cast<int>(cdf.size()) - 1;
}

}  // namespace

// Probabilities 0.5 / 0.3 / 0.2 at temperature 1: cumulative 0.5, 0.8, 1.0.
TEST(SamplerByHand, TemperatureOneDrawsFromTheSoftmax) {
  const auto l = logits_of({0.5, 0.3, 0.2});
  EXPECT_EQ(choose(l, 1.0f, 1.0f, 0.00), 0);
  EXPECT_EQ(choose(l, 1.0f, 1.0f, 0.49), 0);
  EXPECT_EQ(choose(l, 1.0f, 1.0f, 0.51), 1);
  EXPECT_EQ(choose(l, 1.0f, 1.0f, 0.79), 1);
  EXPECT_EQ(choose(l, 1.0f, 1.0f, 0.81), 2);
  EXPECT_EQ(choose(l, 1.0f, 1.0f, 0.999), 2);
  // The order of the logits is not the order of the ids: sorted by logit.
  const auto shuffled = logits_of({0.2, 0.5, 0.3});  // ids 1, 2, 0 by probability
  EXPECT_EQ(choose(shuffled, 1.0f, 1.0f, 0.49), 1);
  EXPECT_EQ(choose(shuffled, 1.0f, 1.0f, 0.51), 2);
  EXPECT_EQ(choose(shuffled, 1.0f, 1.0f, 0.81), 0);
}

// Temperature 2 takes the square root of each probability before
// renormalizing: sqrt(0.5), sqrt(0.3), sqrt(0.2) = 0.70711, 0.54772, 0.44721,
// sum 1.70204 -> 0.41545, 0.32180, 0.26275; cumulative 0.41545, 0.73725, 1.
// Temperature 0.5 squares them: 0.25, 0.09, 0.04 / 0.38 -> 0.65789, 0.23684,
// 0.10526; cumulative 0.65789, 0.89474, 1.
TEST(SamplerByHand, TemperatureDividesTheLogits) {
  const auto l = logits_of({0.5, 0.3, 0.2});
  EXPECT_EQ(choose(l, 2.0f, 1.0f, 0.41), 0);
  EXPECT_EQ(choose(l, 2.0f, 1.0f, 0.42), 1);  // 0 at temperature 1 (0.42 < 0.5)
  EXPECT_EQ(choose(l, 2.0f, 1.0f, 0.73), 1);
  EXPECT_EQ(choose(l, 2.0f, 1.0f, 0.74), 2);  // 1 at temperature 1 (0.74 < 0.8)
  EXPECT_EQ(choose(l, 0.5f, 1.0f, 0.65), 0);  // 1 at temperature 1
  EXPECT_EQ(choose(l, 0.5f, 1.0f, 0.66), 1);
  EXPECT_EQ(choose(l, 0.5f, 1.0f, 0.89), 1);  // 2 at temperature 1
  EXPECT_EQ(choose(l, 0.5f, 1.0f, 0.90), 2);
  // Temperature 0 is greedy whatever the draw.
  EXPECT_EQ(choose(l, 0.0f, 1.0f, 0.99), 0);
}

// Top-p keeps the smallest prefix (by probability) whose mass reaches p and
// renormalizes it.
TEST(SamplerByHand, TopPKeepsTheSmallestPrefixReachingP) {
  const auto l = logits_of({0.5, 0.3, 0.2});
  // p = 0.9: 0.5 and 0.8 fall short, so all three tokens stay: cumulative
  // 0.5, 0.8, 1 (a draw of 0.85 is token 2; with two kept, 0.625 / 0.375,
  // it would be token 1).
  EXPECT_EQ(choose(l, 1.0f, 0.9f, 0.85), 2);
  EXPECT_EQ(choose(l, 1.0f, 0.9f, 0.79), 1);
  // p = 0.7: 0.8 reaches it, two stay: 0.5 / 0.8 = 0.625 and 0.375;
  // cumulative 0.625, 1.
  EXPECT_EQ(choose(l, 1.0f, 0.7f, 0.62), 0);
  EXPECT_EQ(choose(l, 1.0f, 0.7f, 0.63), 1);  // 0.63 > 0.5: 1 without the cut too
  EXPECT_EQ(choose(l, 1.0f, 0.7f, 0.99), 1);  // 2 without the cut
  // p = 0.4: the first token alone reaches it.
  for (double u : {0.0, 0.5, 0.99}) EXPECT_EQ(choose(l, 1.0f, 0.4f, u), 0) << u;
  // Four tokens 0.4 / 0.3 / 0.2 / 0.1 and p = 0.85: 0.4, 0.7, 0.9 -> three
  // stay, renormalized by 0.9: 0.44444, 0.33333, 0.22222; cumulative
  // 0.44444, 0.77778, 1.
  const auto four = logits_of({0.4, 0.3, 0.2, 0.1});
  EXPECT_EQ(choose(four, 1.0f, 0.85f, 0.44), 0);
  EXPECT_EQ(choose(four, 1.0f, 0.85f, 0.45), 1);
  EXPECT_EQ(choose(four, 1.0f, 0.85f, 0.77), 1);
  EXPECT_EQ(choose(four, 1.0f, 0.85f, 0.78), 2);
  EXPECT_EQ(choose(four, 1.0f, 0.85f, 0.999), 2);  // token 3 is cut
  // Temperature first, then the cut: at temperature 2 (0.41545, 0.32180,
  // 0.26275) p = 0.7 is reached at 0.73725, so two stay (at temperature 1
  // too, but with other weights): 0.41545 / 0.73725 = 0.56351 and 0.43649.
  EXPECT_EQ(choose(l, 2.0f, 0.7f, 0.56), 0);
  EXPECT_EQ(choose(l, 2.0f, 0.7f, 0.57), 1);
  EXPECT_EQ(choose(l, 2.0f, 0.7f, 0.99), 1);
}

// Top-k (the host sampler only) keeps the k most likely tokens. The draws
// are the first uniform of each seed's stream.
TEST(SamplerByHand, TopKKeepsTheKMostLikely) {
  const std::vector<double> probs = {0.1, 0.5, 0.25, 0.15};  // ids by probability: 1, 2, 3, 0
  const auto l = logits_of(probs);
  // k = 2: ids 1 and 2, 0.5 / 0.75 = 0.66667 and 0.33333.
  const std::vector<double> cdf2 = {2.0 / 3.0, 1.0};
  const std::vector<int> ids2 = {1, 2};
  // k = 3: ids 1, 2, 3 over 0.9: 0.55556, 0.27778, 0.16667.
  const std::vector<double> cdf3 = {0.5 / 0.9, 0.75 / 0.9, 1.0};
  const std::vector<int> ids3 = {1, 2, 3};
  int tested_edge = 0;
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    const double u = first_draw(seed);
    Sampler k2(SamplingParams{1.0f, 2, 1.0f, seed});
    EXPECT_EQ(k2.sample(l), ids2[static_cast<std::size_t>(token_of(cdf2, u))]) << "seed " << seed << " u " << u;
    Sampler k3(SamplingParams{1.0f, 3, 1.0f, seed});
    EXPECT_EQ(k3.sample(l), ids3[static_cast<std::size_t>(token_of(cdf3, u))]) << "seed " << seed << " u " << u;
    // Draws in (0.5, 0.66667) pick id 2 from the full distribution and id 1 under k = 2.
    tested_edge += u > 0.5 && u < 2.0 / 3.0;
  }
  EXPECT_GT(tested_edge, 0) << "no seed drew between 0.5 and 0.667: the k = 2 cut went untested";
  // k = 1 is greedy, k >= n is no cut.
  for (std::uint64_t seed = 0; seed < 8; ++seed) EXPECT_EQ(Sampler(SamplingParams{1.0f, 1, 1.0f, seed}).sample(l), 1);
  const std::vector<double> cdf_all = {0.5, 0.75, 0.9, 1.0};
  const std::vector<int> ids_all = {1, 2, 3, 0};
  for (std::uint64_t seed = 0; seed < 16; ++seed)
    EXPECT_EQ(Sampler(SamplingParams{1.0f, 9, 1.0f, seed}).sample(l),
              ids_all[static_cast<std::size_t>(token_of(cdf_all, first_draw(seed)))]);
}

// 20000 draws of one request's stream: each kept token's frequency within
// 0.015 of its renormalized probability (the standard error of a frequency
// near 0.5 over 20000 draws is 0.0035, so 0.015 is over four of them), and
// the cut tokens never drawn.
TEST(SamplerByHand, FrequenciesOfSeededDrawsFollowTheRenormalizedDistribution) {
  const int n = 20000;
  const double tol = 0.015;
  auto frequencies = [&](const SamplingParams& p, std::size_t vocab) {
    const auto l = logits_of({0.4, 0.25, 0.15, 0.1, 0.06, 0.04});
    Sampler s(p);
    std::vector<double> f(vocab, 0.0);
    for (int i = 0; i < n; ++i) f[static_cast<std::size_t>(s.sample(l))] += 1.0 / n;
    return f;
  };
  // Top-p 0.75: 0.4, 0.65, 0.8 reaches it: three tokens over 0.8 =
  // 0.5, 0.3125, 0.1875.
  {
    const auto f = frequencies(SamplingParams{1.0f, 0, 0.75f, 42}, 6);
    const std::vector<double> want = {0.5, 0.3125, 0.1875, 0, 0, 0};
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f[i], want[i], tol) << "top-p 0.75, token " << i;
    EXPECT_EQ(f[3] + f[4] + f[5], 0.0);
  }
  // Temperature 0.5 and top-k 3: 0.16, 0.0625, 0.0225 over 0.245 =
  // 0.65306, 0.25510, 0.09184.
  {
    const auto f = frequencies(SamplingParams{0.5f, 3, 1.0f, 7}, 6);
    const std::vector<double> want = {0.16 / 0.245, 0.0625 / 0.245, 0.0225 / 0.245, 0, 0, 0};
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f[i], want[i], tol) << "T 0.5 top-k 3, token " << i;
  }
  // No cut at temperature 1: the probabilities themselves.
  {
    const auto f = frequencies(SamplingParams{1.0f, 0, 1.0f, 3}, 6);
    const std::vector<double> want = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f[i], want[i], tol) << "no cut, token " << i;
  }
}

// vLLM's penalties on logits 2, -1, 0.5, 3 with prompt {0} and output
// {1, 1, 3}. Repetition 2: token 0 (prompt, positive) 2 / 2 = 1; token 1
// (output, negative) -1 x 2 = -2; token 3 (output) 3 / 2 = 1.5; token 2,
// unseen, stays 0.5. Then frequency 0.5 and presence 0.25 over the output:
// token 1 (twice) -2 - 2 x 0.5 - 0.25 = -3.25; token 3 (once)
// 1.5 - 0.5 - 0.25 = 0.75; token 0 is only in the prompt: 1.
TEST(SamplerByHand, PenaltiesAsVllmDefinesThem) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  apply_penalties(l.data(), l.size(), p, {0}, {1, 1, 3});
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], -3.25f);
  EXPECT_FLOAT_EQ(l[2], 0.5f);
  EXPECT_FLOAT_EQ(l[3], 0.75f);
  // Each alone: presence 1 takes 1 from every output token once.
  SamplingParams pres;
  pres.presence_penalty = 1.0f;
  std::vector<float> m = {2.0f, -1.0f, 0.5f, 3.0f};
  apply_penalties(m.data(), m.size(), pres, {0}, {1, 1, 3, 99});  // 99: outside the vocabulary, ignored
  EXPECT_EQ(m, (std::vector<float>{2.0f, -2.0f, 0.5f, 2.0f}));
  // A penalty makes greedy pick another token: 3 (logit 3) falls to 0.75 < 1 (token 0).
  EXPECT_EQ(argmax(l), 0);
  // No penalty: nothing changes, and the engine may choose.
  SamplingParams none;
  std::vector<float> n = {2.0f, -1.0f};
  apply_penalties(n.data(), n.size(), none, {0, 1}, {1});
  EXPECT_EQ(n, (std::vector<float>{2.0f, -1.0f}));
  EXPECT_TRUE(Sampler(none).engine_can_choose());
  EXPECT_FALSE(Sampler(p).engine_can_choose());
}

// Logits log 0.5, log 0.3, log 0.2, log 0.2 -> the log-softmax is those logs
// over a total of 1.2: log(0.5 / 1.2) = -0.875469, log(0.3 / 1.2) = -1.386294,
// log(0.2 / 1.2) = -1.791759 (twice: the tie lists id 2 before id 3).
TEST(SamplerByHand, TokenLogprobsAreTheLogSoftmax) {
  const auto l = logits_of({0.5, 0.3, 0.2, 0.2});
  auto lp = token_logprobs(l.data(), l.size(), 1, 3);
  EXPECT_EQ(lp.chosen.token, 1);
  EXPECT_NEAR(lp.chosen.logprob, -1.386294, 1e-5);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 0);
  EXPECT_NEAR(lp.top[0].logprob, -0.875469, 1e-5);
  EXPECT_EQ(lp.top[1].token, 1);
  EXPECT_EQ(lp.top[2].token, 2);
  EXPECT_NEAR(lp.top[2].logprob, -1.791759, 1e-5);
  EXPECT_TRUE(token_logprobs(l.data(), l.size(), 3, 0).top.empty());
  EXPECT_EQ(token_logprobs(l.data(), l.size(), 3, 50).top.size(), 4u);  // cut to the vocabulary
  // -inf logits have probability 0: log -inf; the rest share the mass.
  std::vector<float> masked = {0.0f, -INFINITY, 0.0f};
  auto m = token_logprobs(masked.data(), masked.size(), 1, 2);
  EXPECT_TRUE(std::isinf(m.chosen.logprob) && m.chosen.logprob < 0);
  EXPECT_NEAR(m.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(m.top[1].token, 2);
}
