// SPDX-License-Identifier: Apache-2.0
// Model loading: GGUF and llama2.c on the real stories260K files, the
// llama.cpp vocab-only GGUFs, dequantisation, and errors on damaged copies
// written to a temp folder.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/llama2c.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "test_data.hpp"

namespace fs = std::filesystem;
using namespace ftp::model;

namespace {

using ftp::test::data_dir;
std::string stories(const std::string& f) { return data_dir() + "/models/stories260K/" + f; }
std::string vocab(const std::string& f) { return data_dir() + "/models/llama.cpp-vocab/" + f; }

#define NEED_FILE(p)                                                                   \
  do {                                                                                 \
    if (!fs::exists(p)) GTEST_SKIP() << "test data absent: " << (p) << " (set FTP_TEST_DATA)"; \
  } while (0)

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "ftp-model-XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_str(std::string& s, const std::string& v) {
  put<std::uint64_t>(s, v.size());
  s += v;
}

/// Rewrites a GGUF with changes: metadata as raw encodings copied from the
/// original, tensors with their data; offsets laid out anew unless forced.
struct GgufBuilder {
  struct KV {
    std::string key;
    std::string enc;  // type u32 + value
  };
  struct T {
    std::string name;
    std::vector<std::int64_t> ne;
    std::uint32_t type = 0;
    std::string data;
    std::optional<std::uint64_t> offset;
  };
  std::uint32_t version = 3;
  std::size_t alignment = 32;
  std::vector<KV> kvs;
  std::vector<T> tensors;

  static GgufBuilder from(const GgufFile& f) {
    GgufBuilder b;
    b.version = f.version();
    b.alignment = f.alignment();
    for (const auto& kv : f.kvs()) {
      std::string enc;
      put<std::uint32_t>(enc, static_cast<std::uint32_t>(kv.type));
      enc.append(reinterpret_cast<const char*>(f.bytes()) + kv.raw_begin, kv.raw_end - kv.raw_begin);
      b.kvs.push_back({kv.key, enc});
    }
    for (const auto& t : f.tensors()) {
      T x;
      x.name = t.name;
      x.ne.assign(t.ne, t.ne + t.n_dims);
      x.type = t.type;
      x.data.assign(static_cast<const char*>(t.data), t.bytes);
      b.tensors.push_back(x);
    }
    return b;
  }
  KV* kv(const std::string& key) {
    for (auto& k : kvs)
      if (k.key == key) return &k;
    return nullptr;
  }
  void set_string(const std::string& key, const std::string& v) {
    std::string enc;
    put<std::uint32_t>(enc, 8);
    put_str(enc, v);
    if (KV* k = kv(key)) k->enc = enc;
    else kvs.push_back({key, enc});
  }
  void set_u32(const std::string& key, std::uint32_t v) {
    std::string enc;
    put<std::uint32_t>(enc, 4);
    put<std::uint32_t>(enc, v);
    if (KV* k = kv(key)) k->enc = enc;
    else kvs.push_back({key, enc});
  }
  T& tensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  void drop_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const T& t) { return t.name == name; });
  }
  std::string bytes() const {
    std::string s;
    put<std::uint32_t>(s, kGgufMagic);
    put<std::uint32_t>(s, version);
    put<std::uint64_t>(s, tensors.size());
    put<std::uint64_t>(s, kvs.size());
    for (const auto& k : kvs) {
      put_str(s, k.key);
      s += k.enc;
    }
    std::uint64_t off = 0;
    std::vector<std::uint64_t> offs;
    for (const auto& t : tensors) {
      put_str(s, t.name);
      put<std::uint32_t>(s, static_cast<std::uint32_t>(t.ne.size()));
      for (auto n : t.ne) put<std::uint64_t>(s, static_cast<std::uint64_t>(n));
      put<std::uint32_t>(s, t.type);
      put<std::uint64_t>(s, t.offset.value_or(off));
      offs.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    std::size_t base = s.size();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      s.resize(base + offs[i], '\0');
      s += tensors[i].data;
    }
    return s;
  }
};

std::uint16_t f32_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  std::uint32_t man = x & 0x7fffffu;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {  // subnormal or zero
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    int shift = 14 - exp;
    std::uint32_t h = man >> shift;
    std::uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(exp) << 10) | (man >> 13);
  std::uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}

std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<std::uint16_t>(x >> 16);
}

std::vector<float> all_f32(const TensorView& t) {
  std::vector<float> v(static_cast<std::size_t>(t.elements()));
  to_f32(t, 0, t.elements(), v.data());
  return v;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ftp::InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "NO ERROR";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg) << "\nwanted: " << (part)

