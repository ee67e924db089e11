// SPDX-License-Identifier: Apache-2.0
// Synthetic models (tests/support/synthetic_gguf): they load, tokenize, and
// give the same greedy tokens at every TP x PP layout in F32, F16, BF16 and
// Q8_0. The fast matmul kernels against the float32 reference, on odd shapes
// and column sub-ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <random>

#include <unistd.h>

#include "core/error.hpp"
#include "engine/domain.hpp"
#include "engine/ops.hpp"
#include "engine/weight_store.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp::engine;
using ftp::model::DType;
using ftp::testing::SyntheticShape;

namespace {

std::filesystem::path temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("ftp-synthetic-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

struct TempDir {
  std::filesystem::path path = temp_dir();
  ~TempDir() { std::filesystem::remove_all(path); }
};

SyntheticShape tiny(DType dt) {
  SyntheticShape s;
  s.n_layer = 4;
  const bool k_quant = ftp::model::dtype_block(dt) == 256;
  // K-quants: rows of whole super-blocks, and at TP 2 the row-parallel
  // splits (attn_output 512 / 2, ffn_down 512 / 2) on block boundaries.
  s.n_embd = k_quant ? 512 : 64;
  s.n_ff = k_quant ? 512 : 192;  // TP 2: 96 each, Q8_0 blocks stay whole (see ops::matmul)
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_vocab = 400;
  s.n_ctx = 128;
  s.dtype = dt;
  s.seed = 7;
  s.stddev = 0.08f;  // larger than 0.02 so the tiny model's logits are far from ties
  return s;
}

/// A greedy run: the tokens, and at each step the runner-up and the
/// log-probability margin of the choice over it.
struct Greedy {
  std::vector<int> tokens, runner_up;
  std::vector<float> margin;
};

Greedy generate_greedy(const WeightStore& store, std::vector<StageLayout> stages, int micro_batches,
                       std::vector<int> prompt, int max_tokens) {
  DomainConfig cfg;
  cfg.stages = std::move(stages);
  cfg.micro_batches = micro_batches;
  cfg.kv_blocks = 16;
  Domain d(store, cfg);
  Greedy out;
  int finished = 0;
  GenerationRequest r;
  r.id = "r";
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.logprobs = 2;
  r.on_event = [&](const GenerationEvent& e) {
    if (e.token >= 0) {
      out.tokens.push_back(e.token);
      const bool two = e.logprobs && e.logprobs->top.size() == 2;
      out.runner_up.push_back(two ? e.logprobs->top[1].token : -1);
      out.margin.push_back(two ? e.logprobs->top[0].logprob - e.logprobs->top[1].logprob : 0.0f);
    }
    if (e.finished) {
      ++finished;
      EXPECT_NE(e.finish_reason, ftp::engine::FinishReason::error) << e.error;
    }
  };
  d.submit(std::move(r));
  for (int guard = 0; !d.idle() && guard < 10000; ++guard) d.step();
  EXPECT_EQ(finished, 1);
  return out;
}

std::vector<int> generate(const WeightStore& store, std::vector<StageLayout> stages, int micro_batches,
                          std::vector<int> prompt, int max_tokens) {
  return generate_greedy(store, std::move(stages), micro_batches, std::move(prompt), max_tokens).tokens;
}

/// `got` takes the reference's tokens up to the first step where the
/// reference's choice leads its runner-up by less than `tie` and `got`
/// took that runner-up; from there the two continue from different
/// tokens and are not compared. tie 0: every token equal.
void expect_same_greedy(const Greedy& ref, const Greedy& got, float tie, const std::string& what) {
  ASSERT_EQ(got.tokens.size(), ref.tokens.size()) << what;
  for (std::size_t i = 0; i < ref.tokens.size(); ++i) {
    if (got.tokens[i] == ref.tokens[i]) continue;
    if (ref.margin[i] < tie && got.tokens[i] == ref.runner_up[i]) {
      std::printf("%s: near-tie at step %zu (margin %.4f): %d against %d\n", what.c_str(), i, ref.margin[i],
                  got.tokens[i], ref.tokens[i]);
      return;
    }
    ADD_FAILURE() << what << ": step " << i << ": token " << got.tokens[i] << ", the reference's " << ref.tokens[i]
                  << " (runner-up " << ref.runner_up[i] << ", margin " << ref.margin[i] << ")";
    return;
  }
}

class SyntheticModel : public ::testing::TestWithParam<DType> {};

}  // namespace

TEST_P(SyntheticModel, LoadsAndGivesTheSameGreedyTokensAtEveryGear) {
  TempDir dir;
  const SyntheticShape shape = tiny(GetParam());
  const std::string path = (dir.path / "tiny.gguf").string();
  ftp::testing::write_synthetic_gguf(path, shape);

  ftp::model::Model m = ftp::model::load_model(path);
  const auto& hp = m.hparams;
  EXPECT_EQ(hp.n_layer, shape.n_layer);
  EXPECT_EQ(hp.n_embd, shape.n_embd);
  EXPECT_EQ(hp.n_ff, shape.n_ff);
  EXPECT_EQ(hp.n_head, shape.n_head);
  EXPECT_EQ(hp.n_head_kv, shape.n_head_kv);
  EXPECT_EQ(hp.n_vocab, shape.n_vocab);
  EXPECT_EQ(hp.n_ctx_train, shape.n_ctx);
  EXPECT_EQ(m.weights.layers[0].wq.dtype, shape.dtype);
  EXPECT_EQ(m.weights.layers[0].attn_norm.dtype, DType::f32);
  EXPECT_EQ(std::filesystem::file_size(path) > ftp::testing::synthetic_weight_bytes(shape), true);

  // The tokenizer is a working SentencePiece vocabulary: text round-trips,
  // unknown characters fall back to byte tokens.
  auto tok = ftp::model::Tokenizer::from(m.tokenizer);
  const std::string text = "the rain in spain, 42 times! \xc3\xa9t\xc3\xa9";
  auto ids = tok.encode(text, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  // As llama.cpp: the dummy prefix space goes when the text's first token
  // leads; after a BOS it stays.
  EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  EXPECT_EQ(tok.decode(ids, true), " " + text);

  WeightStore store(m);
  std::vector<int> prompt(ids.begin(), ids.begin() + std::min<std::size_t>(ids.size(), 12));
  const Greedy ref = generate_greedy(store, {{0, 4, 1}}, 1, prompt, 24);
  ASSERT_EQ(ref.tokens.size(), 24u);
  struct Gear {
    const char* name;
    std::vector<StageLayout> stages;
    int micro_batches;
  };
  const std::vector<Gear> gears = {
      {"tp2", {{0, 4, 2}}, 1},
      {"pp2", {{0, 2, 1}, {2, 2, 1}}, 1},
      {"tp2 x pp2", {{0, 1, 2}, {1, 3, 2}}, 2},
  };
  // Float activations give every gear the same tokens. Where the activations
  // are quantized before the products (Q8_0, the legacy and K-quants, as
  // llama.cpp does), the gears' log-probabilities part by about 0.01 on this
  // tiny random model (measured for Q6_K with the float and with the integer
  // dots: a row-parallel split rounds its partial sums apart, and an int8
  // grid turns such a rounding into a whole step of an activation now and
  // then), and Q6_K's step 11 is a 0.006 near-tie: there a gear may take the
  // runner-up (margin below 0.05), as arch-refs allow against llama.cpp.
  const float tie = ftp::model::dtype_block(GetParam()) > 1 ? 0.05f : 0.0f;
  for (const auto& g : gears)
    expect_same_greedy(ref, generate_greedy(store, g.stages, g.micro_batches, prompt, 24), tie, g.name);
}

// A vocabulary that the TP degree does not divide (401 at TP 2 and TP 4):
// the vocabulary-parallel embedding and head give the first ranks one row
// more (TP 4: 101, 100, 100, 100 rows), the ranks' rows cover the
// vocabulary once, and the greedy tokens at TP 2 and TP 4 are TP 1's.
TEST(SyntheticVocab, AnUnevenVocabularyShardsAndKeepsTheTokens) {
  TempDir dir;
  SyntheticShape shape = tiny(DType::f32);
  shape.n_vocab = 401;
  const std::string path = (dir.path / "uneven.gguf").string();
  ftp::testing::write_synthetic_gguf(path, shape);
  ftp::model::Model m = ftp::model::load_model(path);
  ASSERT_EQ(m.hparams.n_vocab, 401);
  WeightStore store(m);
  for (int tp : {2, 4}) {
    int next = 0;
    for (int r = 0; r < tp; ++r) {
      const MatView e = store.embedding(tp, r), h = store.output(tp, r);
      EXPECT_EQ(e.r0, next) << "tp " << tp << " rank " << r;
      EXPECT_EQ(e.rows, 401 / tp + (r < 401 % tp ? 1 : 0)) << "tp " << tp << " rank " << r;
      EXPECT_EQ(h.r0, e.r0);
      EXPECT_EQ(h.rows, e.rows);
      next += static_cast<int>(e.rows);
    }
    EXPECT_EQ(next, 401) << "tp " << tp;
  }
  // A device's union of TP 2 rank 0 and TP 4 rank 1: vocabulary rows [0, 201) and [101, 201): 201 rows.
  const ShardUnion u = store.shard_union({RankShard{0, 4, 2, 0, true, true}, RankShard{0, 4, 4, 1, true, true}});
  std::int64_t emb_rows = 0;
  for (const ShardSegment& g : u.segments)
    if (g.from == &m.weights.tok_embd) emb_rows += g.rows;
  EXPECT_EQ(emb_rows, 201);
  const std::vector<int> prompt = {1, 17, 230, 5, 399, 400, 42};
  const Greedy ref = generate_greedy(store, {{0, 4, 1}}, 1, prompt, 24);
  expect_same_greedy(ref, generate_greedy(store, {{0, 4, 2}}, 1, prompt, 24), 0.0f, "tp2, vocabulary 401");
  expect_same_greedy(ref, generate_greedy(store, {{0, 4, 4}}, 1, prompt, 24), 0.0f, "tp4, vocabulary 401");
  expect_same_greedy(ref, generate_greedy(store, {{0, 1, 4}, {1, 3, 2}}, 2, prompt, 24), 0.0f, "tp4 x pp2, vocabulary 401");
}

TEST_P(SyntheticModel, SameSeedSameFileOtherSeedOtherWeights) {
  TempDir dir;
  SyntheticShape s = tiny(GetParam());
  s.n_layer = 1;
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string a = (dir.path / "a.gguf").string(), b = (dir.path / "b.gguf").string(),
                    c = (dir.path / "c.gguf").string();
  ftp::testing::write_synthetic_gguf(a, s);
  ftp::testing::write_synthetic_gguf(b, s);
  s.seed = 8;
  ftp::testing::write_synthetic_gguf(c, s);
  EXPECT_EQ(read(a), read(b));
  EXPECT_NE(read(a), read(c));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SyntheticModel,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q5_1,
                                           DType::q4_k, DType::q6_k),
                         [](const auto& info) { return std::string(ftp::model::dtype_name(info.param)); });

TEST(SyntheticGguf, RefusesBadShapes) {
  TempDir dir;
  SyntheticShape s = tiny(DType::q8_0);
  s.n_ff = 100;  // not a multiple of 32
  EXPECT_THROW(ftp::testing::write_synthetic_gguf((dir.path / "x.gguf").string(), s), ftp::Error);
  s = tiny(DType::f16);
  s.n_head = 3;
  EXPECT_THROW(ftp::testing::write_synthetic_gguf((dir.path / "x.gguf").string(), s), ftp::Error);
}

TEST(SyntheticGguf, Q4KMMixesTypesAndGearsSplitOnBlocks) {
  TempDir dir;
  SyntheticShape s = tiny(DType::q4_k);
  s.q4_k_m = true;
  const std::string path = (dir.path / "q4km.gguf").string();
  ftp::testing::write_synthetic_gguf(path, s);
  ftp::model::Model m = ftp::model::load_model(path);
  // use_more_bits of 4 layers: layer 0 (first eighth rounds to none: l < 0 is
  // false; (0 - 0) % 3 != 2), 2 ((2 - 0) % 3 == 2), 3 (last eighth: 3 >= 3).
  EXPECT_EQ(m.weights.tok_embd.dtype, DType::q4_k);
  EXPECT_EQ(m.weights.output.dtype, DType::q6_k);
  EXPECT_EQ(m.weights.layers[0].wv.dtype, DType::q4_k);
  EXPECT_EQ(m.weights.layers[2].wv.dtype, DType::q6_k);
  EXPECT_EQ(m.weights.layers[3].w_down.dtype, DType::q6_k);
  EXPECT_EQ(m.weights.layers[3].wq.dtype, DType::q4_k);
  WeightStore store(m);
  const std::vector<int> prompt = {1, 300, 301, 302};
  const auto ref = generate(store, {{0, 4, 1}}, 1, prompt, 8);
  EXPECT_EQ(generate(store, {{0, 2, 2}, {2, 2, 2}}, 2, prompt, 8), ref);
  // TP 4 splits attn_output's 512 columns at 128, inside a super-block of
  // 256: the gear is refused, naming the tensor and the split.
  try {
    (void)store.layer(0, 4, 1);
    ADD_FAILURE() << "TP 4 was not refused";
  } catch (const ftp::InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("blk.0.attn_output.weight is Q4_K"), std::string::npos) << m;
    EXPECT_NE(m.find("at 128, inside a block"), std::string::npos) << m;
  }
}

