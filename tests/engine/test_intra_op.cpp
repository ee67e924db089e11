// SPDX-License-Identifier: Apache-2.0
// engine/intra_op: the pool runs every part once, whoever is free; a
// product split by rows over 1, 2 and 3 threads is bit-identical to one
// thread's ops::matmul / matmul_packed for every dtype, on views that start
// and end off the split's grain and for 1..17 tokens; the default threads of
// a rank follow its device's CPUs; a whole forward with helper threads gives
// the logits of one thread, bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "engine/executor.hpp"
#include "engine/intra_op.hpp"
#include "engine/ops.hpp"
#include "engine/packed_weights.hpp"
#include "model/model.hpp"
#include "synthetic_gguf.hpp"

using namespace ftp::engine;
using ftp::model::DType;

namespace {

TEST(IntraOpPool, RunsEveryPartOnceAndRethrows) {
  for (int threads : {1, 2, 3}) {
    IntraOpPool pool(threads, nullptr);
    EXPECT_EQ(pool.threads(), threads);
    for (int round = 0; round < 300; ++round) {
      const int parts = 1 + round % 37;
      std::vector<std::atomic<int>> ran(static_cast<std::size_t>(parts));
      pool.run(parts, [&](int p) { ran[static_cast<std::size_t>(p)].fetch_add(1); });
      for (int p = 0; p < parts; ++p) ASSERT_EQ(ran[static_cast<std::size_t>(p)].load(), 1) << "part " << p;
    }
    std::uint64_t total = 0;
    for (int round = 0; round < 300; ++round) total += 1 + round % 37;
    EXPECT_EQ(pool.parts_run(), total);
    EXPECT_LE(pool.helper_parts(), pool.parts_run());
    if (threads == 1) EXPECT_EQ(pool.helper_parts(), 0u);
    // A throwing part: its exception reaches the caller, and the pool still works.
    EXPECT_THROW(pool.run(8, [](int p) {
      if (p == 5) throw std::runtime_error("part 5");
    }), std::runtime_error);
    std::atomic<int> n{0};
    pool.run(8, [&](int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 8);
  }
}

TEST(IntraOpPool, RowPartsFallOnTheGrain) {
  ftp::model::TensorView tv;
  tv.rows = 1000;
  for (std::int64_t rows : {1, 64, 65, 128, 300, 1000})
    for (int parts : {1, 2, 3, 8}) {
      const MatView w{&tv, 7, rows, 0, 0};
      const auto b = row_parts(w, parts);
      ASSERT_GE(b.size(), 2u);
      EXPECT_EQ(b.front(), 0);
      EXPECT_EQ(b.back(), rows);
      EXPECT_LE(static_cast<int>(b.size()) - 1, parts);
      for (std::size_t i = 1; i + 1 < b.size(); ++i) {
        EXPECT_EQ(b[i] % kSplitRows, 0) << rows << " rows, " << parts << " parts";
        EXPECT_LT(b[i - 1], b[i]);
      }
      if (rows >= 2 * kSplitRows && parts >= 2) EXPECT_GE(b.size(), 3u) << rows << " rows are split";
    }
}

/// A random tensor of `dt`: random_blocks for the block types, random
/// finite values for the float types, random Q8_0 blocks.
struct Tensor {
  std::vector<std::uint8_t> bytes;
  ftp::model::TensorView view;
  Tensor(DType dt, std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
    const std::int64_t n = rows * cols;
    bytes.resize(ftp::model::dtype_bytes(dt, n));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    if (dt == DType::q8_0) {
      for (std::int64_t b = 0; b < n / 32; ++b) {
        const std::uint16_t d = ftp::testing::f32_to_f16(0.01f + 0.01f * (u(rng) + 1.0f));
        std::memcpy(&bytes[static_cast<std::size_t>(b * 34)], &d, 2);
        for (int j = 0; j < 32; ++j)
          bytes[static_cast<std::size_t>(b * 34 + 2 + j)] = static_cast<std::uint8_t>(static_cast<std::int8_t>(127 * u(rng)));
      }
    } else if (ftp::model::dtype_block(dt) > 1) {
      ftp::testing::random_blocks(dt, bytes.data(), n / ftp::model::dtype_block(dt), seed, 1.0f);
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        const float f = u(rng);
        if (dt == DType::f32) std::memcpy(&bytes[static_cast<std::size_t>(i * 4)], &f, 4);
        std::uint32_t b;
        std::memcpy(&b, &f, 4);
        const std::uint16_t h = dt == DType::f16 ? ftp::testing::f32_to_f16(f) : static_cast<std::uint16_t>(b >> 16);
        if (dt != DType::f32) std::memcpy(&bytes[static_cast<std::size_t>(i * 2)], &h, 2);
      }
    }
    view.name = "random";
    view.dtype = dt;
    view.rows = rows;
    view.cols = cols;
    view.data = bytes.data();
    view.bytes = bytes.size();
  }
};

void expect_bit_identical(const MatView& w, const PackedQ8* packed, const std::string& what) {
  IntraOpPool one(1, nullptr), two(2, nullptr), three(3, nullptr);
  std::uint32_t seed = 7;
  for (int t : {1, 2, 3, 5, 17}) {
    std::mt19937 rng(seed++);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(t * w.cols));
    for (auto& v : x) v = g(rng);
    std::vector<float> ref(static_cast<std::size_t>(t * w.rows), NAN);
    if (packed) ops::matmul_packed(x.data(), *packed, w, ref.data(), t);
    else ops::matmul(x.data(), w, ref.data(), t);
    for (IntraOpPool* pool : {&one, &two, &three}) {
      std::vector<float> out(ref.size(), NAN);
      split_matmul(*pool, x.data(), w, packed, out.data(), t);
      for (std::size_t o = 0; o < ref.size(); ++o)
        ASSERT_EQ(std::memcmp(&ref[o], &out[o], 4), 0)
            << what << " t=" << t << " threads " << pool->threads() << " row " << o % w.rows << " token " << o / w.rows
            << ": " << out[o] << " vs " << ref[o];
    }
  }
}