void expect_stories_hparams(const HParams& h, int ctx) {
  EXPECT_EQ(h.arch, "llama");
  EXPECT_EQ(h.n_vocab, 512);
  EXPECT_EQ(h.n_embd, 64);
  EXPECT_EQ(h.n_ff, 172);
  EXPECT_EQ(h.n_layer, 5);
  EXPECT_EQ(h.n_head, 8);
  EXPECT_EQ(h.n_head_kv, 4);
  EXPECT_EQ(h.head_dim, 8);
  EXPECT_EQ(h.n_rot, 8);
  EXPECT_EQ(h.n_ctx_train, ctx);
  EXPECT_FLOAT_EQ(h.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(h.rope_theta, 10000.0f);
}

}  // namespace

// ---------------------------------------------------------------------------
// stories260K in both formats

TEST(Gguf, Stories260KParses) {
  NEED_FILE(stories("stories260K.gguf"));
  GgufFile f = GgufFile::open(stories("stories260K.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.kvs().size(), 19u);
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.data_offset(), 14176u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.embedding_length"), 64);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.type, ggml_type::f32) << t.name;
  // Typed accessors name the key and the file.
  std::string m = error_of([&] { f.get_int("general.architecture"); });
  EXPECT_HAS(m, "stories260K.gguf");
  EXPECT_HAS(m, "general.architecture");
  EXPECT_HAS(m, "expected an integer, got string");
  m = error_of([&] { f.get_string("no.such.key"); });
  EXPECT_HAS(m, "'no.such.key': missing required key");
  m = error_of([&] { f.get_float_array("tokenizer.ggml.tokens"); });
  EXPECT_HAS(m, "expected an array of numbers, got array of string");
}

TEST(Model, Stories260KGguf) {
  NEED_FILE(stories("stories260K.gguf"));
  Model m = load_model(stories("stories260K.gguf"));
  EXPECT_EQ(m.format, "gguf");
  expect_stories_hparams(m.hparams, 2048);  // the converter's default, not the model's 512
  EXPECT_FALSE(m.hparams.tied_output);       // an untied copy of token_embd
  ASSERT_EQ(m.weights.layers.size(), 5u);
  EXPECT_EQ(m.weights.layers[0].wk.rows, 32);
  EXPECT_EQ(m.weights.layers[0].wk.cols, 64);
  EXPECT_EQ(m.weights.layers[0].w_down.rows, 64);
  EXPECT_EQ(m.weights.layers[0].w_down.cols, 172);
  EXPECT_EQ(all_f32(m.weights.output), all_f32(m.weights.tok_embd));
  const TokenizerData& t = m.tokenizer;
  EXPECT_EQ(t.model, "llama");
  ASSERT_EQ(t.tokens.size(), 512u);
  EXPECT_EQ(t.scores.size(), 512u);
  ASSERT_EQ(t.types.size(), 512u);
  for (auto ty : t.types) EXPECT_TRUE(ty == 1 || ty == 2 || ty == 3 || ty == 6) << ty;
  EXPECT_EQ(t.bos, 1);
  EXPECT_EQ(t.eos, 2);
  EXPECT_EQ(t.unk, 0);
  EXPECT_EQ(t.tokens[0], "<unk>");
  EXPECT_EQ(t.tokens[1], "<s>");
  EXPECT_EQ(t.tokens[2], "</s>");
  EXPECT_EQ(t.tokens[3], "<0x00>");
  EXPECT_EQ(t.tokens[259], "\xe2\x96\x81t");  // "▁t"
  EXPECT_TRUE(t.add_bos);
  // The loader keeps the tokenizer it built to check the vocabulary, and
  // tokenizer_of hands out that one rather than building it again.
  ASSERT_NE(m.built_tokenizer, nullptr);
  EXPECT_EQ(ftp::model::tokenizer_of(m).get(), m.built_tokenizer.get());
  EXPECT_EQ(m.built_tokenizer->n_vocab(), 512);
  EXPECT_EQ(m.built_tokenizer->encode_prompt(""), std::vector<int>{1});  // BOS alone
}

TEST(Model, Stories260KLlama2c) {
  NEED_FILE(stories("stories260K.bin"));
  NEED_FILE(stories("tok512.bin"));
  Model m = load_model(stories("stories260K.bin"));  // finds tok512.bin beside it
  EXPECT_EQ(m.format, "llama2c");
  expect_stories_hparams(m.hparams, 512);
  EXPECT_TRUE(m.hparams.tied_output);
  EXPECT_EQ(m.weights.output.data, m.weights.tok_embd.data);
  const TokenizerData& t = m.tokenizer;
  EXPECT_EQ(t.model, "llama2c");
  ASSERT_EQ(t.tokens.size(), 512u);
  EXPECT_EQ(t.max_token_length, 7);
  EXPECT_EQ(t.tokens[0], "<unk>");
  EXPECT_EQ(t.tokens[1], "\n<s>\n");
  EXPECT_EQ(t.tokens[2], "\n</s>\n");
  EXPECT_EQ(t.tokens[3], "<0x00>");
  EXPECT_EQ(t.tokens[258], "<0xFF>");
  EXPECT_EQ(t.tokens[259], " t");
  EXPECT_EQ(t.tokens[260], "he");
  EXPECT_EQ(t.tokens[265], " the");
  EXPECT_EQ(t.bos, 1);
  EXPECT_EQ(t.eos, 2);
  EXPECT_TRUE(t.add_bos);
  ASSERT_NE(m.built_tokenizer, nullptr);
  EXPECT_EQ(m.built_tokenizer->kind(), ftp::model::Tokenizer::Kind::llama2c);
  // A model made in code (no loader) gets a tokenizer built on request.
  Model bare;
  bare.tokenizer = t;
  const auto built = ftp::model::tokenizer_of(bare);
  ASSERT_NE(built, nullptr);
  EXPECT_EQ(built->encode("Zoo", true), m.built_tokenizer->encode("Zoo", true));
  // The weights' last byte is the file's last byte: the views cover it exactly.
  const auto* end = static_cast<const char*>(m.weights.output_norm.data) + m.weights.output_norm.bytes;
  EXPECT_EQ(end + 2 * 512 * 8 / 2 * 4, static_cast<const char*>(m.weights.tok_embd.data) + 1056540 - 28);
  // An explicit tokenizer path and load_tokenizer_data give the same data.
  Model m2 = load_model(stories("stories260K.bin"), stories("tok512.bin"));
  EXPECT_EQ(m2.tokenizer.tokens, t.tokens);
  TokenizerData t3 = load_tokenizer_data(stories("tok512.bin"));
  EXPECT_EQ(t3.tokens, t.tokens);
  EXPECT_EQ(t3.scores, t.scores);
}

// Both files hold the same trained weights. llama.cpp's convert-llama2c-to-ggml
// copies wq/wk unchanged: GGUF "llama" expects Q/K rows in the interleaved
// RoPE order (pairs (2i, 2i+1) of each head rotate together, ggml's "normal"
// rope mode), which is llama2.c's and Meta's original order. Only HF
// checkpoints (rotate-half order) are permuted by convert_hf_to_gguf.py.
// So one RoPE (adjacent pairs) serves both formats; this test would fail if
// a permutation were present.
TEST(Model, GgufAndLlama2cWeightsAgree) {
  NEED_FILE(stories("stories260K.gguf"));
  NEED_FILE(stories("stories260K.bin"));
  Model g = load_model(stories("stories260K.gguf"));
  Model c = load_model(stories("stories260K.bin"), stories("tok512.bin"));
  auto same = [](const TensorView& a, const TensorView& b) {
    EXPECT_EQ(a.rows, b.rows) << a.name << " vs " << b.name;
    EXPECT_EQ(a.cols, b.cols) << a.name << " vs " << b.name;
    EXPECT_EQ(all_f32(a), all_f32(b)) << a.name << " vs " << b.name;
  };
  same(g.weights.tok_embd, c.weights.tok_embd);
  same(g.weights.output, c.weights.output);
  same(g.weights.output_norm, c.weights.output_norm);
  for (int l = 0; l < 5; ++l) {
    const auto &a = g.weights.layers[l], &b = c.weights.layers[l];
    same(a.attn_norm, b.attn_norm);
    same(a.wq, b.wq);
    same(a.wk, b.wk);
    same(a.wv, b.wv);
    same(a.wo, b.wo);
    same(a.ffn_norm, b.ffn_norm);
    same(a.w_gate, b.w_gate);
    same(a.w_down, b.w_down);
    same(a.w_up, b.w_up);
  }
  // Same vocabulary: scores identical; pieces equal once "▁" is a space and
  // the control tokens are named alike.
  EXPECT_EQ(g.tokenizer.scores, c.tokenizer.scores);
  for (std::size_t i = 3; i < 512; ++i) {
    const std::string& piece = g.tokenizer.tokens[i];
    std::string s;
    for (std::size_t k = 0; k < piece.size(); ++k) {
      if (piece.compare(k, 3, "\xe2\x96\x81") == 0) {
        s += ' ';
        k += 2;
      } else {
        s += piece[k];
      }
    }
    EXPECT_EQ(s, c.tokenizer.tokens[i]) << "token " << i;
  }
}

// ---------------------------------------------------------------------------
// Other tensor types and a tied output, through rewritten copies of the GGUF

TEST(Model, F16Bf16Q8_0AndTiedOutput) {
  NEED_FILE(stories("stories260K.gguf"));
  GgufFile src = GgufFile::open(stories("stories260K.gguf"));
  Model ref = model_from_gguf(src);
  GgufBuilder b = GgufBuilder::from(src);
  int i = 0;
  for (auto& t : b.tensors) {
    std::vector<float> x(t.data.size() / 4);
    std::memcpy(x.data(), t.data.data(), t.data.size());
    std::string d;
    int kind = i++ % 3;
    if (t.ne[0] % 32 != 0 || t.ne.size() == 1) kind = 1;  // Q8_0 rows need 32 | cols; norms as F16
    if (kind == 0) {  // Q8_0
      t.type = ggml_type::q8_0;
      for (std::size_t blk = 0; blk < x.size(); blk += 32) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk + j]));
        float dq = amax / 127;
        put<std::uint16_t>(d, f32_to_f16(dq));
        for (int j = 0; j < 32; ++j)
          put<std::int8_t>(d, static_cast<std::int8_t>(dq == 0 ? 0 : std::lround(x[blk + j] / dq)));
      }
    } else if (kind == 1) {
      t.type = ggml_type::f16;
      for (float v : x) put<std::uint16_t>(d, f32_to_f16(v));
    } else {
      t.type = ggml_type::bf16;
      for (float v : x) put<std::uint16_t>(d, f32_to_bf16(v));
    }
    t.data = d;
  }
  b.drop_tensor("output.weight");
  TempDir tmp;
  std::string p = tmp.write("mixed.gguf", b.bytes());
  Model m = load_model(p);
  EXPECT_TRUE(m.hparams.tied_output);
  EXPECT_EQ(m.weights.output.data, m.weights.tok_embd.data);
  auto close = [](const TensorView& a, const TensorView& r) {
    auto x = all_f32(a), y = all_f32(r);
    ASSERT_EQ(x.size(), y.size());
    float amax = 0;
    for (float v : y) amax = std::max(amax, std::fabs(v));
    // Q8_0: half a quantum of the block's max; F16/BF16: relative rounding.
    for (std::size_t k = 0; k < x.size(); ++k)
      ASSERT_NEAR(x[k], y[k], std::max(amax / 127.0f * 0.51f, std::fabs(y[k]) / 128.0f) + 1e-6f)
          << a.name << " (" << dtype_name(a.dtype) << ") element " << k;
  };
  std::set<DType> seen;
  close(m.weights.tok_embd, ref.weights.tok_embd);
  for (int l = 0; l < 5; ++l) {
    const auto &a = m.weights.layers[l], &r = ref.weights.layers[l];
    for (auto [x, y] : {std::pair{&a.attn_norm, &r.attn_norm}, {&a.wq, &r.wq}, {&a.wk, &r.wk}, {&a.wv, &r.wv},
                        {&a.wo, &r.wo}, {&a.ffn_norm, &r.ffn_norm}, {&a.w_gate, &r.w_gate},
                        {&a.w_down, &r.w_down}, {&a.w_up, &r.w_up}}) {
      close(*x, *y);
      seen.insert(x->dtype);
    }
  }
  EXPECT_EQ(seen.size(), 3u);  // F16, BF16, Q8_0 all exercised
}

