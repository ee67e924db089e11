// SPDX-License-Identifier: Apache-2.0
#include "model/llama2c.hpp"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "model/gguf.hpp"

namespace ftp::model {

namespace {

/// llama2.c's version 1/2 exports start with this magic ("ak42").
constexpr std::uint32_t kLlama2cMagic = 0x616b3432u;

std::int32_t read_i32(const std::uint8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::size_t llama2c_expected_bytes(const Llama2cConfig& c, const std::string& name) {
  auto bad = [&](const std::string& why) -> void {
    throw InputError(name + ": not a GGUF file nor a llama2.c checkpoint: header " + why);
  };
  const std::int64_t lim = 1 << 20;
  if (c.dim <= 0 || c.dim > lim) bad("dim = " + std::to_string(c.dim));
  if (c.hidden_dim <= 0 || c.hidden_dim > 4 * lim) bad("hidden_dim = " + std::to_string(c.hidden_dim));
  if (c.n_layers <= 0 || c.n_layers > 4096) bad("n_layers = " + std::to_string(c.n_layers));
  if (c.n_heads <= 0 || c.dim % c.n_heads != 0)
    bad("n_heads = " + std::to_string(c.n_heads) + " does not divide dim = " + std::to_string(c.dim));
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0)
    bad("n_kv_heads = " + std::to_string(c.n_kv_heads) + " does not divide n_heads = " + std::to_string(c.n_heads));
  if (c.vocab_size == 0 || c.vocab_size < -(4 * lim) || c.vocab_size > 4 * lim)
    bad("vocab_size = " + std::to_string(c.vocab_size));
  if (c.seq_len <= 0 || c.seq_len > 16 * lim) bad("seq_len = " + std::to_string(c.seq_len));
  const std::uint64_t dim = c.dim, hid = c.hidden_dim, L = c.n_layers;
  const std::uint64_t vocab = c.vocab_size < 0 ? -static_cast<std::int64_t>(c.vocab_size) : c.vocab_size;
  const std::uint64_t head = dim / c.n_heads, kv_dim = head * c.n_kv_heads;
  // All factors are bounded above, so these sums fit in 64 bits.
  std::uint64_t floats = vocab * dim;
  floats += L * (dim + dim * dim + 2 * dim * kv_dim + dim * dim + dim + 3 * dim * hid);
  floats += dim;
  floats += static_cast<std::uint64_t>(c.seq_len) * head;  // freq_cis_real + imag
  if (c.vocab_size < 0) floats += vocab * dim;
  return 28 + floats * 4;
}

Model parse_llama2c(const void* data, std::size_t size, const std::string& name) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  if (size < 28)
    throw InputError(name + ": truncated file: " + std::to_string(size) +
                     " bytes, shorter than a GGUF or llama2.c header");
  std::uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic == kLlama2cMagic)
    throw InputError(name + ": llama2.c checkpoint of export version 1/2 (magic 'ak42') is not "
                     "supported: export it with --version 0 (legacy float32)");
  Llama2cConfig c;
  c.dim = read_i32(p);
  c.hidden_dim = read_i32(p + 4);
  c.n_layers = read_i32(p + 8);
  c.n_heads = read_i32(p + 12);
  c.n_kv_heads = read_i32(p + 16);
  c.vocab_size = read_i32(p + 20);
  c.seq_len = read_i32(p + 24);
  std::size_t want = llama2c_expected_bytes(c, name);
  if (size < want)
    throw InputError(name + ": truncated file: a llama2.c checkpoint with this header has " +
                     std::to_string(want) + " bytes, the file has " + std::to_string(size));
  if (size > want)
    throw InputError(name + ": not a llama2.c checkpoint: a checkpoint with this header has " +
                     std::to_string(want) + " bytes, the file has " + std::to_string(size) +
                     " (trailing data)");

  Model m;
  m.path = name;
  m.format = "llama2c";
  HParams& h = m.hparams;
  h.arch = "llama";
  h.n_vocab = c.vocab_size < 0 ? -c.vocab_size : c.vocab_size;
  h.n_ctx_train = c.seq_len;
  h.n_embd = c.dim;
  h.n_ff = c.hidden_dim;
  h.n_layer = c.n_layers;
  h.n_head = c.n_heads;
  h.n_head_kv = c.n_kv_heads;
  h.head_dim = c.dim / c.n_heads;
  h.n_rot = h.head_dim;
  h.rms_eps = 1e-5f;
  h.rope_theta = 10000.0f;
  h.tied_output = c.vocab_size > 0;