// ---------------------------------------------------------------------------
// ops::matmul's kernels against to_f32 + a naive dot in double.

namespace {

struct RandomTensor {
  std::vector<std::uint8_t> bytes;
  ftp::model::TensorView view;
};

RandomTensor random_tensor(DType dt, std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  RandomTensor r;
  r.bytes.resize(ftp::model::dtype_bytes(dt, rows * cols));
  const std::int64_t n = rows * cols;
  if (dt != DType::q8_0 && ftp::model::dtype_block(dt) > 1)
    ftp::testing::random_blocks(dt, r.bytes.data(), n / ftp::model::dtype_block(dt), seed, 1.0f);
  for (std::int64_t i = 0; i < n && (dt == DType::q8_0 || ftp::model::dtype_block(dt) == 1); ++i) {
    std::uint16_t h = static_cast<std::uint16_t>(bits(rng));
    switch (dt) {
      default: break;  // the other block types: random_blocks above
      case DType::f32: {
        float f = std::uniform_real_distribution<float>(-1, 1)(rng);
        std::memcpy(&r.bytes[i * 4], &f, 4);
        break;
      }
      case DType::f16:  // sign, exponent 8..17 (about 2^-7 .. 4), any mantissa
        h = static_cast<std::uint16_t>((h & 0x83ffu) | ((8u + (h >> 10) % 10u) << 10));
        std::memcpy(&r.bytes[i * 2], &h, 2);
        break;
      case DType::bf16:  // sign, exponent 120..129, any mantissa
        h = static_cast<std::uint16_t>((h & 0x807fu) | ((120u + (h >> 7) % 10u) << 7));
        std::memcpy(&r.bytes[i * 2], &h, 2);
        break;
      case DType::q8_0:
        if (i % 32 == 0) {
          std::uint16_t d = static_cast<std::uint16_t>(0x2000u + (h & 0x3ffu));  // ~ 2^-7
          std::memcpy(&r.bytes[i / 32 * 34], &d, 2);
        }
        r.bytes[i / 32 * 34 + 2 + i % 32] = static_cast<std::uint8_t>(static_cast<std::int8_t>(bits(rng) % 255 - 127));
        break;
    }
  }
  r.view.name = "random";
  r.view.dtype = dt;
  r.view.rows = rows;
  r.view.cols = cols;
  r.view.data = r.bytes.data();
  r.view.bytes = r.bytes.size();
  return r;
}

using MatmulFn = std::function<void(const float*, const MatView&, float*, int)>;

void expect_matches_reference(const MatView& w, int t, std::uint32_t seed, const std::string& what,
                              const MatmulFn& fast = ops::matmul) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  std::vector<float> x(static_cast<std::size_t>(t) * k), out(static_cast<std::size_t>(t) * n, NAN),
      ref(static_cast<std::size_t>(t) * n);
  for (auto& v : x) v = u(rng);
  fast(x.data(), w, out.data(), t);
  ops::matmul_reference(x.data(), w, ref.data(), t);
  std::vector<float> row(static_cast<std::size_t>(w.t->cols));
  for (int i = 0; i < n; ++i) {
    ftp::model::to_f32(*w.t, (w.r0 + i) * w.t->cols, w.t->cols, row.data());
    for (int tok = 0; tok < t; ++tok) {
      double dot = 0, mag = 0, wsum = 0, xmax = 0;
      for (int j = 0; j < k; ++j) {
        double wj = row[static_cast<std::size_t>(w.c0 + j)], xj = x[static_cast<std::size_t>(tok) * k + j];
        dot += wj * xj;
        mag += std::fabs(wj * xj);
        wsum += std::fabs(wj);
        xmax = std::max(xmax, std::fabs(xj));
      }
      const double tol = 1e-5 * mag + 1e-6;
      // The fused Q8_0 kernel quantises x per block of 32 as Q8_0 does
      // (llama.cpp's scheme): each x_j moves by at most max|x| / 254. The
      // other block types quantise x in both paths, as llama.cpp does
      // (blocks of 32 or 256, q x d with d = max / 127 or its f16): the
      // same bound, and both paths take the same quantised x.
      const bool other = w.t->dtype != DType::q8_0 && ftp::model::dtype_block(w.t->dtype) > 1;
      const bool quantised = other || (w.t->dtype == DType::q8_0 && w.c0 % 32 == 0 && k % 32 == 0);
      const double q_tol = wsum * xmax / 254.0 * 1.01;
      const double fast_tol = quantised ? tol + q_tol : tol;
      const std::size_t o = static_cast<std::size_t>(tok) * n + i;
      ASSERT_NEAR(out[o], dot, fast_tol) << what << " t=" << t << " row " << i << " token " << tok;
      ASSERT_NEAR(ref[o], dot, other ? fast_tol : tol) << what << " (reference) t=" << t << " row " << i << " token " << tok;
      if (other) ASSERT_NEAR(out[o], ref[o], tol) << what << " t=" << t << " row " << i << " token " << tok << " against the reference";
    }
  }
}