TEST(ToF32, HandMadeBlocks) {
  // F16: 1, -2, 0.5, 65504 (max), smallest subnormal, -0
  std::uint16_t h[] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000};
  TensorView t{"h", DType::f16, 1, 6, h, sizeof h};
  float o[6];
  to_f32(t, 0, 6, o);
  EXPECT_EQ(o[0], 1.0f);
  EXPECT_EQ(o[1], -2.0f);
  EXPECT_EQ(o[2], 0.5f);
  EXPECT_EQ(o[3], 65504.0f);
  EXPECT_EQ(o[4], std::ldexp(1.0f, -24));
  EXPECT_TRUE(o[5] == 0.0f && std::signbit(o[5]));
  to_f32(t, 2, 2, o);
  EXPECT_EQ(o[0], 0.5f);
  EXPECT_EQ(o[1], 65504.0f);
  // BF16: the top 16 bits of a float32.
  std::uint16_t bf[] = {0x3f80, 0xc040, 0x3f00};  // 1, -3, 0.5
  TensorView tb{"b", DType::bf16, 1, 3, bf, sizeof bf};
  to_f32(tb, 0, 3, o);
  EXPECT_EQ(o[0], 1.0f);
  EXPECT_EQ(o[1], -3.0f);
  EXPECT_EQ(o[2], 0.5f);
  // Q8_0: two blocks; d = 0.5 then d = -2, q = j - 16.
  unsigned char q[68];
  std::uint16_t d0 = 0x3800, d1 = 0xc000;
  std::memcpy(q, &d0, 2);
  std::memcpy(q + 34, &d1, 2);
  for (int j = 0; j < 32; ++j) q[2 + j] = q[36 + j] = static_cast<unsigned char>(static_cast<std::int8_t>(j - 16));
  TensorView tq{"q", DType::q8_0, 1, 64, q, sizeof q};
  float out[64];
  to_f32(tq, 0, 64, out);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], 0.5f * (j - 16));
    EXPECT_EQ(out[32 + j], -2.0f * (j - 16));
  }
  to_f32(tq, 32, 5, out);
  EXPECT_EQ(out[0], 32.0f);
  EXPECT_EQ(dtype_bytes(DType::q8_0, 64), 68u);
  EXPECT_EQ(dtype_bytes(DType::bf16, 3), 6u);
  EXPECT_THROW(to_f32(tq, 16, 4, out), ftp::Error);  // not at a block start
  EXPECT_THROW(to_f32(tq, 60, 8, out), ftp::Error);  // past the end
}

