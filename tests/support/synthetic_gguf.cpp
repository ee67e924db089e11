// SPDX-License-Identifier: Apache-2.0
#include "synthetic_gguf.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace ftp::testing {

namespace {

using model::DType;

constexpr std::size_t kAlign = 32;

// GGUF value types and ggml tensor types (the file's numbers).
constexpr std::uint32_t kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9;

std::uint32_t ggml_type(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::q4_0: return 2;
    case DType::q4_1: return 3;
    case DType::q5_0: return 6;
    case DType::q5_1: return 7;
    case DType::q8_0: return 8;
    case DType::q2_k: return 10;
    case DType::q3_k: return 11;
    case DType::q4_k: return 12;
    case DType::q5_k: return 13;
    case DType::q6_k: return 14;
    case DType::bf16: return 30;
  }
  return 0;
}

/// Offsets of a block's f16 fields and the magnitude of (quant x sub-scale)
/// at its largest, per ggml-common.h; mins (the second field of Q4_1, Q5_1
/// and the K-quants but Q3_K, Q6_K) get a tenth of the scale.
struct HalfFields {
  int at[2];
  int n;
  float q_max;
};
HalfFields half_fields(DType t) {
  switch (t) {
    case DType::q8_0: return {{0, 0}, 1, 127};
    case DType::q4_0: return {{0, 0}, 1, 8};
    case DType::q4_1: return {{0, 2}, 2, 15};
    case DType::q5_0: return {{0, 0}, 1, 16};
    case DType::q5_1: return {{0, 2}, 2, 31};
    case DType::q2_k: return {{80, 82}, 2, 3 * 15};
    case DType::q3_k: return {{108, 0}, 1, 4 * 32};
    case DType::q4_k: return {{0, 2}, 2, 15 * 63};
    case DType::q5_k: return {{0, 2}, 2, 31 * 63};
    case DType::q6_k: return {{208, 0}, 1, 32 * 128};
    default: break;
  }
  throw Error(std::string("random_blocks: ") + model::dtype_name(t) + " is not a block type");
}

/// splitmix64: fast, seedable, good enough for weights.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1) from 16 random bits.
  static float unit(std::uint64_t bits16) { return static_cast<float>(bits16 & 0xffff) / 32768.0f - 1.0f; }
};

struct Tensor {
  std::string name;
  std::int64_t rows, cols;  // rows == 1: a vector
  DType dtype;
  bool norm;                // filled with ones (plus a little noise)
  std::uint64_t offset = 0;
};

std::uint64_t tensor_bytes(const Tensor& t) { return model::dtype_bytes(t.dtype, t.rows * t.cols); }

class Writer {
 public:
  Writer(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) throw Error(path + ": cannot create: " + std::strerror(errno));
  }
  ~Writer() {
    if (f_) std::fclose(f_);
  }
  void bytes(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw Error(path_ + ": write failed: " + std::strerror(errno));
    pos_ += n;
  }
  template <class T>
  void pod(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    pod<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad() {
    static const char zeros[kAlign] = {};
    if (pos_ % kAlign) bytes(zeros, kAlign - pos_ % kAlign);
  }
  void close() {
    if (std::fclose(std::exchange(f_, nullptr)) != 0) throw Error(path_ + ": close failed: " + std::strerror(errno));
  }

 private:
  std::string path_;
  std::FILE* f_;
  std::uint64_t pos_ = 0;
};

/// The vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then "▁", letters,
/// and longer pieces in breadth-first order (so every piece's prefix is a
/// piece too: the SPM merges can reach it).
void vocabulary(int n, std::vector<std::string>& tokens, std::vector<float>& scores, std::vector<std::int32_t>& types) {
  tokens = {"<unk>", "<s>", "</s>"};
  types = {2, 3, 3};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.emplace_back(buf);
    types.push_back(6);
  }
  const std::string alpha = "etaoinshrdlucmfwypvbgkjqxz";
  const std::string space = "\xe2\x96\x81";  // U+2581
  std::vector<std::string> frontier = {""};
  std::vector<std::string> pieces = {space};
  for (char c : alpha) pieces.emplace_back(1, c);
  for (char c : std::string(" .,!?'0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")) pieces.emplace_back(1, c);
  for (char c : alpha) pieces.push_back(space + c);
  std::vector<std::string> level;
  for (char c : alpha) level.emplace_back(1, c);
  while (static_cast<int>(tokens.size() + pieces.size()) < n) {
    std::vector<std::string> next;
    for (const auto& p : level)
      for (char c : alpha) {
        next.push_back(p + c);
        pieces.push_back(p + c);
        pieces.push_back(space + p + c);
        if (static_cast<int>(tokens.size() + pieces.size()) >= n) break;
      }
    level = std::move(next);
  }
  for (const auto& p : pieces) {
    if (static_cast<int>(tokens.size()) >= n) break;
    tokens.push_back(p);
    types.push_back(1);
  }
  scores.assign(tokens.size(), 0.0f);
  for (std::size_t i = 259; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i - 259);
}

