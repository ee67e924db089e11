// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

namespace ftp::engine {

/// How to pick the next token (OpenAI-style parameters).
struct SamplingParams {
  float temperature = 0.0f;   ///< 0: greedy (argmax, lowest id on ties)
  int top_k = 0;              ///< 0: off
  float top_p = 1.0f;         ///< 1: off
  std::uint64_t seed = 0;     ///< random stream of the request; same seed, same tokens
  /// vLLM's penalties (apply_penalties), applied to the logits before
  /// temperature, top-k and top-p. repetition_penalty (1: off, > 0): a token
  /// seen in the prompt or the output has its logit divided by it when
  /// positive, multiplied when not.
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;  ///< subtracted once per occurrence of the token in the output
  float presence_penalty = 0.0f;   ///< subtracted once from every token present in the output
  /// Whether a penalty is on (the logits must come to the host's sampler).
  bool penalized() const noexcept {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};

/// Applies p's penalties to n logits in place, as vLLM does: first the
/// repetition penalty over the tokens of `prompt` and `output`, then
/// logit -= frequency_penalty x count + presence_penalty x (count > 0) with
/// count the token's occurrences in `output`. Token ids outside 0..n-1 are
/// ignored.
void apply_penalties(float* logits, std::size_t n, const SamplingParams& p, const std::vector<int>& prompt,
                     const std::vector<int>& output);

/// A token and its log-probability.
struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;  ///< natural log; -inf for a token of logit -inf
};

/// A chosen token's log-probability under the model and the most likely
/// tokens of its row: log-softmax of the raw logits (before penalties,
/// temperature, top-k and top-p, as vLLM's default "raw_logprobs").
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  ///< the k most likely, by logit descending, lower id first on ties
};

/// Most top log-probabilities a row may ask (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

/// log-softmax of n logits at `token`, with the `top` most likely tokens
/// (0..kMaxTopLogprobs; more is cut to the vocabulary). Sums in double.
TokenLogprobs token_logprobs(const float* logits, std::size_t n, int token, int top);

/// One row's token choice with its random draw already made: what an
/// engine needs to choose the token where the logits are (on a GPU) and
/// send back only its id (Engine::forward_choose). No top-k.
struct TokenChoice {
  float temperature = 0.0f;  ///< <= 0: greedy
  float top_p = 1.0f;
  double uniform = 0.0;  ///< the draw in [0, 1) (unused when greedy)
  /// -1: no log-probabilities; k >= 0: the chosen token's and the top k
  /// (token_logprobs), computed by the engine where the logits are.
  int logprobs = -1;
};

/// The token `c` picks from n logits: Sampler::sample's rule (top-k off)
/// with its draw given.
int choose_token(const float* logits, std::size_t n, const TokenChoice& c);

/// Picks tokens from logits; one per request, holding its random stream.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  Sampler(const Sampler& o) : p_(o.p_), rng_(o.rng_ ? std::make_unique<std::mt19937_64>(*o.rng_) : nullptr) {}
  Sampler& operator=(const Sampler& o) {
    if (this != &o) *this = Sampler(o);
    return *this;
  }
  Sampler(Sampler&&) noexcept = default;
  Sampler& operator=(Sampler&&) noexcept = default;
  /// `logits` is not modified.
  int sample(const std::vector<float>& logits);
  /// Whether the engine may choose this request's tokens from a
  /// TokenChoice (no top-k, no penalty: both need the logits on the host).
  bool engine_can_choose() const { return p_.top_k <= 0 && !p_.penalized(); }
  const SamplingParams& params() const noexcept { return p_; }
  /// The next token's choice, making the draw that sample() would make (so
  /// the random stream is the same whichever of the two picks the token).
  TokenChoice next_choice();

 private:
  /// The random stream, made and seeded at its first draw: a greedy
  /// request never draws, and the engine's 2.5 KB of state in each of a
  /// replay's running sequences cost more than their draws (seeding it,
  /// and a sequence spread over a page instead of a few cache lines).
  std::mt19937_64& rng();
  SamplingParams p_;
  std::unique_ptr<std::mt19937_64> rng_;
};

/// Index of the largest value, the lowest index on ties.
int argmax(const std::vector<float>& v);

}  // namespace ftp::engine