// ---------------------------------------------------------------------------
// Vocab-only GGUFs

TEST(Tokenizer, VocabOnlyGgufs) {
  struct V {
    const char* file;
    const char* model;
    std::size_t n;
  };
  const V vs[] = {
      {"ggml-vocab-llama-spm.gguf", "llama", 32000},    {"ggml-vocab-phi-3.gguf", "llama", 32064},
      {"ggml-vocab-deepseek-llm.gguf", "gpt2", 102400}, {"ggml-vocab-deepseek-coder.gguf", "gpt2", 32256},
      {"ggml-vocab-gpt-2.gguf", "gpt2", 50257},         {"ggml-vocab-falcon.gguf", "gpt2", 65024},
      {"ggml-vocab-mpt.gguf", "gpt2", 50432},           {"ggml-vocab-starcoder.gguf", "gpt2", 49152},
      {"ggml-vocab-refact.gguf", "gpt2", 49216},        {"ggml-vocab-bert-bge.gguf", "bert", 30522},
      {"ggml-vocab-gpt-neox.gguf", "gpt2", 50432},      {"ggml-vocab-baichuan.gguf", "llama", 64000},
  };
  NEED_FILE(vocab(vs[0].file));
  for (const V& v : vs) {
    SCOPED_TRACE(v.file);
    TokenizerData t = load_tokenizer_data(vocab(v.file));
    EXPECT_EQ(t.model, v.model);
    EXPECT_EQ(t.tokens.size(), v.n);
    if (!t.scores.empty()) {
      EXPECT_EQ(t.scores.size(), v.n);
    }
    if (!t.types.empty()) {
      EXPECT_EQ(t.types.size(), v.n);
    }
    if (t.model == "gpt2") {
      EXPECT_GT(t.merges.size(), 1000u);
    }
    if (t.model == "llama") {
      EXPECT_EQ(t.scores.size(), v.n);
    }
  }
  TokenizerData spm = load_tokenizer_data(vocab("ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(spm.bos, 1);
  EXPECT_EQ(spm.eos, 2);
  EXPECT_EQ(spm.unk, 0);
  EXPECT_EQ(spm.tokens[1], "<s>");
  EXPECT_TRUE(spm.add_bos);
  EXPECT_TRUE(spm.add_space_prefix);
  TokenizerData ds = load_tokenizer_data(vocab("ggml-vocab-deepseek-llm.gguf"));
  EXPECT_EQ(ds.pre, "deepseek-llm");
  // A vocab-only file is no model: the error says what is missing.
  std::string m = error_of([&] { load_model(vocab("ggml-vocab-llama-spm.gguf")); });
  EXPECT_HAS(m, "ggml-vocab-llama-spm.gguf");
  m = error_of([&] { load_model(vocab("ggml-vocab-phi-3.gguf")); });
  EXPECT_HAS(m, "unsupported architecture 'phi3'");
}

// ---------------------------------------------------------------------------
// Errors, on damaged copies of the real files

class Damaged : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(stories("stories260K.gguf")) || !fs::exists(stories("stories260K.bin")))
      GTEST_SKIP() << "test data absent under " << data_dir() << " (set FTP_TEST_DATA)";
    gguf = read_bytes(stories("stories260K.gguf"));
    bin = read_bytes(stories("stories260K.bin"));
  }
  std::string load_error(const std::string& name, const std::string& bytes, const std::string& tok = "") {
    std::string p = tmp.write(name, bytes);
    return error_of([&] { load_model(p, tok); });
  }
  std::string gguf, bin;
  TempDir tmp;
};

