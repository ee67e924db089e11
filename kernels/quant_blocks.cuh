// SPDX-License-Identifier: Apache-2.0
// The block decoders of ggml's quantized weight types, shared by the CUDA
// kernels (matvec_quant*.cu, dequant.cu, embed.cu) and the CPU: plain C++
// when a host compiler reads it, __host__ __device__ under nvcc, so that
// tests/engine/test_quant_blocks.cpp checks every decoded weight bit for
// bit against model::quant::dequantize (ggml's reference) on the CPU.
// Layouts: lib/model/quant.hpp (ggml-common.h's block_q4_0 ... block_q6_K).
//
// A block is cut into chunks of 32 weights (one chunk per block for the
// legacy types, eight for the K-quants), a chunk being what one GPU lane
// decodes per step: consecutive lanes take consecutive chunks, so a warp
// reads consecutive bytes. A chunk's 32 weights lie in kRuns runs of
// kRunLen consecutive weights, run r at block element start(c) + r x
// kStride, each run under one scale: weight i of run r is
//   d x q[i] + m   (kHasMin: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), or
//   d x q[i]       (the others),
// q small integers (given as exact floats), d and m the run's float scale
// and min, computed as ggml computes them (m negated where ggml subtracts
// it), so that the one rounding of that expression is ggml's: the products
// are exact in float (an f16 scale's 11 bits times at most 13 bits of
// sub-scale and quant), so a fused multiply-add gives the same bits too.
//
//   type   bytes  chunks  runs x len, stride   loads per chunk
//   Q4_0     18     1       2 x 16, 16         9 x 2 B
//   Q4_1     20     1       2 x 16, 16         5 x 4 B
//   Q5_0     22     1       2 x 16, 16         11 x 2 B
//   Q5_1     24     1       2 x 16, 16         3 x 8 B
//   Q2_K     84     8       4 x  8, 32         5 x 4 B
//   Q3_K    110     8       4 x  8, 32         15 x 2 B
//   Q4_K    144     8       2 x 16, 32         2 x 16 B
//   Q5_K    176     8       2 x 16, 32         3 x 16 B
//   Q6_K    210     8       2 x 16, 64         17 x 2 B + 2 scale bytes
//
// Loads assume what a tensor row of whole blocks gives: the block's
// alignment is its size's largest power-of-two divisor (up to 16) when the
// row starts 16-byte aligned (cudaMalloc'd segments, whole-block views).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FTP_QB __host__ __device__ __forceinline__
#else
#define FTP_QB inline
#endif
#if defined(__CUDA_ARCH__)
#define FTP_QB_UNROLL _Pragma("unroll")
#else
#define FTP_QB_UNROLL
#endif

namespace ftp::kernels::qb {

/// The quantized types of this file (the matching WeightDType values).
enum class QType : int { q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k };

// ---------------------------------------------------------------------------
// Scalars

FTP_QB float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

FTP_QB std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

/// IEEE half bits to float, exact for every value (the hardware conversion
/// on the device; on the host the same result from the fields).
FTP_QB float half_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    exp = 127 - 15 + 1;  // subnormal: normalise
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    return bits_float(sign | (exp << 23) | ((man & 0x3ffu) << 13));
  }
  return bits_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
#endif
}

/// float to the nearest half (ties to even; overflow to infinity), back
/// to float: the f16 rounding of an activation block's scale.
FTP_QB float round_to_half(float f) {
#if defined(__CUDA_ARCH__)
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return half_float(h);
#else
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  std::uint32_t h;
  if (ax >= 0x7f800000u) {
    h = sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  } else {
    const int exp = static_cast<int>(ax >> 23) - 127 + 15;
    std::uint32_t man = ax & 0x7fffffu;
    if (exp >= 31) {
      h = sign | 0x7c00u;
    } else if (exp < -10) {
      h = sign;
    } else {
      int shift = 13;
      std::uint32_t base = 0;
      if (exp <= 0) {
        man |= 0x800000u;
        shift = 14 - exp;
      } else {
        base = static_cast<std::uint32_t>(exp) << 10;
      }
      h = base + (man >> shift);
      const std::uint32_t rest = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
      if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
      h |= sign;
    }
  }
  return half_float(static_cast<std::uint16_t>(h));
#endif
}

/// A small integer (|v| < 2^22) as float, exactly: one integer add and one
/// float subtraction (1.5 x 2^23 as the bias), cheaper on the device than
/// an int-to-float conversion.
FTP_QB float small_int_float(int v) { return bits_float(0x4B400000u + static_cast<std::uint32_t>(v)) - 12582912.0f; }

FTP_QB float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// ---------------------------------------------------------------------------
// Loads: `p` aligned to the load's size (see the head of the file).