  const float* f = reinterpret_cast<const float*>(p + 28);  // offset 28 keeps 4-byte alignment
  std::size_t at = 0;
  auto take = [&](const std::string& tname, std::int64_t rows, std::int64_t cols) {
    TensorView t;
    t.name = tname;
    t.dtype = DType::f32;
    t.rows = rows;
    t.cols = cols;
    t.data = f + at;
    t.bytes = static_cast<std::size_t>(rows * cols) * 4;
    at += static_cast<std::size_t>(rows * cols);
    return t;
  };
  // llama2.c stores each kind of weight for all layers together.
  const int L = h.n_layer, D = h.n_embd, F = h.n_ff, V = h.n_vocab;
  const int QD = h.n_head * h.head_dim, KD = h.n_head_kv * h.head_dim;
  Weights& w = m.weights;
  w.layers.resize(L);
  auto lname = [](const char* what, int l) { return std::string(what) + "[" + std::to_string(l) + "]"; };
  w.tok_embd = take("token_embedding_table", V, D);
  for (int l = 0; l < L; ++l) w.layers[l].attn_norm = take(lname("rms_att_weight", l), 1, D);
  for (int l = 0; l < L; ++l) w.layers[l].wq = take(lname("wq", l), QD, D);
  for (int l = 0; l < L; ++l) w.layers[l].wk = take(lname("wk", l), KD, D);
  for (int l = 0; l < L; ++l) w.layers[l].wv = take(lname("wv", l), KD, D);
  for (int l = 0; l < L; ++l) w.layers[l].wo = take(lname("wo", l), D, QD);
  for (int l = 0; l < L; ++l) w.layers[l].ffn_norm = take(lname("rms_ffn_weight", l), 1, D);
  for (int l = 0; l < L; ++l) w.layers[l].w_gate = take(lname("w1", l), F, D);
  for (int l = 0; l < L; ++l) w.layers[l].w_down = take(lname("w2", l), D, F);
  for (int l = 0; l < L; ++l) w.layers[l].w_up = take(lname("w3", l), F, D);
  w.output_norm = take("rms_final_weight", 1, D);
  at += static_cast<std::size_t>(c.seq_len) * h.head_dim;  // freq_cis_real, freq_cis_imag: unused
  w.output = h.tied_output ? w.tok_embd : take("wcls", V, D);
  return m;
}

TokenizerData parse_llama2c_tokenizer(const void* data, std::size_t size, int n_vocab,
                                      const std::string& name) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  auto fail = [&](const std::string& why) -> void { throw InputError(name + ": " + why); };
  if (size < 4) fail("truncated file: no max_token_length header");
  TokenizerData t;
  t.model = "llama2c";
  t.pre = "default";
  t.bos = 1;
  t.eos = 2;
  t.unk = 0;
  t.add_bos = true;
  t.add_eos = false;
  t.add_space_prefix = true;
  t.max_token_length = read_i32(p);
  if (t.max_token_length <= 0 || t.max_token_length > (1 << 16))
    fail("not a llama2.c tokenizer: max_token_length = " + std::to_string(t.max_token_length));
  std::size_t at = 4;
  if (n_vocab > 0) {
    // Each token takes at least 8 bytes; reserve no more than can be present.
    if (static_cast<std::size_t>(n_vocab) > (size - at) / 8)
      fail("truncated file: " + std::to_string(n_vocab) + " tokens cannot fit in " + std::to_string(size) +
           " bytes");
    t.tokens.reserve(n_vocab);
    t.scores.reserve(n_vocab);
  }
  for (int i = 0; n_vocab < 0 ? at < size : i < n_vocab; ++i) {
    if (size - at < 8) fail("truncated file: token " + std::to_string(i) + " at offset " + std::to_string(at));
    float score;
    std::memcpy(&score, p + at, 4);
    std::int32_t len = read_i32(p + at + 4);
    at += 8;
    if (len < 0 || len > t.max_token_length)
      fail("token " + std::to_string(i) + ": length " + std::to_string(len) + " outside 0.." +
           std::to_string(t.max_token_length) + " (max_token_length)");
    if (static_cast<std::size_t>(len) > size - at)
      fail("truncated file: token " + std::to_string(i) + " needs " + std::to_string(len) + " bytes at offset " +
           std::to_string(at));
    t.tokens.emplace_back(reinterpret_cast<const char*>(p + at), static_cast<std::size_t>(len));
    t.scores.push_back(score);
    at += static_cast<std::size_t>(len);
  }
  if (n_vocab < 0 && t.tokens.size() < 3) fail("a llama2.c tokenizer needs at least 3 tokens (unk, bos, eos)");
  return t;
}

namespace {

TokenizerData read_llama2c_tokenizer(const std::string& path, int n_vocab) {
  std::size_t size = 0;
  auto map = map_file(path, size);
  return parse_llama2c_tokenizer(map.get(), size, n_vocab, path);
}

}  // namespace

TokenizerData load_llama2c_tokenizer(const std::string& path, int n_vocab) {
  TokenizerData d = read_llama2c_tokenizer(path, n_vocab);
  (void)build_tokenizer(d, path);  // refused here, with the file named
  return d;
}

Model load_llama2c(const std::string& path, const std::string& tokenizer_path) {
  std::size_t size = 0;
  auto map = map_file(path, size);
  Model m = parse_llama2c(map.get(), size, path);
  m.mapping = map;
  m.weights_file_mapped = true;
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    auto dir = std::filesystem::path(path).parent_path();
    auto a = (dir / "tokenizer.bin").string();
    auto b = (dir / ("tok" + std::to_string(m.hparams.n_vocab) + ".bin")).string();
    if (is_file(a)) tok = a;
    else if (is_file(b)) tok = b;
    else
      throw InputError(path + ": llama2.c checkpoint without a tokenizer: neither " + a + " nor " + b +
                       " exists (give the tokenizer's path)");
  }
  m.tokenizer = read_llama2c_tokenizer(tok, m.hparams.n_vocab);
  m.built_tokenizer = build_tokenizer(m.tokenizer, tok);
  return m;
}

}  // namespace ftp::model
