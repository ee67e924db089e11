// SPDX-License-Identifier: Apache-2.0
// The block decoders the CUDA kernels use (kernels/quant_blocks.cuh,
// compiled here as plain C++) against model::quant::dequantize, ggml's
// reference (tests/model/test_quant.cpp checks it against the format):
// every weight of every chunk of random blocks, bit for bit, for each type,
// with ordinary and extreme f16 scales and mins (the largest half, the
// smallest subnormal, zero, minus zero, infinities, NaN). And the
// activation quantization's element steps against
// engine::ops::quantize_activations, exactly; the integer dots against the
// decoded quants, exactly; and the GEMV's per-chunk arithmetic, in the
// kernel's loop, against a float64 product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/quant_matmul.hpp"
#include "kernels/quant_blocks.cuh"
#include "model/model.hpp"
#include "model/quant.hpp"

namespace {

using ftp::model::DType;
namespace qb = ftp::kernels::qb;
namespace quant = ftp::model::quant;

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Equal bits, or both NaN (a NaN's payload is not the format's).
bool same(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }

/// Offsets of a block's f16 fields (scales and mins), per ggml-common.h.
std::vector<int> half_fields(DType t) {
  switch (t) {
    case DType::q4_0:
    case DType::q5_0: return {0};
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q2_k: return {80, 82};
    case DType::q3_k: return {108};
    case DType::q6_k: return {208};
    default: return {};
  }
}

/// Halves every scale and min field takes in turn: ordinary ones, then the
/// extremes (largest finite, smallest subnormal, largest subnormal, zero,
/// minus zero, infinities, a quiet NaN, negative values).
const std::uint16_t kSpecialHalves[] = {0x2e66, 0x1c00, 0x7bff, 0xfbff, 0x0001, 0x03ff, 0x0000,
                                        0x8000, 0x7c00, 0xfc00, 0x7e00, 0xb400, 0x0400, 0x3c00};

/// `n` blocks of type t: random bytes, then each f16 field a random normal
/// half (blocks of even index) or the next special half (odd index).
std::vector<std::uint8_t> random_blocks(DType t, int n, std::mt19937& g) {
  const auto shape = quant::block_shape(t);
  std::vector<std::uint8_t> b(static_cast<std::size_t>(n) * shape.bytes);
  for (auto& v : b) v = static_cast<std::uint8_t>(g());
  std::size_t special = 0;
  for (int i = 0; i < n; ++i)
    for (int at : half_fields(t)) {
      std::uint16_t h;
      if (i % 2 == 0) h = static_cast<std::uint16_t>(((g() & 1) << 15) | ((5 + g() % 20) << 10) | (g() & 0x3ff));
      else h = kSpecialHalves[special++ % std::size(kSpecialHalves)];
      std::memcpy(&b[static_cast<std::size_t>(i) * shape.bytes + at], &h, 2);
    }
  return b;
}

template <qb::QType Q>
void check_type(DType t) {
  using B = qb::Block<Q>;
  const auto shape = quant::block_shape(t);
  ASSERT_EQ(B::kElems, shape.elems) << ftp::model::dtype_name(t);
  ASSERT_EQ(B::kBytes, shape.bytes) << ftp::model::dtype_name(t);
  ASSERT_EQ(B::kChunks * 32, B::kElems);
  ASSERT_EQ(B::kRuns * B::kRunLen, 32);

  // The chunks' runs cover every weight of a block exactly once.
  std::vector<int> hits(static_cast<std::size_t>(B::kElems), 0);
  for (int c = 0; c < B::kChunks; ++c)
    for (int r = 0; r < B::kRuns; ++r)
      for (int i = 0; i < B::kRunLen; ++i) {
        const int e = B::start(c) + r * B::kStride + i;
        ASSERT_GE(e, 0);
        ASSERT_LT(e, B::kElems);
        ++hits[static_cast<std::size_t>(e)];
      }
  for (int e = 0; e < B::kElems; ++e) ASSERT_EQ(hits[static_cast<std::size_t>(e)], 1) << "weight " << e;

  std::mt19937 g(static_cast<unsigned>(19 + static_cast<int>(t)));
  const int n = 600;  // every special half in every field several times
  const std::vector<std::uint8_t> blocks = random_blocks(t, n, g);
  std::vector<float> want(static_cast<std::size_t>(n) * B::kElems);
  quant::dequantize(t, blocks.data(), n, want.data());
  std::size_t checked = 0;
  for (int b = 0; b < n; ++b) {
    const std::uint8_t* blk = blocks.data() + static_cast<std::size_t>(b) * B::kBytes;
    const float* w = want.data() + static_cast<std::size_t>(b) * B::kElems;
    // decode_chunk: the weights as the dequant and embedding kernels write them.
    std::vector<float> got(static_cast<std::size_t>(B::kElems), -7.0f);
    for (int c = 0; c < B::kChunks; ++c) qb::decode_chunk<Q>(blk, c, got.data());
    for (int e = 0; e < B::kElems; ++e)
      ASSERT_TRUE(same(got[static_cast<std::size_t>(e)], w[e]))
          << ftp::model::dtype_name(t) << " block " << b << " weight " << e << ": decode_chunk " << got[e]
          << ", ggml " << w[e];
    // run(): the quants, scale and min the GEMV kernels use, each weight
    // rounded as ggml rounds it (and, with fused multiply-add, the same).
    for (int c = 0; c < B::kChunks; ++c) {
      const typename B::Raw raw = B::load(blk, c);
      for (int r = 0; r < B::kRuns; ++r) {
        float q[B::kRunLen], d, m;
        B::run(raw, c, r, q, d, m);
        for (int i = 0; i < B::kRunLen; ++i) {
          ASSERT_EQ(q[i], std::nearbyint(q[i])) << "a quant is an integer";
          const float v = qb::weight<Q>(d, q[i], m);
          const float fused = B::kHasMin ? std::fma(d, q[i], m) : d * q[i];
          const int e = B::start(c) + r * B::kStride + i;
          ASSERT_TRUE(same(v, w[e])) << ftp::model::dtype_name(t) << " block " << b << " chunk " << c << " run " << r
                                     << " weight " << e << ": " << v << " (d " << d << ", q " << q[i] << ", m " << m
                                     << "), ggml " << w[e];
          ASSERT_TRUE(same(fused, w[e])) << ftp::model::dtype_name(t) << " fused, weight " << e;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, static_cast<std::size_t>(n) * B::kElems);
}

/// IntDot<Q>::run (the integer dots of the GEMV's int8 path) gives
/// sum_i q[i] x qx[i], q[i] the quants run() gives (checked below against
/// ggml), exactly, for random blocks and int8 activation quants in
/// [-127, 127] (their extremes included).
template <qb::QType Q>
void check_int_dot(DType t) {
  using B = qb::Block<Q>;
  constexpr int L = B::kRunLen, N = L / 4;
  std::mt19937 g(static_cast<unsigned>(31 + static_cast<int>(t)));
  const int n = 300;
  const std::vector<std::uint8_t> blocks = random_blocks(t, n, g);
  for (int b = 0; b < n; ++b)
    for (int c = 0; c < B::kChunks; ++c) {
      const typename B::Raw raw = B::load(blocks.data() + static_cast<std::size_t>(b) * B::kBytes, c);
      for (int r = 0; r < B::kRuns; ++r) {
        std::int8_t qx[L];
        for (int i = 0; i < L; ++i)
          qx[i] = static_cast<std::int8_t>(b % 3 == 0 ? (i % 2 ? 127 : -127) : static_cast<int>(g() % 255) - 127);
        std::uint32_t words[N];
        std::memcpy(words, qx, L);
        float q[L], d, m;
        B::run(raw, c, r, q, d, m);
        long long want = 0, xsum = 0;
        for (int i = 0; i < L; ++i) {
          want += static_cast<long long>(q[i]) * qx[i];
          xsum += qx[i];
        }
        ASSERT_EQ(qb::sum_q8<N>(words), xsum);
        ASSERT_EQ(qb::IntDot<Q>::run(raw, c, r, words, static_cast<int>(xsum)), want)
            << ftp::model::dtype_name(t) << " block " << b << " chunk " << c << " run " << r;
      }
    }
}

/// Activations quantized as the device does it for the integer path (the
/// quants and each block's scale) with their values q x d.
struct QuantizedActs {
  std::vector<float> values, scales;
  std::vector<std::int8_t> quants;
};
QuantizedActs quantize_acts(bool k_quant, const std::vector<float>& x, int t, int k) {
  const int B = k_quant ? 256 : 32;
  QuantizedActs a;
  a.values.resize(x.size());
  a.quants.resize(x.size());
  for (int u = 0; u < t; ++u)
    for (int j = 0; j < k; j += B) {
      const float* xb = x.data() + static_cast<std::size_t>(u) * k + j;
      float amax = 0, max = 0;
      for (int e = 0; e < B; ++e)
        if (std::fabs(xb[e]) > amax) amax = std::fabs(xb[e]), max = xb[e];
      const qb::Q8Scale sc = k_quant ? qb::q8_k_scale(max) : qb::q8_0_scale(amax);
      a.scales.push_back(sc.d);
      for (int e = 0; e < B; ++e) {
        const std::size_t i = static_cast<std::size_t>(u) * k + j + e;
        a.values[i] = k_quant ? qb::q8_k_value(xb[e], sc) : qb::q8_0_value(xb[e], sc);
        a.quants[i] = static_cast<std::int8_t>(k_quant ? qb::q8_k_int(xb[e], sc) : qb::q8_0_int(xb[e], sc));
      }
    }
  return a;
}

/// The block-type GEMV's arithmetic on the CPU: the kernel's loop over a
/// row group's chunks (matvec_quant_kernel: 2 rows x 3 tokens a group, the
/// chunk's first activation at blk x kElems + start(c), its activation
/// block's scale at blk) calling the same qb::chunk_int / chunk_float,
/// against a float64 product of the dequantized weights and the quantized
/// activations' values: every type, both paths, a row count and a token
/// count that leave partial groups.
template <qb::QType Q>
void check_gemv(DType t) {
  using B = qb::Block<Q>;
  constexpr int R = 2, T = 3;
  const int rows = 5, nt_all = 4, K = 3 * B::kElems, blocks = K / B::kElems;
  std::mt19937 g(static_cast<unsigned>(41 + static_cast<int>(t)));
  std::vector<std::uint8_t> w;
  for (int r = 0; r < rows; ++r) {
    // Ordinary scales only: the extremes would make the sums inf or NaN.
    std::vector<std::uint8_t> row = random_blocks(t, 2 * blocks, g);
    for (int b = 0; b < blocks; ++b)
      w.insert(w.end(), row.begin() + 2 * b * B::kBytes, row.begin() + (2 * b + 1) * B::kBytes);
  }
  std::vector<float> wf(static_cast<std::size_t>(rows) * K);
  quant::dequantize(t, w.data(), rows * blocks, wf.data());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(nt_all) * K);
  for (auto& v : x) v = nd(g);
  const QuantizedActs a = quantize_acts(B::kElems == 256, x, nt_all, K);
  for (const bool integer : {false, true}) {
    std::vector<float> out(static_cast<std::size_t>(nt_all) * rows, NAN);
    for (int row0 = 0; row0 < rows; row0 += R)
      for (int u0 = 0; u0 < nt_all; u0 += T) {
        const int nt = std::min(T, nt_all - u0);
        float acc[R][T] = {};
        for (int gc = 0; gc < blocks * B::kChunks; ++gc) {
          const int blk = gc / B::kChunks, c = gc % B::kChunks;
          typename B::Raw raw[R];
          for (int r = 0; r < R; ++r) {
            const int row = row0 + r < rows ? row0 + r : row0;
            raw[r] = B::load(w.data() + (static_cast<std::size_t>(row) * blocks + blk) * B::kBytes, c);
          }
          const int e = blk * B::kElems + B::start(c);
          if (integer) {
            const auto* xq0 = reinterpret_cast<const std::uint8_t*>(a.quants.data()) + static_cast<std::size_t>(u0) * K + e;
            qb::chunk_int<Q, R, T>(raw, c, xq0, K, a.scales.data() + static_cast<std::size_t>(u0) * blocks + blk, blocks, nt,
                                   acc);
          } else {
            qb::chunk_float<Q, R, T>(raw, c, a.values.data() + static_cast<std::size_t>(u0) * K + e, K, nt, acc);
          }
        }
        for (int r = 0; r < R; ++r)
          for (int u = 0; u < nt; ++u)
            if (row0 + r < rows) out[static_cast<std::size_t>(u0 + u) * rows + row0 + r] = acc[r][u];
      }
    double num = 0, den = 0;
    for (int u = 0; u < nt_all; ++u)
      for (int r = 0; r < rows; ++r) {
        double want = 0;
        for (int j = 0; j < K; ++j)
          want += static_cast<double>(wf[static_cast<std::size_t>(r) * K + j]) * a.values[static_cast<std::size_t>(u) * K + j];
        const double got = out[static_cast<std::size_t>(u) * rows + r];
        ASSERT_TRUE(std::isfinite(got)) << "output " << u << "," << r << " not written";
        num += (got - want) * (got - want);
        den += want * want;
      }
    EXPECT_LE(num / den, 1e-10) << ftp::model::dtype_name(t) << (integer ? " integer" : " float") << " path";
  }
}

TEST(QuantBlocks, GemvQ4_0) { check_gemv<qb::QType::q4_0>(DType::q4_0); }
TEST(QuantBlocks, GemvQ4_1) { check_gemv<qb::QType::q4_1>(DType::q4_1); }
TEST(QuantBlocks, GemvQ5_0) { check_gemv<qb::QType::q5_0>(DType::q5_0); }
TEST(QuantBlocks, GemvQ5_1) { check_gemv<qb::QType::q5_1>(DType::q5_1); }
TEST(QuantBlocks, GemvQ2_K) { check_gemv<qb::QType::q2_k>(DType::q2_k); }
TEST(QuantBlocks, GemvQ3_K) { check_gemv<qb::QType::q3_k>(DType::q3_k); }
TEST(QuantBlocks, GemvQ4_K) { check_gemv<qb::QType::q4_k>(DType::q4_k); }
TEST(QuantBlocks, GemvQ5_K) { check_gemv<qb::QType::q5_k>(DType::q5_k); }
TEST(QuantBlocks, GemvQ6_K) { check_gemv<qb::QType::q6_k>(DType::q6_k); }

TEST(QuantBlocks, IntegerDotsQ4_0) { check_int_dot<qb::QType::q4_0>(DType::q4_0); }
TEST(QuantBlocks, IntegerDotsQ4_1) { check_int_dot<qb::QType::q4_1>(DType::q4_1); }
TEST(QuantBlocks, IntegerDotsQ5_0) { check_int_dot<qb::QType::q5_0>(DType::q5_0); }
TEST(QuantBlocks, IntegerDotsQ5_1) { check_int_dot<qb::QType::q5_1>(DType::q5_1); }
TEST(QuantBlocks, IntegerDotsQ2_K) { check_int_dot<qb::QType::q2_k>(DType::q2_k); }
TEST(QuantBlocks, IntegerDotsQ3_K) { check_int_dot<qb::QType::q3_k>(DType::q3_k); }
TEST(QuantBlocks, IntegerDotsQ4_K) { check_int_dot<qb::QType::q4_k>(DType::q4_k); }
TEST(QuantBlocks, IntegerDotsQ5_K) { check_int_dot<qb::QType::q5_k>(DType::q5_k); }
TEST(QuantBlocks, IntegerDotsQ6_K) { check_int_dot<qb::QType::q6_k>(DType::q6_k); }

TEST(QuantBlocks, Q4_0) { check_type<qb::QType::q4_0>(DType::q4_0); }
TEST(QuantBlocks, Q4_1) { check_type<qb::QType::q4_1>(DType::q4_1); }
TEST(QuantBlocks, Q5_0) { check_type<qb::QType::q5_0>(DType::q5_0); }
TEST(QuantBlocks, Q5_1) { check_type<qb::QType::q5_1>(DType::q5_1); }
TEST(QuantBlocks, Q2_K) { check_type<qb::QType::q2_k>(DType::q2_k); }
TEST(QuantBlocks, Q3_K) { check_type<qb::QType::q3_k>(DType::q3_k); }
TEST(QuantBlocks, Q4_K) { check_type<qb::QType::q4_k>(DType::q4_k); }
TEST(QuantBlocks, Q5_K) { check_type<qb::QType::q5_k>(DType::q5_k); }
TEST(QuantBlocks, Q6_K) { check_type<qb::QType::q6_k>(DType::q6_k); }

TEST(QuantBlocks, HalvesAndSmallIntegers) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float want = quant::f16_to_f32(static_cast<std::uint16_t>(h));
    ASSERT_TRUE(same(qb::half_float(static_cast<std::uint16_t>(h)), want)) << "half 0x" << std::hex << h;
  }
  std::mt19937 g(5);
  std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.99f, 1e-8f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                           6.1e-5f, -6.1e-5f, 1.0f / 3.0f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = static_cast<std::uint32_t>(g());
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isfinite(f)) xs.push_back(f);
  }
  for (float x : xs) {
    const float want = quant::f16_to_f32(quant::f32_to_f16(x));
    ASSERT_TRUE(same(qb::round_to_half(x), want)) << x;
  }
  for (int v = -70000; v <= 70000; ++v) ASSERT_EQ(bits(qb::small_int_float(v)), bits(static_cast<float>(v))) << v;
}