FTP_QB std::uint32_t ld16(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(reinterpret_cast<const unsigned short*>(p));
#else
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

FTP_QB std::uint32_t ld32(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(reinterpret_cast<const unsigned int*>(p));
#else
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

/// 4-byte words w[0..n) from a 2-byte aligned address.
template <int N>
FTP_QB void ld_words_2(const std::uint8_t* p, std::uint32_t* w) {
FTP_QB_UNROLL
  for (int i = 0; i < N; ++i) w[i] = ld16(p + 4 * i) | (ld16(p + 4 * i + 2) << 16);
}

/// 4-byte words w[0..n) from a 4-byte aligned address.
template <int N>
FTP_QB void ld_words_4(const std::uint8_t* p, std::uint32_t* w) {
FTP_QB_UNROLL
  for (int i = 0; i < N; ++i) w[i] = ld32(p + 4 * i);
}

/// Two 4-byte words from an 8-byte aligned address.
FTP_QB void ld_words_8(const std::uint8_t* p, std::uint32_t* w) {
#if defined(__CUDA_ARCH__)
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  w[0] = v.x, w[1] = v.y;
#else
  std::memcpy(w, p, 8);
#endif
}

/// Four 4-byte words from a 16-byte aligned address.
FTP_QB void ld_words_16(const std::uint8_t* p, std::uint32_t* w) {
#if defined(__CUDA_ARCH__)
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  std::memcpy(w, p, 16);
#endif
}

FTP_QB std::uint32_t ld8(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

/// Byte i of the N little-endian words w. The word is picked by selects,
/// not by indexing: i may be known only at run time (a chunk's scale), and
/// an array indexed so would leave registers for local memory.
template <int N>
FTP_QB int byte_of(const std::uint32_t* w, int i) {
  static_assert(N >= 1 && N <= 4);
  std::uint32_t v = w[0];
  if constexpr (N > 1) v = (i >> 2) == 1 ? w[1] : v;
  if constexpr (N > 2) v = (i >> 2) == 2 ? w[2] : v;
  if constexpr (N > 3) v = (i >> 2) == 3 ? w[3] : v;
  return static_cast<int>((v >> (8 * (i & 3))) & 0xffu);
}

// ---------------------------------------------------------------------------
// Scale unpacking of the K-quants

/// Q4_K and Q5_K: the 6-bit scale and min of group j (0..7) from the 12
/// scale bytes (given as the words s, byte 0 = the block's byte 4): groups
/// 0-3 in the low 6 bits of bytes j (scale) and j + 4 (min); groups 4-7 in
/// the nibbles of byte j + 4, their high 2 bits in the top bits of bytes
/// j - 4 (scale) and j (min).
/// (Byte j & 3 of each of the three words, shifted by a run-time amount:
/// no word is picked by a run-time index.)
FTP_QB void scale_min_k4(const std::uint32_t* s, int j, int& sc, int& mn) {
  const int sh = 8 * (j & 3);
  const int b0 = static_cast<int>((s[0] >> sh) & 0xffu), b1 = static_cast<int>((s[1] >> sh) & 0xffu),
            b2 = static_cast<int>((s[2] >> sh) & 0xffu);
  if (j < 4) {
    sc = b0 & 63;
    mn = b1 & 63;
  } else {
    sc = (b2 & 0x0f) | ((b0 >> 6) << 4);
    mn = (b2 >> 4) | ((b1 >> 6) << 4);
  }
}

/// Q3_K: the signed 6-bit scale j (0..15) from the 12 scale bytes (words
/// s): low 4 bits in byte j (j < 8) or the high nibble of byte j - 8, high
/// 2 bits at bits 2 (j / 4) of byte 8 + j % 4; minus 32.
FTP_QB int scale_q3_k(const std::uint32_t* s, int j) {
  const int lo = j < 8 ? byte_of<3>(s, j) & 0x0f : byte_of<3>(s, j - 8) >> 4;
  const int hi = (byte_of<3>(s, 8 + (j & 3)) >> (2 * (j >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

// ---------------------------------------------------------------------------
// The types. Each: kElems, kBytes, kChunks, kRuns, kRunLen, kStride,
// kHasMin; Raw (a chunk's bytes, loaded once); load(block, c);
// start(c); run(raw, c, r, q, d, m).

template <QType T>
struct Block;

/// Legacy blocks of 32: byte j of qs holds weight j (low nibble) and
/// j + 16 (high): run 0 the low nibbles, run 1 the high ones.
template <>
struct Block<QType::q4_0> {
  static constexpr int kElems = 32, kBytes = 18, kChunks = 1, kRuns = 2, kRunLen = 16, kStride = 16;
  static constexpr bool kHasMin = false;
  struct Raw {
    std::uint32_t d, qs[4];
  };
  FTP_QB static Raw load(const std::uint8_t* b, int) {
    Raw r;
    r.d = ld16(b);
    ld_words_2<4>(b + 2, r.qs);
    return r;
  }
  FTP_QB static int start(int) { return 0; }
  FTP_QB static void run(const Raw& raw, int, int r, float* q, float& d, float& m) {
    d = half_float(static_cast<std::uint16_t>(raw.d));
    m = 0.0f;
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) q[i] = small_int_float(((byte_of<4>(raw.qs, i) >> (4 * r)) & 0x0f) - 8);
  }
};

template <>
struct Block<QType::q4_1> {
  static constexpr int kElems = 32, kBytes = 20, kChunks = 1, kRuns = 2, kRunLen = 16, kStride = 16;
  static constexpr bool kHasMin = true;
  struct Raw {
    std::uint32_t dm, qs[4];
  };
  FTP_QB static Raw load(const std::uint8_t* b, int) {
    Raw r;
    r.dm = ld32(b);
    ld_words_4<4>(b + 4, r.qs);
    return r;
  }
  FTP_QB static int start(int) { return 0; }
  FTP_QB static void run(const Raw& raw, int, int r, float* q, float& d, float& m) {
    d = half_float(static_cast<std::uint16_t>(raw.dm & 0xffffu));
    m = half_float(static_cast<std::uint16_t>(raw.dm >> 16));
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) q[i] = small_int_float((byte_of<4>(raw.qs, i) >> (4 * r)) & 0x0f);
  }
};

/// Q5: bit j of the 32-bit qh is the fifth bit of weight j.
template <>
struct Block<QType::q5_0> {
  static constexpr int kElems = 32, kBytes = 22, kChunks = 1, kRuns = 2, kRunLen = 16, kStride = 16;
  static constexpr bool kHasMin = false;
  struct Raw {
    std::uint32_t d, qh, qs[4];
  };
  FTP_QB static Raw load(const std::uint8_t* b, int) {
    Raw r;
    r.d = ld16(b);
    r.qh = ld16(b + 2) | (ld16(b + 4) << 16);
    ld_words_2<4>(b + 6, r.qs);
    return r;
  }
  FTP_QB static int start(int) { return 0; }
  FTP_QB static void run(const Raw& raw, int, int r, float* q, float& d, float& m) {
    d = half_float(static_cast<std::uint16_t>(raw.d));
    m = 0.0f;
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) {
      const int h = static_cast<int>((raw.qh >> (i + 16 * r)) & 1u) << 4;
      q[i] = small_int_float((((byte_of<4>(raw.qs, i) >> (4 * r)) & 0x0f) | h) - 16);
    }
  }
};

template <>
struct Block<QType::q5_1> {
  static constexpr int kElems = 32, kBytes = 24, kChunks = 1, kRuns = 2, kRunLen = 16, kStride = 16;
  static constexpr bool kHasMin = true;
  struct Raw {
    std::uint32_t dm, qh, qs[4];
  };
  FTP_QB static Raw load(const std::uint8_t* b, int) {
    Raw r;
    std::uint32_t w[2];
    ld_words_8(b, w);
    r.dm = w[0];
    r.qh = w[1];
    ld_words_8(b + 8, r.qs);
    ld_words_8(b + 16, r.qs + 2);
    return r;
  }
  FTP_QB static int start(int) { return 0; }
  FTP_QB static void run(const Raw& raw, int, int r, float* q, float& d, float& m) {
    d = half_float(static_cast<std::uint16_t>(raw.dm & 0xffffu));
    m = half_float(static_cast<std::uint16_t>(raw.dm >> 16));
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) {
      const int h = static_cast<int>((raw.qh >> (i + 16 * r)) & 1u) << 4;
      q[i] = small_int_float(((byte_of<4>(raw.qs, i) >> (4 * r)) & 0x0f) | h);
    }
  }
};

/// Q2_K: each 128-weight half h reads 32 bytes of qs four times, two bits
/// further each time: weight 128h + 32s + b is bits 2s of byte b, under
/// scale byte 8h + 2s + b / 16 (scale low 4 bits, min high 4). Chunk c =
/// 4h + p: bytes 8p..8p+7 of the half, runs s = 0..3 of 8 weights.
template <>
struct Block<QType::q2_k> {
  static constexpr int kElems = 256, kBytes = 84, kChunks = 8, kRuns = 4, kRunLen = 8, kStride = 32;
  static constexpr bool kHasMin = true;
  struct Raw {
    std::uint32_t sc[2], qs[2], dd;
  };
  FTP_QB static Raw load(const std::uint8_t* b, int c) {
    Raw r;
    const int h = c >> 2, p = c & 3;
    ld_words_4<2>(b + 8 * h, r.sc);
    ld_words_4<2>(b + 16 + 32 * h + 8 * p, r.qs);
    r.dd = ld32(b + 80);
    return r;
  }
  FTP_QB static int start(int c) { return 128 * (c >> 2) + 8 * (c & 3); }
  FTP_QB static void run(const Raw& raw, int c, int s, float* q, float& d, float& m) {
    const int sc = byte_of<2>(raw.sc, 2 * s + ((c & 3) >> 1));
    d = fmul(half_float(static_cast<std::uint16_t>(raw.dd & 0xffffu)), static_cast<float>(sc & 0x0f));
    m = -fmul(half_float(static_cast<std::uint16_t>(raw.dd >> 16)), static_cast<float>(sc >> 4));
FTP_QB_UNROLL
    for (int i = 0; i < 8; ++i) q[i] = small_int_float((byte_of<2>(raw.qs, i) >> (2 * s)) & 3);
  }
};

/// Q3_K: Q2_K's layout of the low 2 bits; the third bit of weight
/// 128h + 32s + b is bit 4h + s of hmask byte b (set: q, clear: q - 4);
/// 16 signed 6-bit scales.
template <>
struct Block<QType::q3_k> {
  static constexpr int kElems = 256, kBytes = 110, kChunks = 8, kRuns = 4, kRunLen = 8, kStride = 32;
  static constexpr bool kHasMin = false;
  struct Raw {
    std::uint32_t hm[2], qs[2], sc[3], d;
  };
  FTP_QB static Raw load(const std::uint8_t* b, int c) {
    Raw r;
    const int h = c >> 2, p = c & 3;
    ld_words_2<2>(b + 8 * p, r.hm);
    ld_words_2<2>(b + 32 + 32 * h + 8 * p, r.qs);
    ld_words_2<3>(b + 96, r.sc);
    r.d = ld16(b + 108);
    return r;
  }
  FTP_QB static int start(int c) { return 128 * (c >> 2) + 8 * (c & 3); }
  FTP_QB static void run(const Raw& raw, int c, int s, float* q, float& d, float& m) {
    const int h = c >> 2, j = 8 * h + 2 * s + ((c & 3) >> 1);
    d = fmul(half_float(static_cast<std::uint16_t>(raw.d)), static_cast<float>(scale_q3_k(raw.sc, j)));
    m = 0.0f;
    const int bit = 4 * h + s;
FTP_QB_UNROLL
    for (int i = 0; i < 8; ++i) {
      const int lo = (byte_of<2>(raw.qs, i) >> (2 * s)) & 3;
      const int hi = (byte_of<2>(raw.hm, i) >> bit) & 1;
      q[i] = small_int_float(lo - (hi ? 0 : 4));
    }
  }
};

/// Q4_K: the 128 bytes of qs in four pairs of 32-weight groups: byte
/// 32k + l holds weight 64k + l (low nibble, group 2k) and 64k + 32 + l
/// (high, group 2k + 1). Chunk c = 2k + e: qs bytes 32k + 16e .. + 15, run
/// 0 the low nibbles, run 1 the high ones.
template <>
struct Block<QType::q4_k> {
  static constexpr int kElems = 256, kBytes = 144, kChunks = 8, kRuns = 2, kRunLen = 16, kStride = 32;
  static constexpr bool kHasMin = true;
  struct Raw {
    std::uint32_t head[4], qs[4];  // head: d, dmin, scales[12]
  };
  FTP_QB static Raw load(const std::uint8_t* b, int c) {
    Raw r;
    ld_words_16(b, r.head);
    ld_words_16(b + 16 + 16 * c, r.qs);
    return r;
  }
  FTP_QB static int start(int c) { return 64 * (c >> 1) + 16 * (c & 1); }
  FTP_QB static void run(const Raw& raw, int c, int r, float* q, float& d, float& m) {
    int sc, mn;
    scale_min_k4(raw.head + 1, 2 * (c >> 1) + r, sc, mn);
    d = fmul(half_float(static_cast<std::uint16_t>(raw.head[0] & 0xffffu)), static_cast<float>(sc));
    m = -fmul(half_float(static_cast<std::uint16_t>(raw.head[0] >> 16)), static_cast<float>(mn));
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) q[i] = small_int_float((byte_of<4>(raw.qs, i) >> (4 * r)) & 0x0f);
  }
};

/// Q5_K: Q4_K's layout, and the fifth bit of weight 64k + l (64k + 32 + l)
/// at bit 2k (2k + 1) of qh byte l.
template <>
struct Block<QType::q5_k> {
  static constexpr int kElems = 256, kBytes = 176, kChunks = 8, kRuns = 2, kRunLen = 16, kStride = 32;
  static constexpr bool kHasMin = true;
  struct Raw {
    std::uint32_t head[4], qh[4], qs[4];
  };
  FTP_QB static Raw load(const std::uint8_t* b, int c) {
    Raw r;
    ld_words_16(b, r.head);
    ld_words_16(b + 16 + 16 * (c & 1), r.qh);
    ld_words_16(b + 48 + 16 * c, r.qs);
    return r;
  }
  FTP_QB static int start(int c) { return 64 * (c >> 1) + 16 * (c & 1); }
  FTP_QB static void run(const Raw& raw, int c, int r, float* q, float& d, float& m) {
    const int g = 2 * (c >> 1) + r;
    int sc, mn;
    scale_min_k4(raw.head + 1, g, sc, mn);
    d = fmul(half_float(static_cast<std::uint16_t>(raw.head[0] & 0xffffu)), static_cast<float>(sc));
    m = -fmul(half_float(static_cast<std::uint16_t>(raw.head[0] >> 16)), static_cast<float>(mn));
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) {
      const int h = ((byte_of<4>(raw.qh, i) >> g) & 1) << 4;
      q[i] = small_int_float(((byte_of<4>(raw.qs, i) >> (4 * r)) & 0x0f) + h);
    }
  }
};

/// Q6_K: per 128-weight half n, 64 bytes of ql and 32 of qh: weight
/// 128n + 32a + l (a = 0..3, l < 32) has the low nibble (a < 2) or high
/// nibble (a >= 2) of ql byte 32 (a & 1) + l and bits 2a of qh byte l,
/// under int8 scale (its index / 16). Chunk c = 4n + j: ql bytes 16j..16j+15
/// of the half, qh bytes 16 (j & 1) .. + 15; run 0 the low nibbles
/// (weights 128n + 32 (j >> 1) + 16 (j & 1) + i), run 1 the high ones (64
/// further).
template <>
struct Block<QType::q6_k> {
  static constexpr int kElems = 256, kBytes = 210, kChunks = 8, kRuns = 2, kRunLen = 16, kStride = 64;
  static constexpr bool kHasMin = false;
  struct Raw {
    std::uint32_t ql[4], qh[4], sc, d;  // sc: the two int8 scales, run 0 low byte
  };
  FTP_QB static Raw load(const std::uint8_t* b, int c) {
    Raw r;
    const int n = c >> 2, j = c & 3;
    ld_words_2<4>(b + 64 * n + 16 * j, r.ql);
    ld_words_2<4>(b + 128 + 32 * n + 16 * (j & 1), r.qh);
    const int s0 = 192 + (start(c) >> 4);  // run 0's scale; run 1's is 4 further
    r.sc = ld8(b + s0) | (ld8(b + s0 + 4) << 8);
    r.d = ld16(b + 208);
    return r;
  }
  FTP_QB static int start(int c) { return 128 * (c >> 2) + 32 * ((c & 3) >> 1) + 16 * (c & 1); }
  FTP_QB static void run(const Raw& raw, int c, int r, float* q, float& d, float& m) {
    const int sc = static_cast<int>(static_cast<std::int8_t>((raw.sc >> (8 * r)) & 0xffu));
    d = fmul(half_float(static_cast<std::uint16_t>(raw.d)), static_cast<float>(sc));
    m = 0.0f;
    const int shift = 2 * ((c & 3) >> 1) + 4 * r;
FTP_QB_UNROLL
    for (int i = 0; i < 16; ++i) {
      const int lo = (byte_of<4>(raw.ql, i) >> (4 * r)) & 0x0f;
      const int hi = (byte_of<4>(raw.qh, i) >> shift) & 3;
      q[i] = small_int_float((lo | (hi << 4)) - 32);
    }
  }
};

// ---------------------------------------------------------------------------
// Integer dots (IntDot<T>::run, every type): a run's quants against its
// kRunLen int8 activation quants (kRunLen / 4 words, as the Q8
// quantization leaves them), as ggml's vec_dot_<type>_q8_0/q8_1/q8_K
// kernels form them: sum_i q[i] x qx[i] with q[i] run()'s quants, exactly
// (xsum = sum_i qx[i], for the quants that carry an offset); the caller
// scales it by the run's d (and adds m x xsum) and the activation block's
// scale. Each builds the quants as bytes (0..63, positive as signed
// bytes), four to a word, and subtracts the offset once.

/// sum of the 4 signed byte products of a and b, plus c (__dp4a).
FTP_QB int dp4a(std::uint32_t a, std::uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int>(static_cast<std::int8_t>((a >> (8 * i)) & 0xffu)) *
         static_cast<int>(static_cast<std::int8_t>((b >> (8 * i)) & 0xffu));
  return c;
#endif
}

/// sum of the 4 N int8 quants of N words.
template <int N>
FTP_QB int sum_q8(const std::uint32_t* xq) {
  int s = 0;
  FTP_QB_UNROLL
  for (int i = 0; i < N; ++i) s = dp4a(0x01010101u, xq[i], s);
  return s;
}

/// Bits b, b + 1, b + 2, b + 3 of v as bit 0 of four bytes.
FTP_QB std::uint32_t spread4(std::uint32_t v, int b) {
  const std::uint32_t n = (v >> b) & 0xfu;
  return (n & 1u) | ((n & 2u) << 7) | ((n & 4u) << 14) | ((n & 8u) << 21);
}

/// The low (r = 0) or high (r = 1) nibbles of 16 bytes (4 words) dotted
/// with 16 activation quants; hi5: bits of the 32-bit qh at b, b + 1, ...
/// as their fifth bits (Q5_0, Q5_1; null for none).
FTP_QB int nibble_dot(const std::uint32_t* qs, int r, const std::uint32_t* xq, const std::uint32_t* hi5 = nullptr,
                      int b = 0) {
  int s = 0;
  FTP_QB_UNROLL
  for (int i = 0; i < 4; ++i) {
    std::uint32_t q = (qs[i] >> (4 * r)) & 0x0f0f0f0fu;
    if (hi5) q |= spread4(*hi5, b + 4 * i) << 4;
    s = dp4a(q, xq[i], s);
  }
  return s;
}

template <QType T>
struct IntDot;

/// Q4_0: nibbles (as bytes 0..15) dotted, less 8 x xsum.
template <>
struct IntDot<QType::q4_0> {
  FTP_QB static int run(const Block<QType::q4_0>::Raw& raw, int, int r, const std::uint32_t* xq, int xsum) {
    return nibble_dot(raw.qs, r, xq) - 8 * xsum;
  }
};

/// Q4_1: nibbles dotted (its min goes with xsum, in the caller).
template <>
struct IntDot<QType::q4_1> {
  FTP_QB static int run(const Block<QType::q4_1>::Raw& raw, int, int r, const std::uint32_t* xq, int) {
    return nibble_dot(raw.qs, r, xq);
  }
};

/// Q5_0 and Q5_1: nibbles with qh's bit (i + 16 r) as their fifth bit;
/// Q5_0 less 16 x xsum.
template <>
struct IntDot<QType::q5_0> {
  FTP_QB static int run(const Block<QType::q5_0>::Raw& raw, int, int r, const std::uint32_t* xq, int xsum) {
    return nibble_dot(raw.qs, r, xq, &raw.qh, 16 * r) - 16 * xsum;
  }
};

template <>
struct IntDot<QType::q5_1> {
  FTP_QB static int run(const Block<QType::q5_1>::Raw& raw, int, int r, const std::uint32_t* xq, int) {
    return nibble_dot(raw.qs, r, xq, &raw.qh, 16 * r);
  }
};

/// Q2_K: run s's 2-bit quants (bits 2s of the chunk's 8 qs bytes).
template <>
struct IntDot<QType::q2_k> {
  FTP_QB static int run(const Block<QType::q2_k>::Raw& raw, int, int s, const std::uint32_t* xq, int) {
    int sum = 0;
    FTP_QB_UNROLL
    for (int i = 0; i < 2; ++i) sum = dp4a((raw.qs[i] >> (2 * s)) & 0x03030303u, xq[i], sum);
    return sum;
  }
};

/// Q3_K: the 2 low bits and hmask's bit (4h + s) as bit 2: q + 4 (0..7),
/// less 4 x xsum.
template <>
struct IntDot<QType::q3_k> {
  FTP_QB static int run(const Block<QType::q3_k>::Raw& raw, int c, int s, const std::uint32_t* xq, int xsum) {
    const int bit = 4 * (c >> 2) + s;
    int sum = 0;
    FTP_QB_UNROLL
    for (int i = 0; i < 2; ++i)
      sum = dp4a(((raw.qs[i] >> (2 * s)) & 0x03030303u) | (((raw.hm[i] >> bit) & 0x01010101u) << 2), xq[i], sum);
    return sum - 4 * xsum;
  }
};

/// Q4_K: the run's nibbles (0..15) dotted.
template <>
struct IntDot<QType::q4_k> {
  FTP_QB static int run(const Block<QType::q4_k>::Raw& raw, int, int r, const std::uint32_t* xq, int) {
    return nibble_dot(raw.qs, r, xq);
  }
};

/// Q5_K: nibbles with qh's bit g (the run's group) as their fifth bit.
template <>
struct IntDot<QType::q5_k> {
  FTP_QB static int run(const Block<QType::q5_k>::Raw& raw, int c, int r, const std::uint32_t* xq, int) {
    const int g = 2 * (c >> 1) + r;
    int s = 0;
    FTP_QB_UNROLL
    for (int i = 0; i < 4; ++i)
      s = dp4a(((raw.qs[i] >> (4 * r)) & 0x0f0f0f0fu) | (((raw.qh[i] >> g) & 0x01010101u) << 4), xq[i], s);
    return s;
  }
};

/// Q6_K: the 6-bit quants (0..63, positive as signed bytes) dotted, less
/// 32 x xsum.
template <>
struct IntDot<QType::q6_k> {
  FTP_QB static int run(const Block<QType::q6_k>::Raw& raw, int c, int r, const std::uint32_t* xq, int xsum) {
    const int shift = 2 * ((c & 3) >> 1) + 4 * r;
    int s = 0;
    FTP_QB_UNROLL
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t q = ((raw.ql[i] >> (4 * r)) & 0x0f0f0f0fu) | (((raw.qh[i] >> shift) & 0x03030303u) << 4);
      s = dp4a(q, xq[i], s);
    }
    return s - 32 * xsum;
  }
};