TEST_F(Damaged, WrongMagic) {
  std::string b = gguf;
  std::memcpy(b.data(), "GGUX", 4);
  std::string m = load_error("magic.gguf", b);
  EXPECT_HAS(m, "magic.gguf");
  EXPECT_HAS(m, "bad magic 'GGUX'");
  // A random file that is neither format.
  m = load_error("text.bin", std::string(4096, 'x'));
  EXPECT_HAS(m, "text.bin");
  EXPECT_HAS(m, "not a GGUF file nor a llama2.c checkpoint");
}

TEST_F(Damaged, Version) {
  std::string b = gguf;
  b[4] = 1;
  std::string m = load_error("v1.gguf", b);
  EXPECT_HAS(m, "v1.gguf");
  EXPECT_HAS(m, "unsupported GGUF version 1");
  b[4] = 4;
  m = load_error("v4.gguf", b);
  EXPECT_HAS(m, "unsupported GGUF version 4");
  b[4] = 2;  // v2 has v3's layout for little-endian files
  std::string p = tmp.write("v2.gguf", b);
  EXPECT_EQ(load_model(p).hparams.n_layer, 5);
}

TEST_F(Damaged, TruncatedGguf) {
  for (std::size_t cut : {std::size_t{2}, std::size_t{6}, std::size_t{20}, std::size_t{100}, std::size_t{3000},
                          std::size_t{9000}, std::size_t{14000}, std::size_t{14176}, std::size_t{20000},
                          gguf.size() - 1}) {
    SCOPED_TRACE(cut);
    std::string m = load_error("cut.gguf", gguf.substr(0, cut));
    EXPECT_HAS(m, "cut.gguf");
    bool says = m.find("truncated file") != std::string::npos || m.find("out of bounds") != std::string::npos;
    EXPECT_TRUE(says) << m;
  }
  // Cut in the tensor data: the error names the tensor.
  std::string m = load_error("cut.gguf", gguf.substr(0, gguf.size() - 1));
  EXPECT_HAS(m, "tensor '");
  EXPECT_HAS(m, "tensor data out of bounds");
}