/// Each token's outputs of `fast` for t = 1..33 tokens at once, bit for bit
/// those of the token alone (t = 1).
void expect_batch_invariant(const MatView& w, std::uint32_t seed, const std::string& what,
                            const MatmulFn& fast = ops::matmul) {
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<std::size_t>(33) * k);
  for (auto& v : x) v = u(rng);
  std::vector<float> alone(static_cast<std::size_t>(33) * n);
  for (int tok = 0; tok < 33; ++tok)
    fast(&x[static_cast<std::size_t>(tok) * k], w, &alone[static_cast<std::size_t>(tok) * n], 1);
  for (int t = 1; t <= 33; ++t) {
    std::vector<float> out(static_cast<std::size_t>(t) * n, NAN);
    fast(x.data(), w, out.data(), t);
    for (std::size_t o = 0; o < out.size(); ++o)
      ASSERT_EQ(std::memcmp(&out[o], &alone[o], 4), 0)
          << what << " t=" << t << " row " << o % n << " token " << o / n << ": " << out[o] << " vs " << alone[o];
  }
}

}  // namespace

TEST(Matmul, FastKernelsMatchTheFloat32Reference) {
  struct Case {
    DType dt;
    std::int64_t rows, cols;        // the tensor
    std::int64_t r0, nr, c0, nc;    // the view
  };
  const std::vector<Case> cases = {
      {DType::f16, 37, 203, 0, 37, 0, 203},    // odd everything
      {DType::f16, 37, 203, 5, 30, 13, 123},   // a sub-range off any alignment
      {DType::f16, 9, 64, 1, 7, 0, 5},         // fewer columns than a vector
      {DType::bf16, 37, 203, 3, 33, 17, 150},
      {DType::bf16, 64, 512, 0, 64, 256, 256},
      {DType::q8_0, 37, 224, 0, 37, 0, 224},
      {DType::q8_0, 37, 224, 2, 35, 64, 96},   // block-aligned columns: the fused kernel
      {DType::q8_0, 37, 224, 2, 35, 48, 80},   // unaligned: the portable path
      {DType::q8_0, 37, 224, 2, 35, 64, 40},   // a partial block at the end
      {DType::f32, 37, 203, 5, 30, 13, 123},
      {DType::f16, 70, 300, 0, 70, 0, 300},    // several blocks of 8 and 4 rows, every column tail
      {DType::bf16, 70, 300, 1, 69, 7, 281},
      {DType::q8_0, 70, 320, 1, 69, 32, 256},
      {DType::q4_0, 37, 224, 2, 35, 64, 96},
      {DType::q4_1, 9, 96, 0, 9, 0, 96},
      {DType::q5_0, 13, 128, 1, 11, 32, 64},
      {DType::q5_1, 6, 64, 0, 6, 0, 64},
      {DType::q2_k, 5, 512, 0, 5, 0, 512},
      {DType::q3_k, 7, 512, 1, 6, 256, 256},
      {DType::q4_k, 11, 768, 0, 11, 0, 768},
      {DType::q4_k, 11, 768, 3, 7, 128, 384},   // a view inside blocks: decoded whole, columns picked
      {DType::q5_k, 5, 256, 0, 5, 0, 256},
      {DType::q6_k, 9, 512, 2, 7, 0, 512},
      {DType::q6_k, 9, 768, 1, 8, 256, 512},   // whole blocks from the second: the integer kernel
      {DType::q6_k, 9, 512, 1, 7, 64, 320},    // inside blocks: decoded whole, columns picked
  };
  for (auto kernels : {ops::MatmulKernels::best, ops::MatmulKernels::avx2}) {
    ops::set_matmul_kernels(kernels);
    std::uint32_t seed = 1;
    for (const auto& c : cases) {
      RandomTensor rt = random_tensor(c.dt, c.rows, c.cols, seed++);
      MatView w{&rt.view, c.r0, c.nr, c.c0, c.nc};
      const std::string what = std::string(kernels == ops::MatmulKernels::best ? "best " : "avx2 ") +
                               ftp::model::dtype_name(c.dt) + " [" + std::to_string(c.rows) + "x" +
                               std::to_string(c.cols) + "] rows " + std::to_string(c.r0) + "+" +
                               std::to_string(c.nr) + " cols " + std::to_string(c.c0) + "+" + std::to_string(c.nc);
      for (int t : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 33}) expect_matches_reference(w, t, seed++, what);
    }
  }
  ops::set_matmul_kernels(ops::MatmulKernels::best);
}