void write_tensor_data(Writer& w, const Tensor& t, std::uint64_t seed, float stddev) {
  Rng rng{seed};
  const std::int64_t n = t.rows * t.cols;
  // Uniform in [-a, a) has deviation a / sqrt(3).
  const float a = t.norm ? 0.1f : stddev * std::sqrt(3.0f);
  const float base = t.norm ? 1.0f : 0.0f;
  constexpr std::int64_t kChunk = 1 << 16;  // elements, a multiple of 32
  std::vector<std::uint8_t> buf;
  for (std::int64_t done = 0; done < n; done += kChunk) {
    const std::int64_t m = std::min(kChunk, n - done);
    buf.resize(model::dtype_bytes(t.dtype, m));
    if (t.dtype != DType::q8_0 && model::dtype_block(t.dtype) > 1) {
      random_blocks(t.dtype, buf.data(), m / model::dtype_block(t.dtype), rng.next(), a);
    } else if (t.dtype == DType::q8_0) {
      // Random int8 quants, one f16 scale per block: a real Q8_0 layout.
      const std::uint16_t d = f32_to_f16(a / 127.0f);
      for (std::int64_t b = 0; b < m / 32; ++b) {
        std::uint8_t* blk = buf.data() + b * 34;
        std::memcpy(blk, &d, 2);
        for (int j = 0; j < 32; j += 8) {
          std::uint64_t r = rng.next();
          for (int k = 0; k < 8; ++k) {
            int q = static_cast<int>((r >> (8 * k)) & 0xff) - 128;
            blk[2 + j + k] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q < -127 ? -127 : q));
          }
        }
      }
    } else {
      for (std::int64_t i = 0; i < m; i += 4) {
        std::uint64_t r = rng.next();
        for (int k = 0; k < 4 && i + k < m; ++k) {
          float v = base + a * Rng::unit(r >> (16 * k));
          std::uint8_t* p = buf.data() + model::dtype_bytes(t.dtype == DType::f32 ? DType::f32 : DType::f16, i + k);
          if (t.dtype == DType::f32) {
            std::memcpy(p, &v, 4);
          } else {
            std::uint16_t h = t.dtype == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
            std::memcpy(p, &h, 2);
          }
        }
      }
    }
    w.bytes(buf.data(), buf.size());
  }
}

std::vector<Tensor> tensors_of(const SyntheticShape& s) {
  const std::int64_t hd = s.n_embd / s.n_head, qd = hd * s.n_head, kd = hd * s.n_head_kv;
  std::vector<Tensor> ts;
  auto mat = [&](std::string name, std::int64_t r, std::int64_t c, bool more_bits = false) {
    ts.push_back({std::move(name), r, c, s.q4_k_m && more_bits ? DType::q6_k : s.dtype, false});
  };
  // llama.cpp's use_more_bits(i, n) for Q4_K_M's attn_v and ffn_down.
  const int n = s.n_layer;
  auto more_bits = [n](int l) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; };
  auto vec = [&](std::string name, std::int64_t c) { ts.push_back({std::move(name), 1, c, DType::f32, true}); };
  mat("token_embd.weight", s.n_vocab, s.n_embd);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    vec(b + "attn_norm.weight", s.n_embd);
    mat(b + "attn_q.weight", qd, s.n_embd);
    mat(b + "attn_k.weight", kd, s.n_embd);
    mat(b + "attn_v.weight", kd, s.n_embd, more_bits(l));
    mat(b + "attn_output.weight", s.n_embd, qd);
    vec(b + "ffn_norm.weight", s.n_embd);
    mat(b + "ffn_gate.weight", s.n_ff, s.n_embd);
    mat(b + "ffn_down.weight", s.n_embd, s.n_ff, more_bits(l));
    mat(b + "ffn_up.weight", s.n_ff, s.n_embd);
  }
  vec("output_norm.weight", s.n_embd);
  if (!s.tied_output) mat("output.weight", s.n_vocab, s.n_embd, true);
  return ts;
}