TEST_F(Damaged, TruncatedLlama2c) {
  for (std::size_t cut : {std::size_t{10}, std::size_t{28}, std::size_t{5000}, bin.size() - 4}) {
    SCOPED_TRACE(cut);
    std::string m = load_error("cut.bin", bin.substr(0, cut), stories("tok512.bin"));
    EXPECT_HAS(m, "cut.bin");
    EXPECT_HAS(m, "truncated file");
  }
  std::string tok = read_bytes(stories("tok512.bin"));
  std::string tp = tmp.write("tok.bin", tok.substr(0, tok.size() - 3));
  std::string m = load_error("ok.bin", bin, tp);
  EXPECT_HAS(m, "tok.bin");
  EXPECT_HAS(m, "truncated file: token 511");
  // Without a tokenizer beside it.
  m = load_error("alone.bin", bin);
  EXPECT_HAS(m, "alone.bin");
  EXPECT_HAS(m, "tok512.bin");
}

TEST_F(Damaged, TensorOffsetOutOfBounds) {
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.tensor("blk.3.ffn_up.weight").offset = std::uint64_t{1} << 40;
  std::string m = load_error("oob.gguf", b.bytes());
  EXPECT_HAS(m, "oob.gguf");
  EXPECT_HAS(m, "'blk.3.ffn_up.weight'");
  EXPECT_HAS(m, "tensor data out of bounds");
  b.tensor("blk.3.ffn_up.weight").offset = 33;  // not aligned
  m = load_error("oob.gguf", b.bytes());
  EXPECT_HAS(m, "'blk.3.ffn_up.weight'");
  EXPECT_HAS(m, "not a multiple of the alignment 32");
}

TEST_F(Damaged, UnsupportedTensorType) {
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  auto& t = b.tensor("blk.0.attn_q.weight");
  t.type = ggml_type::q8_1;  // a type ggml knows (and sizes) that the loader does not run
  t.data.resize(64 * 64 / 32 * 36);
  std::string m = load_error("q81.gguf", b.bytes());
  EXPECT_HAS(m, "q81.gguf");
  EXPECT_HAS(m, "'blk.0.attn_q.weight'");
  EXPECT_HAS(m, "unsupported tensor type Q8_1");
  t.type = 99;
  m = load_error("t99.gguf", b.bytes());
  EXPECT_HAS(m, "'blk.0.attn_q.weight'");
  EXPECT_HAS(m, "unsupported tensor type type 99");
}

TEST_F(Damaged, QuantizedRowNotAWholeNumberOfBlocks) {
  // stories260K's attn_q has rows of 64 (a quarter of a K-quant
  // super-block), its ffn_down rows of 172 (not a multiple of 32).
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  auto& q = b.tensor("blk.1.attn_q.weight");
  q.type = ggml_type::q4_k;
  q.data.resize(q.data.size() / 4);
  std::string m = load_error("rows.gguf", b.bytes());
  EXPECT_HAS(m, "rows.gguf");
  EXPECT_HAS(m, "'blk.1.attn_q.weight'");
  EXPECT_HAS(m, "Q4_K needs rows of a multiple of 256 elements, shape is [64, 64]");
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  // Blocks of 32 fit rows of 64: the same tensor as Q4_0 loads...
  q.type = ggml_type::q4_0;
  q.data.resize(64 * 64 / 32 * 18);
  std::string p = tmp.write("q40.gguf", b.bytes());
  EXPECT_EQ(load_model(p).weights.layers[1].wq.dtype, DType::q4_0);
  // ... but not rows of 172.
  auto& d = b.tensor("blk.1.ffn_down.weight");
  d.type = ggml_type::q5_1;
  d.data.resize(172 * 64 / 32 * 24);
  m = load_error("rows172.gguf", b.bytes());
  EXPECT_HAS(m, "rows172.gguf");
  EXPECT_HAS(m, "'blk.1.ffn_down.weight': Q5_1 needs rows of a multiple of 32 elements, shape is [172, 64]");
}