// Each token's outputs are bit-identical whatever batch it is in (greedy
// outputs must not depend on batch composition): t tokens at once against
// each token alone, for every t from 1 to 33, both kernel families.
TEST(Matmul, ResultsDoNotDependOnTheBatch) {
  struct Case {
    DType dt;
    std::int64_t rows, cols, r0, nr, c0, nc;
  };
  const std::vector<Case> cases = {
      {DType::f16, 45, 300, 2, 43, 5, 283},
      {DType::bf16, 45, 300, 0, 45, 0, 300},
      {DType::q8_0, 45, 320, 3, 41, 64, 224},
      {DType::q4_0, 45, 320, 3, 41, 64, 224},
      {DType::q4_k, 13, 512, 1, 12, 0, 512},
      {DType::q6_k, 13, 512, 0, 13, 256, 256},
  };
  for (auto kernels : {ops::MatmulKernels::best, ops::MatmulKernels::avx2}) {
    ops::set_matmul_kernels(kernels);
    std::uint32_t seed = 100;
    for (const auto& c : cases) {
      RandomTensor rt = random_tensor(c.dt, c.rows, c.cols, seed++);
      MatView w{&rt.view, c.r0, c.nr, c.c0, c.nc};
      expect_batch_invariant(w, seed++,
                             std::string(ftp::model::dtype_name(c.dt)) +
                                 (kernels == ops::MatmulKernels::best ? " best" : " avx2"));
    }
  }
  ops::set_matmul_kernels(ops::MatmulKernels::best);
}

