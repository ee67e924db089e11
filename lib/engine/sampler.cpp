// SPDX-License-Identifier: Apache-2.0
#include "engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ftp::engine {

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

namespace {

/// Sampler::sample's rule: greedy at temperature <= 0; else the finite
/// logits sorted (stable), cut to top_k (0: all), softmax at temperature,
/// cut to the smallest prefix whose mass reaches top_p, and the first
/// token at which the cumulative mass exceeds `draw()`. draw() is called
/// exactly once whenever temperature > 0, also for a row without a finite
/// logit (then greedy), so that the random stream does not depend on the
/// logits (Sampler::next_choice draws without seeing them).
template <class Draw>
int pick(const float* logits, std::size_t n_logits, int top_k, float temperature, float top_p, Draw draw) {
  auto greedy = [&] { return static_cast<int>(std::max_element(logits, logits + n_logits) - logits); };
  if (temperature <= 0.0f) return greedy();
  const double r = draw();
  // Candidates: tokens of finite logit (-inf has probability 0; the
  // simulated engine's stand-in logits are -inf but for one token, so its
  // rows cost a scan, not a sort of the vocabulary).
  std::vector<int> idx;
  idx.reserve(n_logits);
  for (std::size_t i = 0; i < n_logits; ++i)
    if (logits[i] > -std::numeric_limits<float>::infinity()) idx.push_back(static_cast<int>(i));
  if (idx.empty()) return greedy();
  const int n = static_cast<int>(idx.size());
  // Candidates sorted by logit (stable: lower id first on ties), cut by top-k.
  int k = (top_k > 0 && top_k < n) ? top_k : n;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
           (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
  });
  idx.resize(static_cast<std::size_t>(k));
  double mx = logits[static_cast<std::size_t>(idx[0])], sum = 0;
  if (std::isinf(mx)) {
    // +inf logits (an F16/BF16 overflow) outweigh every finite one: draw
    // among them alone (inf - inf would make every probability NaN).
    std::size_t m = 0;
    while (m < idx.size() && std::isinf(logits[static_cast<std::size_t>(idx[m])])) ++m;
    return idx[std::min(m - 1, static_cast<std::size_t>(r * static_cast<double>(m)))];
  }
  std::vector<double> prob(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    prob[i] = std::exp((logits[static_cast<std::size_t>(idx[i])] - mx) / temperature);
    sum += prob[i];
  }
  for (auto& p : prob) p /= sum;
  // Top-p: the smallest prefix whose mass reaches top_p.
  if (top_p < 1.0f) {
    double acc = 0;
    std::size_t keep = prob.size();
    for (std::size_t i = 0; i < prob.size(); ++i) {
      acc += prob[i];
      if (acc >= top_p) {
        keep = i + 1;
        break;
      }
    }
    prob.resize(keep);
    double s = std::accumulate(prob.begin(), prob.end(), 0.0);
    for (auto& p : prob) p /= s;
  }
  double acc = 0;
  for (std::size_t i = 0; i < prob.size(); ++i) {
    acc += prob[i];
    if (r < acc) return idx[i];
  }
  return idx[prob.size() - 1];
}

}  // namespace

int choose_token(const float* logits, std::size_t n, const TokenChoice& c) {
  return pick(logits, n, 0, c.temperature, c.top_p, [&] { return c.uniform; });
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {}

std::mt19937_64& Sampler::rng() {
  if (!rng_) rng_ = std::make_unique<std::mt19937_64>(p_.seed);
  return *rng_;
}

int Sampler::sample(const std::vector<float>& logits) {
  return pick(logits.data(), logits.size(), p_.top_k, p_.temperature, p_.top_p,
              [&] { return std::uniform_real_distribution<double>(0.0, 1.0)(rng()); });
}

TokenChoice Sampler::next_choice() {
  TokenChoice c;
  c.temperature = p_.temperature;
  c.top_p = p_.top_p;
  if (p_.temperature > 0.0f) c.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng());
  return c;
}

}  // namespace ftp::engine

namespace ftp::engine {

void apply_penalties(float* logits, std::size_t n, const SamplingParams& p, const std::vector<int>& prompt,
                     const std::vector<int>& output) {
  if (!p.penalized()) return;
  auto in_range = [n](int t) { return t >= 0 && static_cast<std::size_t>(t) < n; };
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(n, 0);
    for (int t : prompt)
      if (in_range(t)) seen[static_cast<std::size_t>(t)] = 1;
    for (int t : output)
      if (in_range(t)) seen[static_cast<std::size_t>(t)] = 1;
    for (std::size_t i = 0; i < n; ++i)
      if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    // Counts of the output's distinct tokens: a sort, not a vocabulary-sized table.
    std::vector<int> out(output.begin(), output.end());
    std::sort(out.begin(), out.end());
    for (std::size_t i = 0; i < out.size();) {
      std::size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      if (in_range(out[i]))
        logits[static_cast<std::size_t>(out[i])] -=
            p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      i = j;
    }
  }
}

TokenLogprobs token_logprobs(const float* logits, std::size_t n, int token, int top) {
  TokenLogprobs r;
  if (n == 0) return r;
  const float mx = *std::max_element(logits, logits + n);
  double lse;
  if (mx == -std::numeric_limits<float>::infinity()) {
    lse = -std::numeric_limits<double>::infinity();  // no candidate: every logprob -inf
  } else if (std::isinf(mx)) {
    lse = std::numeric_limits<double>::infinity();
  } else {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    lse = mx + std::log(sum);
  }
  auto lp = [&](std::size_t i) {
    // +inf logits (an F16 overflow) share all the mass; no finite logit at all: -inf everywhere.
    if (!std::isfinite(lse)) return logits[i] == mx && mx > 0 ? 0.0f : -std::numeric_limits<float>::infinity();
    return static_cast<float>(static_cast<double>(logits[i]) - lse);
  };
  r.chosen.token = token;
  r.chosen.logprob = token >= 0 && static_cast<std::size_t>(token) < n ? lp(static_cast<std::size_t>(token))
                                                                       : -std::numeric_limits<float>::infinity();
  const std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(std::clamp(top, 0, kMaxTopLogprobs)), n);
  if (k == 0) return r;
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (std::size_t i = 0; i < k; ++i) r.top.push_back({idx[i], lp(static_cast<std::size_t>(idx[i]))});
  return r;
}

}  // namespace ftp::engine