TEST(SplitMatmul, BitIdenticalToOneThreadForEveryDtype) {
  struct Case {
    std::int64_t rows, cols, r0, nr, c0, nc;
  };
  // Whole tensors; views starting off a group of 16 and a tile of 64 and
  // ending inside one; a column range from a block boundary (a row-parallel
  // shard); a view of fewer rows than two grains.
  const std::vector<Case> cases = {
      {300, 512, 0, 300, 0, 512}, {300, 512, 5, 283, 0, 512}, {300, 512, 37, 200, 256, 256}, {300, 512, 64, 100, 0, 512},
  };
  const DType dtypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1,
                          DType::q5_0, DType::q5_1, DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k};
  std::uint32_t seed = 100;
  for (DType dt : dtypes)
    for (const auto& c : cases) {
      Tensor tn(dt, c.rows, c.cols, seed++);
      const MatView w{&tn.view, c.r0, c.nr, c.c0, c.nc};
      const std::string what = std::string(ftp::model::dtype_name(dt)) + " rows " + std::to_string(c.r0) + "+" +
                               std::to_string(c.nr) + " cols " + std::to_string(c.c0) + "+" + std::to_string(c.nc);
      expect_bit_identical(w, nullptr, what);
      if (dt == DType::q8_0) {  // and the CPU backend's packed copy of it
        std::vector<std::uint8_t> buf(PackedWeights::packed_size(tn.view) + 64);
        auto* at = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(buf.data()) + 63) / 64 * 64);
        PackedQ8 p;
        PackedWeights::pack(tn.view, at, p);
        expect_bit_identical(w, &p, "packed " + what);
      }
    }
}

TEST(RankThreads, FollowTheDevicesCpus) {
  ftp::hardware::VirtualDevice two(0, 2, {0, 1}, 1 << 20), one_a(1, 1, {0}, 1 << 20), one_b(2, 1, {1}, 1 << 20);
  // TP 1 on a device of two CPUs: both.
  EXPECT_EQ(resolve_rank_threads({StageLayout{0, 4, 1, {&two}}}), (std::vector<std::vector<int>>{{2}}));
  // TP 2 on two devices of one CPU: one each (no helper threads).
  EXPECT_EQ(resolve_rank_threads({StageLayout{0, 4, 2, {&one_a, &one_b}}}), (std::vector<std::vector<int>>{{1, 1}}));
  // Two stages of one rank on one device of two CPUs: one each.
  EXPECT_EQ(resolve_rank_threads({StageLayout{0, 2, 1, {&two}}, StageLayout{2, 2, 1, {&two}}}),
            (std::vector<std::vector<int>>{{1}, {1}}));
  // Set by the stage.
  StageLayout set{0, 4, 2, {&one_a, &one_b}};
  set.rank_threads = 3;
  EXPECT_EQ(resolve_rank_threads({set}), (std::vector<std::vector<int>>{{3, 3}}));
  // Without devices: one thread a rank (rank_threads sets more).
  EXPECT_EQ(resolve_rank_threads({StageLayout{0, 4, 1}}), (std::vector<std::vector<int>>{{1}}));
  EXPECT_EQ(resolve_rank_threads({StageLayout{0, 4, 2}}), (std::vector<std::vector<int>>{{1, 1}}));
}

// A forward of a small Q4_K_M model (Q4_K and Q6_K matrices of 512 and
// 1024 rows, split over the threads) gives the same logits with 1, 2 and 3
// threads per rank, at TP 1 and TP 2.
TEST(RankThreads, AForwardWithHelpersGivesOneThreadsLogits) {
  const auto dir = std::filesystem::temp_directory_path() / ("ftp-intra-op-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ftp::testing::SyntheticShape s;
  s.n_layer = 2, s.n_embd = 512, s.n_ff = 1024, s.n_head = 8, s.n_head_kv = 2, s.n_vocab = 700, s.n_ctx = 256;
  s.dtype = DType::q4_k;
  s.q4_k_m = true;
  const std::string path = (dir / "q4km.gguf").string();
  ftp::testing::write_synthetic_gguf(path, s);
  ftp::model::Model m = ftp::model::load_model(path);
  WeightStore store(m);
  const std::vector<int> blocks = {0, 1, 2};
  auto logits = [&](int tp, int threads) {
    StageLayout l{0, s.n_layer, tp};
    l.rank_threads = threads;
    Executor ex(store, {l}, 4, 16);
    // A prefill of 20 tokens (t > 1 splits into scratch rows), then one decode step.
    SeqChunk c{&blocks, 0, {}, true};
    for (int i = 0; i < 20; ++i) c.tokens.push_back(1 + (i * 37) % (s.n_vocab - 1));
    std::vector<std::vector<float>> out = ex.forward({c});
    SeqChunk d{&blocks, 20, {5}, true};
    const auto step = ex.forward({d});
    out.insert(out.end(), step.begin(), step.end());
    return out;
  };
  for (int tp : {1, 2}) {
    const auto ref = logits(tp, 1);
    for (int threads : {2, 3}) {
      const auto got = logits(tp, threads);
      ASSERT_EQ(got.size(), ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i)
        ASSERT_EQ(std::memcmp(got[i].data(), ref[i].data(), ref[i].size() * sizeof(float)), 0)
            << "tp " << tp << ", " << threads << " threads: logits of forward " << i << " differ";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