// ---------------------------------------------------------------------------
// The packed Q8_0 layout (PackedWeights) and its kernel (ops::matmul_packed).

namespace {

/// A packed copy of a random Q8_0 tensor in a 64-aligned buffer.
struct PackedTensor {
  RandomTensor rt;
  std::vector<std::uint8_t> buf;
  PackedQ8 p;
  PackedTensor(std::int64_t rows, std::int64_t cols, std::uint32_t seed) : rt(random_tensor(DType::q8_0, rows, cols, seed)) {
    buf.resize(PackedWeights::packed_size(rt.view) + 64);
    auto* at = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(buf.data()) + 63) / 64 * 64);
    PackedWeights::pack(rt.view, at, p);
  }
};

bool cpu_has_vnni() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

}  // namespace

// The AVX-512 forms of the Q4_0, Q4_K and Q6_K integer kernels give the
// AVX2 kernels' outputs bit for bit (the same integer lanes, the same float
// steps), so a model's tokens and logits do not depend on which x86 CPU
// runs it. Row counts with tails of 1-3 rows, batches of 1..17.
TEST(Matmul, IntegerKernelsAreBitIdenticalAcrossTheX86Families) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "x86 kernels only";
#else
  if (!cpu_has_vnni()) GTEST_SKIP() << "no AVX-512 VNNI here: best is the AVX2 kernel";
  struct Case {
    DType dt;
    std::int64_t rows, cols, r0, nr, c0, nc;
  };
  const std::vector<Case> cases = {
      {DType::q4_k, 23, 1024, 0, 23, 0, 1024}, {DType::q4_k, 23, 1024, 2, 19, 256, 512},
      {DType::q6_k, 23, 1024, 0, 23, 0, 1024}, {DType::q6_k, 23, 1024, 1, 21, 512, 512},
      {DType::q4_0, 23, 1024, 0, 23, 0, 1024}, {DType::q4_0, 23, 1024, 2, 19, 96, 640},
  };
  std::uint32_t seed = 300;
  for (const auto& c : cases) {
    RandomTensor rt = random_tensor(c.dt, c.rows, c.cols, seed++);
    const MatView w{&rt.view, c.r0, c.nr, c.c0, c.nc};
    for (int t : {1, 2, 3, 4, 7, 17}) {
      std::mt19937 rng(seed++);
      std::normal_distribution<float> g(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(t * c.nc));
      for (auto& v : x) v = g(rng);
      std::vector<float> best(static_cast<std::size_t>(t * c.nr), NAN), avx2(best.size(), NAN);
      ops::set_matmul_kernels(ops::MatmulKernels::best);
      ops::matmul(x.data(), w, best.data(), t);
      ops::set_matmul_kernels(ops::MatmulKernels::avx2);
      ops::matmul(x.data(), w, avx2.data(), t);
      for (std::size_t o = 0; o < best.size(); ++o)
        ASSERT_EQ(std::memcmp(&best[o], &avx2[o], 4), 0) << ftp::model::dtype_name(c.dt) << " t=" << t << " row " << o % c.nr
                                                         << " token " << o / c.nr << ": " << best[o] << " vs " << avx2[o];
    }
  }
  ops::set_matmul_kernels(ops::MatmulKernels::best);
