// SPDX-License-Identifier: Apache-2.0
// Dequantization of the ggml block types against their format definition.
// Each test builds blocks byte by byte from the layout of ggml-common.h
// (written out again here, weight by weight, from the format's definition:
// where each weight's bits and its group's scale lie), with seeded random
// quants and scales, and computes every expected weight from that
// definition in double precision. The scales are halves of at most 11
// significant bits and every product of the formulas is exact in float, so
// ggml's float arithmetic gives exactly the real-number value, rounded once
// (for the subtraction or addition of the min): the expected floats are
// that value rounded to float, and the comparison is for equality, bit for
// bit. A few literal blocks check the encoders themselves against values
// worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/model.hpp"
#include "model/quant.hpp"
#include "test_data.hpp"

namespace {

using ftp::model::DType;
namespace quant = ftp::model::quant;

std::vector<float> decode(DType t, const std::vector<std::uint8_t>& blocks) {
  const auto s = quant::block_shape(t);
  std::vector<float> out(blocks.size() / s.bytes * s.elems);
  quant::dequantize(t, blocks.data(), static_cast<std::int64_t>(blocks.size() / s.bytes), out.data());
  return out;
}

void put16(std::uint8_t* p, std::uint16_t v) { std::memcpy(p, &v, 2); }

/// A half with a random 10-bit mantissa and an exponent in [-8, -3]: 11
/// significant bits, small enough for every product to stay exact.
std::uint16_t random_half(std::mt19937& g, bool negative = false) {
  const std::uint16_t exp = static_cast<std::uint16_t>(15 - 8 + g() % 6);
  return static_cast<std::uint16_t>((negative ? 0x8000u : 0u) | (exp << 10) | (g() & 0x3ffu));
}

/// The value of a normal half, computed from its fields.
double half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const double v = std::ldexp(1.0 + (h & 0x3ff) / 1024.0, exp - 15);
  return (h & 0x8000) ? -v : v;
}

void expect_bits(const std::vector<float>& got, const std::vector<double>& want, const char* type) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float w = static_cast<float>(want[i]);
    std::uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &w, 4);
    ASSERT_EQ(a, b) << type << " weight " << i << ": got " << got[i] << ", the format gives " << want[i];
  }
}

// ---------------------------------------------------------------------------
// Legacy blocks of 32: weight j < 16 in the low nibble of qs[j], weight
// j >= 16 in the high nibble of qs[j - 16]; Q5's fifth bit of weight j is
// bit j of the 32-bit qh.

struct Legacy {
  DType t;
  int bytes, qs_at, qh_at, m_at;  // offsets; -1 when absent
  int bits;
};

const Legacy kLegacy[] = {
    {DType::q4_0, 18, 2, -1, -1, 4},
    {DType::q4_1, 20, 4, -1, 2, 4},
    {DType::q5_0, 22, 6, 2, -1, 5},
    {DType::q5_1, 24, 8, 4, 2, 5},
};

TEST(Dequantize, LegacyBlocksFollowTheFormat) {
  std::mt19937 g(7);
  for (const Legacy& L : kLegacy) {
    const int nb = 3;
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(nb * L.bytes), 0);
    std::vector<double> want;
    for (int b = 0; b < nb; ++b) {
      std::uint8_t* p = blocks.data() + b * L.bytes;
      const std::uint16_t d = random_half(g, b == 1), m = random_half(g, true);
      put16(p, d);
      if (L.m_at >= 0) put16(p + L.m_at, m);
      std::uint32_t qh = 0;
      for (int j = 0; j < 32; ++j) {
        const int q = static_cast<int>(g() % (1u << L.bits));
        std::uint8_t& byte = p[L.qs_at + j % 16];
        byte = static_cast<std::uint8_t>(byte | ((q & 0xf) << (j < 16 ? 0 : 4)));
        if (L.bits == 5) qh |= static_cast<std::uint32_t>(q >> 4) << j;
        // Q4_0/Q5_0: (q - 8 or 16) d; Q4_1/Q5_1: q d + m.
        const double v = L.m_at < 0 ? (q - (1 << (L.bits - 1))) * half_value(d) : q * half_value(d) + half_value(m);
        want.push_back(v);
      }
      if (L.qh_at >= 0) std::memcpy(p + L.qh_at, &qh, 4);
    }
    expect_bits(decode(L.t, blocks), want, ftp::model::dtype_name(L.t));
  }
}