/// Weight i of a run: d x q (+ m), rounded once as ggml rounds it.
template <QType T>
FTP_QB float weight(float d, float q, float m) {
  if constexpr (Block<T>::kHasMin) return fmul(d, q) + m;
  else return fmul(d, q);
}

/// Decodes chunk c of block b: out[e] for every block element e of the
/// chunk (out holds the block's kElems floats; the chunk writes 32).
template <QType T>
FTP_QB void decode_chunk(const std::uint8_t* b, int c, float* out) {
  using B = Block<T>;
  const typename B::Raw raw = B::load(b, c);
  const int s = B::start(c);
FTP_QB_UNROLL
  for (int r = 0; r < B::kRuns; ++r) {
    float q[B::kRunLen], d, m;
    B::run(raw, c, r, q, d, m);
FTP_QB_UNROLL
    for (int i = 0; i < B::kRunLen; ++i) out[s + r * B::kStride + i] = weight<T>(d, q[i], m);
  }
}

// ---------------------------------------------------------------------------
// One lane's step of the block-type GEMV (kernels/matvec_quant_impl.cuh):
// chunk c of one block for R rows (raw[r]: each row's bytes of the chunk)
// and up to T tokens (nt of them), added into acc[r][u]. Here so that the
// CPU test runs the kernel's arithmetic (tests/engine/test_quant_blocks.cpp).

