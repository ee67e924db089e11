// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace ftp::engine {

/// How to pick the next token (OpenAI-style parameters).
struct SamplingParams {
  float temperature = 0.0f;   ///< 0: greedy (argmax, lowest id on ties)
  int top_k = 0;              ///< 0: off
  float top_p = 1.0f;         ///< 1: off
  std::uint64_t seed = 0;     ///< random stream of the request; same seed, same tokens
};

/// One row's token choice with its random draw already made: what an
/// engine needs to choose the token where the logits are (on a GPU) and
/// send back only its id (Engine::forward_choose). No top-k.
struct TokenChoice {
  float temperature = 0.0f;  ///< <= 0: greedy
  float top_p = 1.0f;
  double uniform = 0.0;  ///< the draw in [0, 1) (unused when greedy)
};

/// The token `c` picks from n logits: Sampler::sample's rule (top-k off)
/// with its draw given.
int choose_token(const float* logits, std::size_t n, const TokenChoice& c);

/// Picks tokens from logits; one per request, holding its random stream.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  /// `logits` is not modified.
  int sample(const std::vector<float>& logits);
  /// Whether the engine may choose this request's tokens from a
  /// TokenChoice (no top-k).
  bool engine_can_choose() const { return p_.top_k <= 0; }
  /// The next token's choice, making the draw that sample() would make (so
  /// the random stream is the same whichever of the two picks the token).
  TokenChoice next_choice();

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

/// Index of the largest value, the lowest index on ties.
int argmax(const std::vector<float>& v);

}  // namespace ftp::engine