TEST(Dequantize, LegacyLiteralBlocks) {
  // Q4_0, d = 0.5 (0x3800): qs[0] = 0x1f -> weight 0 = (15 - 8) x 0.5 = 3.5,
  // weight 16 = (1 - 8) x 0.5 = -3.5; qs[1] = 0x80 -> weight 1 = -4,
  // weight 17 = 0; the other bytes 0x88 -> 0.
  std::vector<std::uint8_t> q40(18, 0x88);
  put16(q40.data(), 0x3800);
  q40[2] = 0x1f;
  q40[3] = 0x80;
  auto w = decode(DType::q4_0, q40);
  EXPECT_EQ(w[0], 3.5f);
  EXPECT_EQ(w[16], -3.5f);
  EXPECT_EQ(w[1], -4.0f);
  EXPECT_EQ(w[17], 0.0f);
  EXPECT_EQ(w[5], 0.0f);
  // Q5_1, d = 0.25 (0x3400), m = -1 (0xbc00), qh = bit 16 only, qs all 0x21:
  // weight 0 = 1 x 0.25 - 1 = -0.75, weight 16 = (2 | 16) x 0.25 - 1 = 3.5,
  // weight 17 = 2 x 0.25 - 1 = -0.5.
  std::vector<std::uint8_t> q51(24, 0x21);
  put16(q51.data(), 0x3400);
  put16(q51.data() + 2, 0xbc00);
  const std::uint32_t qh = 1u << 16;
  std::memcpy(q51.data() + 4, &qh, 4);
  w = decode(DType::q5_1, q51);
  EXPECT_EQ(w[0], -0.75f);
  EXPECT_EQ(w[16], 3.5f);
  EXPECT_EQ(w[17], -0.5f);
}

// ---------------------------------------------------------------------------
// K-quants, super-blocks of 256. Position of weight i's low bits:
//   Q2_K, Q3_K: half h = i / 128, quarter s = (i % 128) / 32, part p =
//     (i % 32) / 16, l = i % 16: byte 32h + 16p + l of qs, bits 2s, 2s + 1;
//     Q3_K's high bit: bit 4h + s of hmask[16p + l]; group i / 16.
//   Q4_K, Q5_K: chunk c = i / 64, r = i % 64: byte 32c + r % 32 of qs, low
//     nibble for r < 32, high otherwise; Q5_K's fifth bit: bit i / 32 of
//     qh[r % 32]; group i / 32.
//   Q6_K: n = i / 128, s = (i % 128) / 32, l = i % 32: low nibble of
//     ql[64n + 32(s % 2) + l] (s < 2) or its high nibble (s >= 2), high two
//     bits 2s, 2s + 1 of qh[32n + l]; group i / 16.

TEST(Dequantize, Q2KFollowsTheFormat) {
  std::mt19937 g(11);
  std::vector<std::uint8_t> blk(2 * 84, 0);
  std::vector<double> want;
  for (int b = 0; b < 2; ++b) {
    std::uint8_t* p = blk.data() + b * 84;
    const std::uint16_t d = random_half(g), dmin = random_half(g);
    put16(p + 80, d);
    put16(p + 82, dmin);
    for (int grp = 0; grp < 16; ++grp) p[grp] = static_cast<std::uint8_t>(g());
    for (int i = 0; i < 256; ++i) {
      const int q = static_cast<int>(g() % 4);
      const int h = i / 128, s = (i % 128) / 32, part = (i % 32) / 16, l = i % 16;
      p[16 + 32 * h + 16 * part + l] |= static_cast<std::uint8_t>(q << (2 * s));
      const int sc = p[i / 16] & 0xf, mn = p[i / 16] >> 4;
      want.push_back(half_value(d) * sc * q - half_value(dmin) * mn);
    }
  }
  expect_bits(decode(DType::q2_k, blk), want, "Q2_K");
}

TEST(Dequantize, Q3KFollowsTheFormat) {
  std::mt19937 g(13);
  std::vector<std::uint8_t> blk(2 * 110, 0);
  std::vector<double> want;
  for (int b = 0; b < 2; ++b) {
    std::uint8_t* p = blk.data() + b * 110;
    const std::uint16_t d = random_half(g, b == 0);
    put16(p + 108, d);
    int scale[16];
    for (int grp = 0; grp < 16; ++grp) {
      // 6 bits: the low 4 in a nibble of bytes 0..7, the high 2 in bytes 8..11.
      const int u = static_cast<int>(g() % 64);
      scale[grp] = u - 32;
      p[96 + grp % 8] |= static_cast<std::uint8_t>((u & 0xf) << (grp < 8 ? 0 : 4));
      p[96 + 8 + grp % 4] |= static_cast<std::uint8_t>((u >> 4) << (2 * (grp / 4)));
    }
    for (int i = 0; i < 256; ++i) {
      const int q = static_cast<int>(g() % 8);  // 3 bits: value q - 4
      const int h = i / 128, s = (i % 128) / 32, part = (i % 32) / 16, l = i % 16;
      p[32 + 32 * h + 16 * part + l] |= static_cast<std::uint8_t>((q & 3) << (2 * s));
      if (q & 4) p[16 * part + l] |= static_cast<std::uint8_t>(1u << (4 * h + s));
      want.push_back(half_value(d) * scale[i / 16] * (q - 4));
    }
  }
  expect_bits(decode(DType::q3_k, blk), want, "Q3_K");
}

