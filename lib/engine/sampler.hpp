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

/// Picks tokens from logits; one per request, holding its random stream.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  /// `logits` is modified (scaled, softmaxed).
  int sample(std::vector<float>& logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

/// Index of the largest value, the lowest index on ties.
int argmax(const std::vector<float>& v);

}  // namespace ftp::engine