#endif
}

// The layout as packed_weights.hpp describes it, read back element by
// element against the tensor's own Q8_0 blocks; rows past the end are zero.
TEST(PackedQ8, LayoutHoldsEveryScaleAndWeight) {
  PackedTensor pt(37, 224, 11);
  const PackedQ8& p = pt.p;
  EXPECT_EQ(p.groups, 3);
  EXPECT_EQ(p.blocks, 7);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.quants(1)) % 64, 0u);
  EXPECT_EQ(PackedWeights::packed_size(pt.rt.view), static_cast<std::size_t>(p.groups) * p.group_stride);
  for (std::int64_t row = 0; row < 48; ++row)
    for (std::int64_t b = 0; b < p.blocks; ++b) {
      const std::int64_t g = row / 16, r = row % 16;
      const std::uint8_t* blk = row < 37 ? &pt.rt.bytes[static_cast<std::size_t>((row * 7 + b) * 34)] : nullptr;
      std::uint16_t scale = 0;
      if (blk) std::memcpy(&scale, blk, 2);
      ASSERT_EQ(p.scales(g)[b * 16 + r], scale) << "row " << row << " block " << b;
      for (int c = 0; c < 32; ++c) {
        const std::uint8_t stored = p.quants(g)[b * 512 + (c / 4) * 64 + r * 4 + c % 4];
        const int w = blk ? static_cast<std::int8_t>(blk[2 + c]) : 0;
        ASSERT_EQ(static_cast<int>(stored), w + 128) << "row " << row << " block " << b << " column " << c;
      }
    }
}