/// Rows of activations with the cases that matter: zeros, a block whose
/// largest magnitude occurs as +a and -a (the first wins in Q8_K), values
/// that round to 127 and past it, tiny values, and a row length that ends
/// in a short block.
std::vector<float> activations(int t, int k, std::mt19937& g) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(t) * k);
  for (auto& v : x) v = nd(g);
  for (int j = 0; j < 256 && j < k; ++j) x[static_cast<std::size_t>(j)] = 0.0f;  // a block of zeros
  if (t > 1 && k >= 300) {
    float* r = x.data() + k;
    r[3] = -4.0f, r[7] = 4.0f;          // ties: -4 first
    r[256 + 5] = 2.5f, r[256 + 9] = -2.5f;
  }
  if (t > 2)
    for (int j = 0; j < k; ++j) x[static_cast<std::size_t>(2 * k + j)] *= 1e-30f;
  return x;
}

TEST(QuantBlocks, ActivationsAsTheCpuQuantizesThem) {
  std::mt19937 g(23);
  for (DType w : {DType::q4_0, DType::q4_k}) {
    const bool k_quant = ftp::model::dtype_block(w) == 256;
    const int B = k_quant ? 256 : 32;
    for (int k : {512, 300, 70}) {
      const int t = 4;
      const std::vector<float> x = activations(t, k, g);
      std::vector<float> want(x.size()), got(x.size());
      ftp::engine::ops::quantize_activations(w, x.data(), t, k, want.data());
      for (int u = 0; u < t; ++u)
        for (int j = 0; j < k; j += B)
          qb::quantize_block(k_quant, x.data() + static_cast<std::size_t>(u) * k + j, std::min(B, k - j),
                             got.data() + static_cast<std::size_t>(u) * k + j);
      for (std::size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(bits(got[i]), bits(want[i])) << (k_quant ? "Q8_K" : "Q8_0") << " k " << k << " element " << i
                                               << ": " << got[i] << ", the CPU " << want[i];
      // The int8 quants the GEMV's integer path reads: q x d is the value.
      for (int u = 0; u < t; ++u)
        for (int j = 0; j < k; j += B) {
          const float* xb = x.data() + static_cast<std::size_t>(u) * k + j;
          const int n = std::min(B, k - j);
          float amax = 0, max = 0;
          for (int e = 0; e < n; ++e)
            if (std::fabs(xb[e]) > amax) amax = std::fabs(xb[e]), max = xb[e];
          const qb::Q8Scale sc = k_quant ? qb::q8_k_scale(max) : qb::q8_0_scale(amax);
          for (int e = 0; e < n; ++e) {
            const int q = k_quant ? qb::q8_k_int(xb[e], sc) : qb::q8_0_int(xb[e], sc);
            ASSERT_LE(std::abs(q), 127);
            ASSERT_EQ(static_cast<float>(q) * sc.d, want[static_cast<std::size_t>(u) * k + j + e]);  // +0 for -0
          }
        }
    }
  }
}

/// The tie rule the device's warp reduction uses (q8_k_beats) picks the
/// element the serial loop picks: the first of the largest magnitude.
TEST(QuantBlocks, Q8KMaximumTieRule) {
  EXPECT_TRUE(qb::q8_k_beats(2.0f, 9, 1.0f, 0));
  EXPECT_TRUE(qb::q8_k_beats(2.0f, 3, 2.0f, 7));
  EXPECT_FALSE(qb::q8_k_beats(2.0f, 7, 2.0f, 3));
  EXPECT_FALSE(qb::q8_k_beats(1.0f, 0, 2.0f, 9));
}

}  // namespace
