// SPDX-License-Identifier: Apache-2.0
#include "model/quant.hpp"

#include <cstring>

#include "core/error.hpp"

// ggml's reference rounds each product before the add or subtraction. The
// products of these formats are exact in float (a half's 11 bits times at
// most 13 bits of scale and quant), so a fused multiply-add would give the
// same bits; contraction (GCC's default in C++) is turned off all the same,
// so that the code computes what it says.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

// The per-type loops compiled twice, for AVX2 and for the baseline, chosen
// at load time: the block decoders vectorize 8 floats wide with AVX2 (the
// same IEEE operations, so the same bits).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FTP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FTP_CLONES
#endif
#define FTP_INLINE inline __attribute__((always_inline))

namespace ftp::model::quant {

namespace {

FTP_INLINE std::uint16_t u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

FTP_INLINE std::uint32_t u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

FTP_INLINE float half(const std::uint8_t* p) { return f16_to_f32(u16(p)); }

// Legacy blocks of 32: byte j of qs holds weight j (low nibble) and weight
// j + 16 (high nibble); Q5's qh bit j is the fifth bit of weight j.

FTP_INLINE void q4_0(const std::uint8_t* b, float* y) {
  const float d = half(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0f) - 8, x1 = (qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

FTP_INLINE void q4_1(const std::uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = qs[j] & 0x0f, x1 = qs[j] >> 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

FTP_INLINE void q5_0(const std::uint8_t* b, float* y) {
  const float d = half(b);
  const std::uint32_t qh = u32(b + 2);
  const std::uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    const int x0 = ((qs[j] & 0x0f) | h0) - 16, x1 = ((qs[j] >> 4) | h1) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

FTP_INLINE void q5_1(const std::uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const std::uint32_t qh = u32(b + 4);
  const std::uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4, h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    const int x0 = (qs[j] & 0x0f) | h0, x1 = (qs[j] >> 4) | h1;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

// K-quants: super-blocks of 256. In Q2_K and Q3_K, each 128-weight half
// reads 32 bytes of qs four times, two bits further each time (weights
// 32s + l and 32s + 16 + l of quarter s use byte l and l + 16); in Q4_K,
// Q5_K each 64 weights read 32 bytes twice (low nibble, then high).

FTP_INLINE void q2_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* sc = b;
  const std::uint8_t* q = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  int is = 0;
  for (int h = 0; h < 2; ++h, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part) {
        const std::uint8_t s = sc[is++];
        const float dl = d * static_cast<float>(s & 0x0f), ml = dmin * static_cast<float>(s >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[part * 16 + l] >> shift) & 3) - ml;
      }
}

/// Q3_K's 16 six-bit scales: byte j of the 12 holds scale j's low 4 bits
/// (j < 8) or scale j+8's (high nibble of byte j - 8), bytes 8..11 the
/// high 2 bits, scale j at bits 2 (j / 4) of byte 8 + j % 4.
FTP_INLINE void q3_k_scales(const std::uint8_t* s, int out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (lo | (hi << 4)) - 32;
  }
}

FTP_INLINE void q3_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* hm = b;
  const std::uint8_t* q = b + 32;
  int scales[16];
  q3_k_scales(b + 96, scales);
  const float d = half(b + 108);
  int is = 0;
  std::uint8_t m = 1;
  for (int h = 0; h < 2; ++h, q += 32)
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<std::uint8_t>(m << 1))
      for (int part = 0; part < 2; ++part) {
        const float dl = d * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int i = part * 16 + l;
          const int v = ((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
}

/// Q4_K and Q5_K: the 6-bit scale and min of group j (0..7) from the 12
/// bytes: groups 0-3 in the low 6 bits of bytes j (scale) and j + 4 (min);
/// groups 4-7 in the nibbles of byte j + 4, their high 2 bits in the top
/// bits of bytes j - 4 (scale) and j (min).
FTP_INLINE void scale_min_k4(int j, const std::uint8_t* s, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/// Q4_K and Q5_K (Five: qh, where bit 2k of byte l is the fifth bit of
/// weight 64k + l, bit 2k + 1 that of weight 64k + 32 + l).
template <bool Five>
FTP_INLINE void q45_k(const float d, const float dmin, const std::uint8_t* scales, const std::uint8_t* qh,
                      const std::uint8_t* q, float* y) {
  for (int k = 0; k < 4; ++k, q += 32) {
    int sc, mn;
    scale_min_k4(2 * k, scales, sc, mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    scale_min_k4(2 * k + 1, scales, sc, mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    const unsigned u1 = 1u << (2 * k), u2 = 2u << (2 * k);
    for (int l = 0; l < 32; ++l) {
      int v = q[l] & 0x0f;
      if constexpr (Five) v += (qh[l] & u1) ? 16 : 0;
      *y++ = d1 * static_cast<float>(v) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      int v = q[l] >> 4;
      if constexpr (Five) v += (qh[l] & u2) ? 16 : 0;
      *y++ = d2 * static_cast<float>(v) - m2;
    }
  }
}

FTP_INLINE void q4_k(const std::uint8_t* b, float* y) { q45_k<false>(half(b), half(b + 2), b + 4, nullptr, b + 16, y); }
FTP_INLINE void q5_k(const std::uint8_t* b, float* y) { q45_k<true>(half(b), half(b + 2), b + 4, b + 16, b + 48, y); }

/// Q6_K: per 128 weights, 64 bytes of ql (low 4 bits: weights l and l + 64
/// from byte l, l + 32 and l + 96 from byte l + 32) and 32 of qh (2 high
/// bits each, weights l, l + 32, l + 64, l + 96 at bits 0, 2, 4, 6 of byte
/// l); one int8 scale per 16 weights.
FTP_INLINE void q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < 2; ++n, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
}

FTP_INLINE void q8_0(const std::uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
}

#define FTP_ROWS(name, elems, bytes)                                                  \
  FTP_CLONES void rows_##name(const std::uint8_t* p, std::int64_t blocks, float* y) { \
    for (std::int64_t b = 0; b < blocks; ++b) name(p + b * (bytes), y + b * (elems));  \
  }
FTP_ROWS(q8_0, 32, 34)
FTP_ROWS(q4_0, 32, 18)
FTP_ROWS(q4_1, 32, 20)
FTP_ROWS(q5_0, 32, 22)
FTP_ROWS(q5_1, 32, 24)
FTP_ROWS(q2_k, 256, 84)
FTP_ROWS(q3_k, 256, 110)
FTP_ROWS(q4_k, 256, 144)
FTP_ROWS(q5_k, 256, 176)
FTP_ROWS(q6_k, 256, 210)
#undef FTP_ROWS

}  // namespace

float f16_to_f32(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf or NaN
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t f32_to_f16(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  const int exp = static_cast<int>(ax >> 23) - 127 + 15;
  std::uint32_t man = ax & 0x7fffffu;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: infinity
  int shift = 13;
  std::uint32_t base = 0;
  if (exp <= 0) {  // subnormal half (or zero): the implicit bit joins the mantissa
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    shift = 14 - exp;
  } else {
    base = static_cast<std::uint32_t>(exp) << 10;
  }
  std::uint32_t h = base + (man >> shift);
  const std::uint32_t rest = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | h);
}

BlockShape block_shape(DType t) noexcept {
  switch (t) {
    case DType::f32: return {1, 4};
    case DType::f16:
    case DType::bf16: return {1, 2};
    case DType::q8_0: return {32, 34};
    case DType::q4_0: return {32, 18};
    case DType::q4_1: return {32, 20};
    case DType::q5_0: return {32, 22};
    case DType::q5_1: return {32, 24};
    case DType::q2_k: return {256, 84};
    case DType::q3_k: return {256, 110};
    case DType::q4_k: return {256, 144};
    case DType::q5_k: return {256, 176};
    case DType::q6_k: return {256, 210};
  }
  return {1, 4};
}

bool is_quantized(DType t) noexcept { return block_shape(t).elems > 1; }

void dequantize(DType t, const void* src, std::int64_t blocks, float* out) {
  const auto* p = static_cast<const std::uint8_t*>(src);
  switch (t) {
    case DType::q8_0: return rows_q8_0(p, blocks, out);
    case DType::q4_0: return rows_q4_0(p, blocks, out);
    case DType::q4_1: return rows_q4_1(p, blocks, out);
    case DType::q5_0: return rows_q5_0(p, blocks, out);
    case DType::q5_1: return rows_q5_1(p, blocks, out);
    case DType::q2_k: return rows_q2_k(p, blocks, out);
    case DType::q3_k: return rows_q3_k(p, blocks, out);
    case DType::q4_k: return rows_q4_k(p, blocks, out);
    case DType::q5_k: return rows_q5_k(p, blocks, out);
    case DType::q6_k: return rows_q6_k(p, blocks, out);
    case DType::f32:
    case DType::f16:
    case DType::bf16: break;
  }
  throw Error(std::string("quant::dequantize: ") + dtype_name(t) + " is not a block type");
}

}  // namespace ftp::model::quant