// matmul_packed against the float32 reference (within the quantisation of
// the activations, as the other Q8_0 kernels), on views whose rows start
// and end inside groups of 16, columns from a block boundary, and 1..17
// tokens; and each token's outputs bit-identical to the same token alone.
TEST(PackedQ8, MatchesTheReferenceAndDoesNotDependOnTheBatch) {
  if (!cpu_has_vnni()) std::printf("note: no AVX-512 VNNI here: matmul_packed runs ops::matmul\n");
  EXPECT_EQ(ops::packed_kernels_available(), cpu_has_vnni());
  struct Case {
    std::int64_t rows, cols, r0, nr, c0, nc;
  };
  const std::vector<Case> cases = {
      {37, 224, 0, 37, 0, 224},   // rows past the last whole group
      {37, 224, 2, 35, 64, 96},   // a view starting inside a group, columns from block 2
      {37, 224, 5, 9, 32, 160},   // inside one group
      {37, 224, 16, 16, 192, 32}, // exactly one group, one block
      {70, 320, 1, 69, 32, 256},
      {64, 320, 0, 64, 0, 320},   // whole groups only
      {100, 256, 16, 84, 32, 224},  // from a group's start: 4 groups at once (t = 1), one, a part
  };
  std::uint32_t seed = 300;
  for (const auto& c : cases) {
    PackedTensor pt(c.rows, c.cols, seed++);
    MatView w{&pt.rt.view, c.r0, c.nr, c.c0, c.nc};
    const std::string what = "packed q8_0 [" + std::to_string(c.rows) + "x" + std::to_string(c.cols) + "] rows " +
                             std::to_string(c.r0) + "+" + std::to_string(c.nr) + " cols " + std::to_string(c.c0) + "+" +
                             std::to_string(c.nc);
    const PackedQ8& p = pt.p;
    auto packed = [&p](const float* x, const MatView& v, float* out, int t) { ops::matmul_packed(x, p, v, out, t); };
    for (int t = 1; t <= 17; ++t) expect_matches_reference(w, t, seed++, what, packed);

    expect_batch_invariant(w, seed++, what, packed);
  }
}

// A store packs once, for the CPU backend, and a domain built after it
// gives the tokens of the mapped tensors' kernels within Q8_0's rounding:
// greedy tokens of the tiny model equal with the packed copy and without.
TEST(PackedQ8, TheStorePacksOnceAndTheEngineUsesIt) {
  TempDir dir;
  const SyntheticShape shape = tiny(DType::q8_0);
  const std::string path = (dir.path / "tiny.gguf").string();
  ftp::testing::write_synthetic_gguf(path, shape);
  ftp::model::Model m = ftp::model::load_model(path);
  WeightStore store(m);
  std::vector<int> prompt = {1, 40, 41, 42, 43, 44, 45, 46};
  const auto packed_tokens = generate(store, {{0, 4, 1}}, 1, prompt, 24);
  const PackedWeights* p = store.packed_for_cpu();
  if (!PackedWeights::wanted()) {
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(store.packed_bytes(), 0u);
    return;
  }
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p, store.packed_for_cpu());  // once
  EXPECT_EQ(p->tensors(), static_cast<std::size_t>(shape.n_layer) * 7 + 1);
  std::uint64_t expect = PackedWeights::packed_size(*store.output().t);
  for (const auto& l : m.weights.layers)
    for (const auto* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      ASSERT_NE(p->find(t), nullptr) << t->name;
      expect += PackedWeights::packed_size(*t);
    }
  EXPECT_EQ(store.packed_bytes(), expect);
  EXPECT_EQ(p->bytes(), expect);
  // The same store's mapped tensors through ops::matmul (FTP_MATMUL=avx2
  // here: matmul_packed falls back), the domain at TP 2 too.
  ops::set_matmul_kernels(ops::MatmulKernels::avx2);
  const auto mapped_tokens = generate(store, {{0, 4, 1}}, 1, prompt, 24);
  ops::set_matmul_kernels(ops::MatmulKernels::best);
  EXPECT_EQ(packed_tokens, mapped_tokens);
  EXPECT_EQ(generate(store, {{0, 4, 2}}, 1, prompt, 24), packed_tokens);
}