TEST_F(Damaged, UnsupportedArchitecture) {
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.set_string("general.architecture", "gptneox");
  std::string m = load_error("arch.gguf", b.bytes());
  EXPECT_HAS(m, "arch.gguf");
  EXPECT_HAS(m, "general.architecture");
  EXPECT_HAS(m, "unsupported architecture 'gptneox'");
  b.set_u32("general.architecture", 7);
  m = load_error("arch.gguf", b.bytes());
  EXPECT_HAS(m, "expected a string, got uint32");
  // Bytes from the file stay on one line: control bytes are written \xNN.
  b.set_string("general.architecture", "gpt\nINFO: ok\x1b[2J");
  m = load_error("arch.gguf", b.bytes());
  EXPECT_HAS(m, "unsupported architecture 'gpt\\x0aINFO: ok\\x1b[2J'");
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

// The loader's architecture table: a tensor the architecture requires that
// is missing, one it does not use, a RoPE scaling it does not apply: each
// refused with the file and the tensor or key named, on one line.
TEST_F(Damaged, ArchitectureTensors) {
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.set_string("general.architecture", "qwen3");
  for (const auto& kv : std::vector<GgufBuilder::KV>(b.kvs))
    if (kv.key.rfind("llama.", 0) == 0) b.kvs.push_back({"qwen3." + kv.key.substr(6), kv.enc});
  std::string m = load_error("q3.gguf", b.bytes());
  EXPECT_HAS(m, "q3.gguf: tensor 'blk.0.attn_q_norm.weight': missing (architecture qwen3 requires it)");

  b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  GgufBuilder::T extra = b.tensor("blk.0.attn_norm.weight");
  extra.name = "blk.0.attn_output.bias";
  b.tensors.push_back(extra);
  m = load_error("bo.gguf", b.bytes());
  EXPECT_HAS(m, "bo.gguf: tensor 'blk.0.attn_output.bias': not used by architecture llama (unsupported)");
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;

  b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.set_string("llama.rope.scaling.type", "yarn");
  m = load_error("yarn.gguf", b.bytes());
  EXPECT_HAS(m, "yarn.gguf: metadata 'llama.rope.scaling.type': unsupported RoPE scaling 'yarn'");
  b.set_string("llama.rope.scaling.type", "none");
  EXPECT_EQ(load_model(tmp.write("none.gguf", b.bytes())).hparams.rope_type, RopeType::norm);
}

std::string arch_ref(const std::string& f) { return data_dir() + "/models/arch-refs/" + f; }

TEST_F(Damaged, MissingQwen2Bias) {
  NEED_FILE(arch_ref("qwen2-f32.gguf"));
  const std::string q2 = read_bytes(arch_ref("qwen2-f32.gguf"));
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(q2.data(), q2.size(), "x"));
  b.drop_tensor("blk.1.attn_k.bias");
  std::string m = load_error("nobias.gguf", b.bytes());
  EXPECT_HAS(m, "nobias.gguf: tensor 'blk.1.attn_k.bias': missing (architecture qwen2 requires it)");
  // A bias of the wrong length names its expected shape.
  b = GgufBuilder::from(GgufFile::parse(q2.data(), q2.size(), "x"));
  b.tensor("blk.0.attn_q.bias").ne = {64};
  b.tensor("blk.0.attn_q.bias").data.resize(64 * 4);
  m = load_error("short.gguf", b.bytes());
  EXPECT_HAS(m, "short.gguf: tensor 'blk.0.attn_q.bias': shape [64] does not match the metadata: expected [256]");
}