/// The 12 scale bytes of Q4_K/Q5_K for 8 six-bit scales and mins: groups
/// 0-3 in the low 6 bits of bytes g (scale) and g + 4 (min); groups 4-7:
/// low 4 bits in byte g + 4 (scale low nibble, min high nibble), high 2
/// bits in the top 2 bits of bytes g - 4 (scale) and g (min).
void pack_k4_scales(std::uint8_t* s, const int sc[8], const int mn[8]) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= static_cast<std::uint8_t>(sc[j]);
      s[j + 4] |= static_cast<std::uint8_t>(mn[j]);
    } else {
      s[j + 4] |= static_cast<std::uint8_t>((sc[j] & 0xf) | ((mn[j] & 0xf) << 4));
      s[j - 4] |= static_cast<std::uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<std::uint8_t>((mn[j] >> 4) << 6);
    }
  }
}

void k45(DType t, std::uint32_t seed) {
  const bool five = t == DType::q5_k;
  const int bytes = five ? 176 : 144, qs_at = five ? 48 : 16;
  std::mt19937 g(seed);
  std::vector<std::uint8_t> blk(2 * static_cast<std::size_t>(bytes), 0);
  std::vector<double> want;
  for (int b = 0; b < 2; ++b) {
    std::uint8_t* p = blk.data() + b * bytes;
    const std::uint16_t d = random_half(g), dmin = random_half(g);
    put16(p, d);
    put16(p + 2, dmin);
    int sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<int>(g() % 64);
      mn[j] = static_cast<int>(g() % 64);
    }
    pack_k4_scales(p + 4, sc, mn);
    for (int i = 0; i < 256; ++i) {
      const int q = static_cast<int>(g() % (five ? 32 : 16));
      const int c = i / 64, r = i % 64;
      p[qs_at + 32 * c + r % 32] |= static_cast<std::uint8_t>((q & 0xf) << (r < 32 ? 0 : 4));
      if (five && (q & 16)) p[16 + r % 32] |= static_cast<std::uint8_t>(1u << (i / 32));
      want.push_back(half_value(d) * sc[i / 32] * q - half_value(dmin) * mn[i / 32]);
    }
  }
  expect_bits(decode(t, blk), want, ftp::model::dtype_name(t));
}

TEST(Dequantize, Q4KFollowsTheFormat) { k45(DType::q4_k, 17); }
TEST(Dequantize, Q5KFollowsTheFormat) { k45(DType::q5_k, 19); }

TEST(Dequantize, Q6KFollowsTheFormat) {
  std::mt19937 g(23);
  std::vector<std::uint8_t> blk(2 * 210, 0);
  std::vector<double> want;
  for (int b = 0; b < 2; ++b) {
    std::uint8_t* p = blk.data() + b * 210;
    const std::uint16_t d = random_half(g, b == 1);
    put16(p + 208, d);
    for (int grp = 0; grp < 16; ++grp) p[192 + grp] = static_cast<std::uint8_t>(g());
    for (int i = 0; i < 256; ++i) {
      const int q = static_cast<int>(g() % 64);  // value q - 32
      const int n = i / 128, s = (i % 128) / 32, l = i % 32;
      p[64 * n + 32 * (s % 2) + l] |= static_cast<std::uint8_t>((q & 0xf) << (s < 2 ? 0 : 4));
      p[128 + 32 * n + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * s));
      const int sc = static_cast<std::int8_t>(p[192 + i / 16]);
      want.push_back(half_value(d) * sc * (q - 32));
    }
  }
  expect_bits(decode(DType::q6_k, blk), want, "Q6_K");
}