void check(const SyntheticShape& s) {
  auto fail = [](const std::string& why) { throw Error("write_synthetic_gguf: " + why); };
  if (s.n_layer < 1 || s.n_embd < 1 || s.n_ff < 1 || s.n_head < 1 || s.n_head_kv < 1 || s.n_ctx < 1)
    fail("every dimension must be positive");
  if (s.n_embd % s.n_head != 0) fail("n_head does not divide n_embd");
  if (s.n_head % s.n_head_kv != 0) fail("n_head_kv does not divide n_head");
  if ((s.n_embd / s.n_head) % 2 != 0) fail("the head dimension must be even (RoPE pairs)");
  if (s.n_vocab < 260) fail("n_vocab must be at least 260 (3 specials, 256 bytes, one piece)");
  const int blk = model::dtype_block(s.dtype);
  if (blk > 1 && (s.n_embd % blk != 0 || s.n_ff % blk != 0))
    fail(std::string(model::dtype_name(s.dtype)) + " needs n_embd and n_ff to be multiples of " + std::to_string(blk));
  if (s.q4_k_m && s.dtype != DType::q4_k) fail("q4_k_m is a recipe of Q4_K");
}

}  // namespace

std::uint16_t f32_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::int32_t exp = static_cast<std::int32_t>((x >> 23) & 0xff) - 127 + 15;
  std::uint32_t man = x & 0x7fffffu;
  if (exp <= 0) {  // subnormal or zero (our values never overflow)
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    int shift = 14 - exp;
    std::uint32_t h = man >> shift;
    if ((man >> (shift - 1)) & 1u) ++h;  // round half up
    return static_cast<std::uint16_t>(sign | h);
  }
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (man >> 13);
  std::uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // round to nearest even
  return static_cast<std::uint16_t>(h);
}

std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}


void random_blocks(DType t, std::uint8_t* out, std::int64_t blocks, std::uint64_t seed, float scale) {
  const HalfFields f = half_fields(t);
  const int bytes = static_cast<int>(model::dtype_bytes(t, model::dtype_block(t)));
  Rng rng{seed};
  const std::uint16_t d = f32_to_f16(scale / f.q_max), m = f32_to_f16(scale / 10 / f.q_max);
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::uint8_t* p = out + b * bytes;
    for (int i = 0; i < bytes; i += 8) {
      const std::uint64_t r = rng.next();
      std::memcpy(p + i, &r, static_cast<std::size_t>(std::min(8, bytes - i)));
    }
    std::memcpy(p + f.at[0], &d, 2);
    if (f.n == 2) std::memcpy(p + f.at[1], &m, 2);
  }
}

std::uint64_t synthetic_weight_bytes(const SyntheticShape& shape) {
  std::uint64_t b = 0;
  for (const auto& t : tensors_of(shape)) b += tensor_bytes(t);
  return b;
}