TEST(Model, ArchitecturesOfArchRefs) {
  // What the table gives each architecture (arch-refs README): RoPE type,
  // the optional tensors, tied output.
  for (const char* f : {"llama-f32.gguf", "llama3-ropefreqs-f32.gguf", "qwen2-f32.gguf", "qwen3-f32.gguf"})
    NEED_FILE(arch_ref(f));
  Model l = load_model(arch_ref("llama-f32.gguf"));
  EXPECT_EQ(l.hparams.rope_type, RopeType::norm);
  EXPECT_FALSE(l.hparams.tied_output);
  EXPECT_TRUE(l.weights.rope_freqs.empty());
  EXPECT_TRUE(l.weights.layers[0].bq.empty());
  EXPECT_EQ(l.weights.layers[0].tensors().size(), 9u);

  Model l3 = load_model(arch_ref("llama3-ropefreqs-f32.gguf"));
  EXPECT_EQ(l3.hparams.rope_type, RopeType::norm);
  EXPECT_TRUE(l3.hparams.tied_output);
  EXPECT_FLOAT_EQ(l3.hparams.rope_theta, 500000.0f);
  ASSERT_EQ(l3.weights.rope_freqs.elements(), 16);
  std::vector<float> ff(16);
  to_f32(l3.weights.rope_freqs, 0, 16, ff.data());
  EXPECT_FLOAT_EQ(ff[0], 1.0f);
  EXPECT_NEAR(ff[8], 2.69453001f, 1e-6);
  EXPECT_FLOAT_EQ(ff[15], 8.0f);

  Model q2 = load_model(arch_ref("qwen2-f32.gguf"));
  EXPECT_EQ(q2.hparams.rope_type, RopeType::neox);
  EXPECT_FLOAT_EQ(q2.hparams.rms_eps, 1e-6f);
  EXPECT_FLOAT_EQ(q2.hparams.rope_theta, 1e6f);
  EXPECT_EQ(q2.hparams.n_rot, 32);
  EXPECT_EQ(q2.weights.layers[1].bq.elements(), 256);
  EXPECT_EQ(q2.weights.layers[1].bk.elements(), 64);
  EXPECT_EQ(q2.weights.layers[1].bv.elements(), 64);
  EXPECT_TRUE(q2.weights.layers[1].q_norm.empty());

  Model q3 = load_model(arch_ref("qwen3-f32.gguf"));
  EXPECT_EQ(q3.hparams.rope_type, RopeType::neox);
  EXPECT_EQ(q3.hparams.head_dim, 32);
  EXPECT_EQ(q3.weights.layers[0].q_norm.elements(), 32);
  EXPECT_EQ(q3.weights.layers[0].k_norm.elements(), 32);
  EXPECT_TRUE(q3.weights.layers[0].bq.empty());
  EXPECT_EQ(q3.weights.layers[0].tensors().size(), 11u);
}

// A vocabulary the tokenizer cannot use is refused at load, with the file
// named, as the model's other errors are (not later, by whoever builds the
// tokenizer, without a path).
TEST_F(Damaged, UnusableVocabularyNamesTheFile) {
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.set_string("tokenizer.ggml.model", "bert");
  std::string m = load_error("tok.gguf", b.bytes());
  EXPECT_HAS(m, "tok.gguf: tokenizer: unsupported tokenizer model 'bert'");
  // llama2.c: byte b is token b + 3 (run.c), so fewer than 259 tokens cannot
  // encode every byte; tok512.bin cut to its first 100 tokens.
  const std::string tokbin = read_bytes(stories("tok512.bin"));
  std::size_t off = 4;  // max_token_length, then (score, length, bytes) per token
  for (int i = 0; i < 100; ++i) {
    std::int32_t len = 0;
    std::memcpy(&len, tokbin.data() + off + 4, 4);
    off += 8 + static_cast<std::size_t>(len);
  }
  const std::string small = tmp.write("tok100.bin", tokbin.substr(0, off));
  m = error_of([&] { load_llama2c_tokenizer(small, 100); });
  EXPECT_HAS(m, "tok100.bin: tokenizer: a llama2.c vocabulary holds the 256 byte tokens at ids 3..258; this one has 100");
}

TEST_F(Damaged, ShapeMismatch) {
  GgufBuilder b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.set_u32("llama.feed_forward_length", 176);
  std::string m = load_error("shape.gguf", b.bytes());
  EXPECT_HAS(m, "shape.gguf");
  EXPECT_HAS(m, "'blk.0.ffn_gate.weight'");
  EXPECT_HAS(m, "shape [64, 172] does not match the metadata: expected [64, 176]");
  EXPECT_HAS(m, "n_ff=176");
  b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.set_u32("llama.attention.head_count_kv", 8);  // claims MHA, the file is GQA
  m = load_error("shape.gguf", b.bytes());
  EXPECT_HAS(m, "'blk.0.attn_k.weight'");
  EXPECT_HAS(m, "expected [64, 64]");
  b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.drop_tensor("blk.4.ffn_norm.weight");
  m = load_error("missing.gguf", b.bytes());
  EXPECT_HAS(m, "'blk.4.ffn_norm.weight': missing");
  b = GgufBuilder::from(GgufFile::parse(gguf.data(), gguf.size(), "x"));
  b.kvs.erase(b.kvs.begin() + 3);
  std::string removed = GgufFile::parse(gguf.data(), gguf.size(), "x").kvs()[3].key;
  m = load_error("nokey.gguf", b.bytes());
  EXPECT_HAS(m, removed);
}

TEST_F(Damaged, HostileCounts) {
  // Huge tensor and metadata counts, a string length past the end: clean errors.
  std::string b = gguf;
  std::uint64_t big = ~std::uint64_t{0} / 2;
  std::memcpy(b.data() + 8, &big, 8);
  EXPECT_HAS(load_error("count.gguf", b), "tensor count");
  b = gguf;
  std::memcpy(b.data() + 16, &big, 8);
  EXPECT_HAS(load_error("count.gguf", b), "metadata count");
  b = gguf;
  std::memcpy(b.data() + 24, &big, 8);  // length of the first key
  EXPECT_HAS(load_error("len.gguf", b), "truncated file: metadata key #0");
}