TEST(Dequantize, KQuantLiteralBlocks) {
  // Q4_K, d = 1 (0x3c00), dmin = 0.5 (0x3800); group 0: scale 3 (byte 0),
  // min 2 (byte 4); group 4: scale 0x25 = 37 (low nibble 5 in byte 8, high
  // bits 2 in the top of byte 0), min 1 (high nibble of byte 8).
  // qs[0] = 0x07: weight 0 = 1 x 3 x 7 - 0.5 x 2 = 20; qs[128 - 32 .. ] low
  // nibble of byte 64 is weight 128 (chunk 2, group 4): q = 9 -> 37 x 9 -
  // 0.5 = 332.5.
  std::vector<std::uint8_t> q4k(144, 0);
  put16(q4k.data(), 0x3c00);
  put16(q4k.data() + 2, 0x3800);
  q4k[4 + 0] = static_cast<std::uint8_t>(3 | (2 << 6));
  q4k[4 + 4] = 2;
  q4k[4 + 8] = static_cast<std::uint8_t>(5 | (1 << 4));
  q4k[16 + 0] = 0x07;
  q4k[16 + 64] = 0x09;
  auto w = decode(DType::q4_k, q4k);
  EXPECT_EQ(w[0], 20.0f);
  EXPECT_EQ(w[128], 332.5f);
  EXPECT_EQ(w[1], -1.0f);   // q 0, group 0: -0.5 x 2
  // Q6_K, d = 0.25: scale of group 0 = -2, ql[0] = 0x0f, qh[0] = 0b10: weight
  // 0 = 0.25 x -2 x ((15 | 2 << 4) - 32) = -7.5.
  std::vector<std::uint8_t> q6k(210, 0);
  put16(q6k.data() + 208, 0x3400);
  q6k[192] = static_cast<std::uint8_t>(-2);
  q6k[0] = 0x0f;
  q6k[128] = 0x02;
  w = decode(DType::q6_k, q6k);
  EXPECT_EQ(w[0], -7.5f);
}

TEST(Dequantize, ToF32TakesPartsOfBlocksAndRefusesAMisalignedStart) {
  std::mt19937 g(29);
  std::vector<std::uint8_t> blk(2 * 144);
  for (auto& b : blk) b = static_cast<std::uint8_t>(g());
  put16(blk.data(), 0x3c00);
  put16(blk.data() + 144, 0x3c00);
  put16(blk.data() + 2, 0x3800);
  put16(blk.data() + 146, 0x3800);
  const auto all = decode(DType::q4_k, blk);
  ftp::model::TensorView t{"t", DType::q4_k, 1, 512, blk.data(), blk.size()};
  std::vector<float> part(300);
  ftp::model::to_f32(t, 0, 300, part.data());  // one block and 44 weights of the next
  for (int i = 0; i < 300; ++i) ASSERT_EQ(part[i], all[i]) << i;
  ftp::model::to_f32(t, 256, 10, part.data());
  for (int i = 0; i < 10; ++i) ASSERT_EQ(part[i], all[256 + i]) << i;
  EXPECT_THROW(ftp::model::to_f32(t, 32, 10, part.data()), ftp::Error);
  EXPECT_EQ(ftp::model::dtype_bytes(DType::q4_k, 512), 288u);
  EXPECT_EQ(ftp::model::dtype_block(DType::q3_k), 256);
  EXPECT_EQ(ftp::model::dtype_block(DType::q5_0), 32);
  EXPECT_THROW((void)ftp::model::dtype_bytes(DType::q6_k, 32), ftp::Error);
}

TEST(Dequantize, HalfConversionRoundTripsAndRoundsToEven) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    const float f = quant::f16_to_f32(static_cast<std::uint16_t>(h));
    ASSERT_EQ(quant::f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(quant::f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);             // halfway: to even (down)
  EXPECT_EQ(quant::f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);             // halfway: to even (up)
  EXPECT_EQ(quant::f32_to_f16(1.0f + 1.0f / 2048 + 1e-6f), 0x3c01);     // above halfway
  EXPECT_EQ(quant::f32_to_f16(70000.0f), 0x7c00);                       // overflow
}

TEST(Dequantize, EveryArchRefsQuantFileDecodesWithoutNaN) {
  const std::string dir = ftp::test::data_dir() + "/models/arch-refs";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not found (set FTP_TEST_DATA)";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".gguf" || name.find("-Q") == std::string::npos) continue;
    SCOPED_TRACE(name);
    const ftp::model::Model m = ftp::model::load_model(e.path().string());
    std::vector<const ftp::model::TensorView*> ts = {&m.weights.tok_embd, &m.weights.output};
    for (const auto& l : m.weights.layers)
      for (const auto* t : l.tensors()) ts.push_back(t);
    for (const auto* t : ts) {
      std::vector<float> v(static_cast<std::size_t>(t->elements()));
      ftp::model::to_f32(*t, 0, t->elements(), v.data());
      for (std::size_t i = 0; i < v.size(); ++i) ASSERT_TRUE(std::isfinite(v[i])) << t->name << " element " << i;
    }
    ++files;
  }
  EXPECT_EQ(files, 12);  // llama: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, Q4_K_M; qwen2-Q4_K_M
}

}  // namespace