/// Four floats from a 16-byte aligned address.
FTP_QB void ld_floats_4(const float* p, float* v) {
#if defined(__CUDA_ARCH__)
  const float4 f = __ldg(reinterpret_cast<const float4*>(p));
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
#else
  std::memcpy(v, p, 16);
#endif
}

FTP_QB float ld_float(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

/// The float path: each run's quants dotted with the float activations
/// (xc: the chunk's first activation of token 0, 16-byte aligned; tokens
/// x_ld floats apart), the sum scaled once by the run's d (+ m x the sum of
/// the activations).
template <QType Q, int R, int T>
FTP_QB void chunk_float(const typename Block<Q>::Raw (&raw)[R], int c, const float* xc, int x_ld, int nt,
                        float (&acc)[R][T]) {
  using B = Block<Q>;
  FTP_QB_UNROLL
  for (int run = 0; run < B::kRuns; ++run) {
    float q[R][B::kRunLen], d[R], m[R];
    FTP_QB_UNROLL
    for (int r = 0; r < R; ++r) B::run(raw[r], c, run, q[r], d[r], m[r]);
    FTP_QB_UNROLL
    for (int u = 0; u < T; ++u) {
      if (u < nt) {
        const float* xp = xc + static_cast<std::int64_t>(u) * x_ld + run * B::kStride;
        float s[R], sx = 0.0f;
        FTP_QB_UNROLL
        for (int r = 0; r < R; ++r) s[r] = 0.0f;
        FTP_QB_UNROLL
        for (int v = 0; v < B::kRunLen / 4; ++v) {
          float xv[4];
          ld_floats_4(xp + 4 * v, xv);
          if constexpr (B::kHasMin) sx += (xv[0] + xv[1]) + (xv[2] + xv[3]);
          FTP_QB_UNROLL
          for (int r = 0; r < R; ++r)
            FTP_QB_UNROLL
            for (int i = 0; i < 4; ++i) s[r] = fmaf(q[r][4 * v + i], xv[i], s[r]);
        }
        FTP_QB_UNROLL
        for (int r = 0; r < R; ++r) {
          acc[r][u] = fmaf(d[r], s[r], acc[r][u]);
          if constexpr (B::kHasMin) acc[r][u] = fmaf(m[r], sx, acc[r][u]);
        }
      }
    }
  }
}

/// The integer path: each run's quants dotted with its kRunLen activation
/// quants (xq0: the chunk's first quant of token 0, aligned to the run's
/// bytes; tokens q_ld bytes apart) in dp4a, times the run's d (+ m x their
/// sum), times the activation block's scale (dx0: token 0's scale of the
/// block; tokens d_ld floats apart; the activation blocks are the weight
/// blocks: 32 for the legacy types, 256 for the K-quants).
template <QType Q, int R, int T>
FTP_QB void chunk_int(const typename Block<Q>::Raw (&raw)[R], int c, const std::uint8_t* xq0, int q_ld,
                      const float* dx0, int d_ld, int nt, float (&acc)[R][T]) {
  using B = Block<Q>;
  using D = IntDot<Q>;
  constexpr int N = B::kRunLen / 4;  // words of activation quants a run
  static_assert(N == 4 || N == 2, "runs of 16 or 8 weights");
  float dx[T];
  FTP_QB_UNROLL
  for (int u = 0; u < T; ++u) dx[u] = u < nt ? ld_float(dx0 + static_cast<std::int64_t>(u) * d_ld) : 0.0f;
  FTP_QB_UNROLL
  for (int run = 0; run < B::kRuns; ++run) {
    float d[R], m[R];
    FTP_QB_UNROLL
    for (int r = 0; r < R; ++r) {
      float q[B::kRunLen];  // unused here: only the scales are kept
      B::run(raw[r], c, run, q, d[r], m[r]);
    }
    FTP_QB_UNROLL
    for (int u = 0; u < T; ++u) {
      if (u < nt) {
        const std::uint8_t* p = xq0 + static_cast<std::int64_t>(u) * q_ld + run * B::kStride;
        std::uint32_t xq[N];
        if constexpr (N == 4) {
          ld_words_16(p, xq);
        } else {
          ld_words_8(p, xq);
        }
        const int xsum = sum_q8<N>(xq);
        FTP_QB_UNROLL
        for (int r = 0; r < R; ++r) {
          float v = d[r] * static_cast<float>(D::run(raw[r], c, run, xq, xsum));
          if constexpr (B::kHasMin) v = fmaf(m[r], static_cast<float>(xsum), v);
          acc[r][u] = fmaf(dx[u], v, acc[r][u]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Activations quantized as llama.cpp's CPU backend quantizes them before
// its dots (engine::ops::quantize_activations), given back as the floats
// q x d: blocks of 32 as Q8_0/Q8_1 for the legacy types, of 256 as Q8_K
// for the K-quants. The element steps are shared; how a block's maximum is
// found (a loop here, warp shuffles on the device) is the caller's.

/// Q8_0 / Q8_1 of a block whose largest magnitude is amax: d rounded to f16,
/// and 127 / amax (0 for a block of zeros).
struct Q8Scale {
  float d, id;
  bool zero;  ///< Q8_K of a block of zeros: every value +0
};
FTP_QB Q8Scale q8_0_scale(float amax) {
  return {round_to_half(amax / 127.0f), amax != 0.0f ? 127.0f / amax : 0.0f, false};
}
/// The value q x d of x (from the float quant: -0 stays -0, as the CPU's)
/// and its quant as an integer (|q| <= 127).
FTP_QB float q8_0_value(float x, Q8Scale s) { return fmul(rintf(fmul(x, s.id)), s.d); }
FTP_QB int q8_0_int(float x, Q8Scale s) { return static_cast<int>(rintf(fmul(x, s.id))); }

/// Q8_K of a block whose element of largest magnitude (the first of equal
/// ones) is `max`: iscale = -127 / max, d = 1 / iscale; max 0: every value 0.
FTP_QB Q8Scale q8_k_scale(float max) {
  if (max == 0.0f) return {0.0f, 0.0f, true};
  const float iscale = -127.0f / max;
  return {1.0f / iscale, iscale, false};
}
/// The quant of x (|q| <= 127: |x / d| <= 127 up to rounding, capped) and
/// its value q x d (+0 in a block of zeros).
FTP_QB int q8_k_int(float x, Q8Scale s) {
  if (s.zero) return 0;
  const float q = rintf(fmul(s.id, x));
  return static_cast<int>(q < 127.0f ? q : 127.0f);
}
FTP_QB float q8_k_value(float x, Q8Scale s) {
  if (s.zero) return 0.0f;
  const float q = rintf(fmul(s.id, x));
  return fmul(q < 127.0f ? q : 127.0f, s.d);
}

/// Whether candidate (a, ia) -- a magnitude and its element index -- beats
/// (b, ib) as a Q8_K block's maximum: larger, or as large and earlier.
FTP_QB bool q8_k_beats(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

/// One block of n (<= 32 or 256) activations, serially (the host's form;
/// what the device's warps compute in parallel).
FTP_QB void quantize_block(bool k_quant, const float* x, int n, float* out) {
  if (k_quant) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j)
      if (fabsf(x[j]) > amax) {  // strictly: the first of equal magnitudes
        amax = fabsf(x[j]);
        max = x[j];
      }
    const Q8Scale s = q8_k_scale(max);
    for (int j = 0; j < n; ++j) out[j] = q8_k_value(x[j], s);
  } else {
    float amax = 0.0f;
    for (int j = 0; j < n; ++j) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const Q8Scale s = q8_0_scale(amax);
    for (int j = 0; j < n; ++j) out[j] = q8_0_value(x[j], s);
  }
}

}  // namespace ftp::kernels::qb

#undef FTP_QB
#undef FTP_QB_UNROLL