void write_synthetic_gguf(const std::string& path, const SyntheticShape& s) {
  check(s);
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  vocabulary(s.n_vocab, tokens, scores, types);
  if (static_cast<int>(tokens.size()) != s.n_vocab) throw Error("write_synthetic_gguf: vocabulary too large to fill");

  std::vector<Tensor> ts = tensors_of(s);
  std::uint64_t off = 0;
  for (auto& t : ts) {
    t.offset = off;
    off += (tensor_bytes(t) + kAlign - 1) / kAlign * kAlign;
  }

  Writer w(path);
  std::uint64_t n_kv = 0;
  // Metadata first into a list of writers, counted, then the header.
  std::vector<std::function<void()>> kvs;
  auto kv_str = [&](std::string k, std::string v) { kvs.push_back([&w, k, v] { w.str(k); w.pod(kString); w.str(v); }); };
  auto kv_u32 = [&](std::string k, std::uint32_t v) { kvs.push_back([&w, k, v] { w.str(k); w.pod(kU32); w.pod(v); }); };
  auto kv_f32 = [&](std::string k, float v) { kvs.push_back([&w, k, v] { w.str(k); w.pod(kF32); w.pod(v); }); };
  auto kv_bool = [&](std::string k, bool v) { kvs.push_back([&w, k, v] { w.str(k); w.pod(kBool); w.pod<std::uint8_t>(v); }); };
  kv_str("general.architecture", "llama");
  kv_str("general.name", "synthetic");
  kv_u32("general.alignment", kAlign);
  // llama_ftype numbers: F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K_M 12,
  // Q4_K_S 14, Q4_K_M 15, Q5_K_M 17, Q6_K 18, BF16 32.
  auto file_type = [&]() -> std::uint32_t {
    switch (s.dtype) {
      case DType::f32: return 0;
      case DType::f16: return 1;
      case DType::q4_0: return 2;
      case DType::q4_1: return 3;
      case DType::q8_0: return 7;
      case DType::q5_0: return 8;
      case DType::q5_1: return 9;
      case DType::q2_k: return 10;
      case DType::q3_k: return 12;
      case DType::q4_k: return s.q4_k_m ? 15 : 14;
      case DType::q5_k: return 17;
      case DType::q6_k: return 18;
      case DType::bf16: return 32;
    }
    return 0;
  };
  kv_u32("general.file_type", file_type());
  kv_u32("llama.context_length", static_cast<std::uint32_t>(s.n_ctx));
  kv_u32("llama.embedding_length", static_cast<std::uint32_t>(s.n_embd));
  kv_u32("llama.feed_forward_length", static_cast<std::uint32_t>(s.n_ff));
  kv_u32("llama.block_count", static_cast<std::uint32_t>(s.n_layer));
  kv_u32("llama.attention.head_count", static_cast<std::uint32_t>(s.n_head));
  kv_u32("llama.attention.head_count_kv", static_cast<std::uint32_t>(s.n_head_kv));
  kv_u32("llama.rope.dimension_count", static_cast<std::uint32_t>(s.n_embd / s.n_head));
  kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  kv_f32("llama.rope.freq_base", 10000.0f);
  kv_u32("llama.vocab_size", static_cast<std::uint32_t>(s.n_vocab));
  kv_str("tokenizer.ggml.model", "llama");
  kvs.push_back([&] {
    w.str("tokenizer.ggml.tokens");
    w.pod(kArray);
    w.pod(kString);
    w.pod<std::uint64_t>(tokens.size());
    for (const auto& t : tokens) w.str(t);
  });
  kvs.push_back([&] {
    w.str("tokenizer.ggml.scores");
    w.pod(kArray);
    w.pod(kF32);
    w.pod<std::uint64_t>(scores.size());
    w.bytes(scores.data(), scores.size() * 4);
  });
  kvs.push_back([&] {
    w.str("tokenizer.ggml.token_type");
    w.pod(kArray);
    w.pod(kI32);
    w.pod<std::uint64_t>(types.size());
    w.bytes(types.data(), types.size() * 4);
  });
  kv_u32("tokenizer.ggml.unknown_token_id", 0);
  kv_u32("tokenizer.ggml.bos_token_id", 1);
  kv_u32("tokenizer.ggml.eos_token_id", 2);
  kv_bool("tokenizer.ggml.add_bos_token", true);
  kv_bool("tokenizer.ggml.add_eos_token", false);
  n_kv = kvs.size();

  w.pod<std::uint32_t>(0x46554747u);  // "GGUF"
  w.pod<std::uint32_t>(3);
  w.pod<std::uint64_t>(ts.size());
  w.pod<std::uint64_t>(n_kv);
  for (auto& f : kvs) f();
  for (const auto& t : ts) {
    w.str(t.name);
    if (t.rows == 1) {
      w.pod<std::uint32_t>(1);
      w.pod<std::uint64_t>(static_cast<std::uint64_t>(t.cols));
    } else {
      w.pod<std::uint32_t>(2);
      w.pod<std::uint64_t>(static_cast<std::uint64_t>(t.cols));
      w.pod<std::uint64_t>(static_cast<std::uint64_t>(t.rows));
    }
    w.pod<std::uint32_t>(ggml_type(t.dtype));
    w.pod<std::uint64_t>(t.offset);
  }
  w.pad();
  for (std::size_t i = 0; i < ts.size(); ++i) {
    // Each tensor its own stream: a tensor's values do not depend on the others.
    write_tensor_data(w, ts[i], s.seed * 0x100000001b3ull + i, s.stddev);
    w.pad();
  }
  w.close();
}

}  // namespace ftp::testing