// Release weight mode reads the mapped tensors: a store in that mode never
// packs (Q8_0) nor copies (the other quantized types), and switching to it
// after either is refused.
TEST(PackedQ8, ReleaseModeNeitherPacksNorCopies) {
  TempDir dir;
  for (DType dt : {DType::q8_0, DType::q4_0}) {
    const std::string path = (dir.path / (std::string(ftp::model::dtype_name(dt)) + ".gguf")).string();
    ftp::testing::write_synthetic_gguf(path, tiny(dt));
    ftp::model::Model m = ftp::model::load_model(path);
    WeightStore released(m);
    released.use_release_mode();
    EXPECT_EQ(released.packed_for_cpu(), nullptr) << path;
    EXPECT_EQ(released.packed_bytes(), 0u) << path;
    if (!(dt == DType::q8_0 ? PackedWeights::wanted() : PackedWeights::copies_wanted())) continue;
    WeightStore packed(m);
    ASSERT_NE(packed.packed_for_cpu(), nullptr) << path;
    const ftp::model::TensorView* wq = &m.weights.layers[0].wq;
    EXPECT_TRUE(dt == DType::q8_0 ? packed.packed_for_cpu()->find(wq) != nullptr
                                  : packed.packed_for_cpu()->copy_of(wq) != nullptr) << path;
    EXPECT_THROW(packed.use_release_mode(), ftp::Error) << path;
  }
}

// The CPU backend's huge-page copy of the block-quantized matrices other
// than Q8_0 (PackedWeights::copy_of): made once by the store, the same
// bytes, type and shape as each mapped tensor; the engine reads the copy
// (a copy changed after the fact changes the tokens) and gives the tokens
// of the mapped file's pages.
TEST(HugeCopy, TheStoreCopiesQuantizedMatricesAndTheEngineReadsThem) {
  if (!PackedWeights::copies_wanted()) GTEST_SKIP() << "no transparent huge pages here (or FTP_HUGE_COPY=0)";
  TempDir dir;
  SyntheticShape shape = tiny(DType::q4_k);
  shape.q4_k_m = true;  // Q4_K and Q6_K matrices
  const std::string path = (dir.path / "q4km.gguf").string();
  ftp::testing::write_synthetic_gguf(path, shape);
  ftp::model::Model m = ftp::model::load_model(path);
  const std::vector<int> prompt = {1, 300, 301, 302, 303};
  std::vector<int> mapped_tokens;
  {
    ::setenv("FTP_HUGE_COPY", "0", 1);
    WeightStore mapped(m);
    EXPECT_EQ(mapped.packed_for_cpu(), nullptr);
    ::unsetenv("FTP_HUGE_COPY");
    mapped_tokens = generate(mapped, {{0, 4, 1}}, 1, prompt, 12);
  }
  WeightStore store(m);
  const PackedWeights* p = store.packed_for_cpu();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p, store.packed_for_cpu());  // once
  std::vector<const ftp::model::TensorView*> mats = {&m.weights.output};
  for (const auto& l : m.weights.layers)
    for (const auto* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) mats.push_back(t);
  std::uint64_t bytes = 0;
  for (const auto* t : mats) {
    const ftp::model::TensorView* c = p->copy_of(t);
    ASSERT_NE(c, nullptr) << t->name;
    EXPECT_NE(c->data, t->data) << t->name;
    EXPECT_EQ(c->name, t->name);
    EXPECT_EQ(c->dtype, t->dtype) << t->name;
    EXPECT_EQ(c->rows, t->rows) << t->name;
    EXPECT_EQ(c->cols, t->cols) << t->name;
    ASSERT_EQ(c->bytes, t->bytes) << t->name;
    EXPECT_EQ(std::memcmp(c->data, t->data, t->bytes), 0) << t->name;
    bytes += t->bytes;
  }
  EXPECT_EQ(p->copy_of(&m.weights.tok_embd), nullptr);  // the embedding is read a row a token
  EXPECT_EQ(p->find(mats[0]), nullptr);                  // nothing packed: no Q8_0
  EXPECT_EQ(p->copied_tensors(), mats.size());
  EXPECT_EQ(store.packed_bytes(), bytes);
  const auto copy_tokens = generate(store, {{0, 4, 1}}, 1, prompt, 12);
  EXPECT_EQ(copy_tokens, mapped_tokens);
  EXPECT_EQ(generate(store, {{0, 2, 2}, {2, 2, 2}}, 2, prompt, 12), mapped_tokens);
  // The classifier's copy zeroed: every logit 0, so the tokens change;
  // the mapped file's classifier is untouched.
  const ftp::model::TensorView* head = p->copy_of(&m.weights.output);
  std::memset(const_cast<void*>(head->data), 0, head->bytes);
  EXPECT_NE(generate(store, {{0, 4, 1}}, 1, prompt, 12), mapped_tokens);
}
