// SPDX-License-Identifier: Apache-2.0
#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <optional>
#include <unordered_set>

#include "core/error.hpp"
#include "core/escape.hpp"
#include "model/arch.hpp"
#include "model/gguf.hpp"
#include "model/hf_folder.hpp"
#include "model/llama2c.hpp"
#include "model/quant.hpp"
#include "model/tokenizer.hpp"

namespace ftp::model {

namespace {

float bf16_to_f32(std::uint16_t b) {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t load16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::q8_0: return "Q8_0";
    case DType::q4_0: return "Q4_0";
    case DType::q4_1: return "Q4_1";
    case DType::q5_0: return "Q5_0";
    case DType::q5_1: return "Q5_1";
    case DType::q2_k: return "Q2_K";
    case DType::q3_k: return "Q3_K";
    case DType::q4_k: return "Q4_K";
    case DType::q5_k: return "Q5_K";
    case DType::q6_k: return "Q6_K";
  }
  return "?";
}

int dtype_block(DType t) noexcept { return quant::block_shape(t).elems; }

std::size_t dtype_bytes(DType t, std::int64_t n) {
  if (n < 0) throw Error("dtype_bytes: negative element count " + std::to_string(n));
  const quant::BlockShape b = quant::block_shape(t);
  if (n % b.elems != 0)
    throw Error(std::string("dtype_bytes: ") + dtype_name(t) + " needs a multiple of " + std::to_string(b.elems) +
                " elements, got " + std::to_string(n));
  return static_cast<std::size_t>(n / b.elems) * static_cast<std::size_t>(b.bytes);
}

void to_f32(const TensorView& t, std::int64_t first, std::int64_t count, float* out) {
  if (first < 0 || count < 0 || first > t.elements() || count > t.elements() - first)
    throw Error("to_f32: " + t.name + ": elements [" + std::to_string(first) + ", +" + std::to_string(count) +
                ") outside the tensor's " + std::to_string(t.elements()));
  const auto* p = static_cast<const std::uint8_t*>(t.data);
  switch (t.dtype) {
    case DType::f32:
      std::memcpy(out, p + first * 4, static_cast<std::size_t>(count) * 4);
      return;
    case DType::f16:
      for (std::int64_t i = 0; i < count; ++i) out[i] = quant::f16_to_f32(load16(p + (first + i) * 2));
      return;
    case DType::bf16:
      for (std::int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(load16(p + (first + i) * 2));
      return;
    default: break;
  }
  const quant::BlockShape b = quant::block_shape(t.dtype);
  if (first % b.elems != 0)
    throw Error("to_f32: " + t.name + ": " + dtype_name(t.dtype) + " start " + std::to_string(first) +
                " is not a multiple of " + std::to_string(b.elems));
  const std::uint8_t* blk = p + first / b.elems * b.bytes;
  const std::int64_t whole = count / b.elems;
  quant::dequantize(t.dtype, blk, whole, out);
  if (const std::int64_t rest = count - whole * b.elems; rest > 0) {
    float tail[256];  // the largest block
    quant::dequantize(t.dtype, blk + whole * b.bytes, 1, tail);
    std::memcpy(out + whole * b.elems, tail, static_cast<std::size_t>(rest) * 4);
  }
}

Model::Model() = default;
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

// ---------------------------------------------------------------------------
// GGUF

TokenizerData tokenizer_from_gguf(const GgufFile& f) {
  TokenizerData t;
  t.model = f.get_string("tokenizer.ggml.model");
  t.pre = f.get_string_or("tokenizer.ggml.pre", "default");
  t.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (t.tokens.empty()) f.fail_key("tokenizer.ggml.tokens", "empty vocabulary");
  const auto n = t.tokens.size();
  auto check_len = [&](const char* key, std::size_t got) {
    if (got != n)
      f.fail_key(key, std::to_string(got) + " entries, expected one per token (" + std::to_string(n) + ")");
  };
  if (f.has("tokenizer.ggml.scores")) {
    t.scores = f.get_float_array("tokenizer.ggml.scores");
    check_len("tokenizer.ggml.scores", t.scores.size());
  }
  if (f.has("tokenizer.ggml.token_type")) {
    auto types = f.get_int_array("tokenizer.ggml.token_type");
    check_len("tokenizer.ggml.token_type", types.size());
    t.types.reserve(n);
    for (auto v : types) t.types.push_back(static_cast<std::int32_t>(v));
  }
  if (f.has("tokenizer.ggml.merges")) t.merges = f.get_string_array("tokenizer.ggml.merges");
  // Defaults as llama.cpp's per tokenizer model, then the file's keys.
  if (t.model == "llama") {
    t.add_bos = true;
    t.add_space_prefix = true;
  } else if (t.model == "bert") {
    t.add_bos = true;
    t.add_space_prefix = false;
  } else {
    t.add_bos = false;
    t.add_space_prefix = false;
  }
  auto id = [&](const char* key) -> int {
    if (!f.has(key)) return -1;
    auto v = f.get_int(key);
    // Some converters write -1 (as int32) or 0xffffffff (as uint32) for "none".
    if (v == -1 || v == 0xffffffffLL) return -1;
    if (v < 0 || static_cast<std::uint64_t>(v) >= n)
      f.fail_key(key, "token id " + std::to_string(v) + " outside the vocabulary of " + std::to_string(n));
    return static_cast<int>(v);
  };
  t.bos = id("tokenizer.ggml.bos_token_id");
  t.eos = id("tokenizer.ggml.eos_token_id");
  t.unk = id("tokenizer.ggml.unknown_token_id");
  t.pad = id("tokenizer.ggml.padding_token_id");
  t.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", t.add_bos);
  t.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", t.add_eos);
  t.add_space_prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", t.add_space_prefix);
  t.chat_template = f.get_string_or("tokenizer.chat_template", "");
  for (const auto& s : t.tokens)
    t.max_token_length = std::max(t.max_token_length, static_cast<int>(std::min<std::size_t>(s.size(), 1 << 30)));
  return t;
}

namespace {

std::optional<DType> dtype_of(std::uint32_t ggml) {
  switch (ggml) {
    case ggml_type::f32: return DType::f32;
    case ggml_type::f16: return DType::f16;
    case ggml_type::bf16: return DType::bf16;
    case ggml_type::q8_0: return DType::q8_0;
    case ggml_type::q4_0: return DType::q4_0;
    case ggml_type::q4_1: return DType::q4_1;
    case ggml_type::q5_0: return DType::q5_0;
    case ggml_type::q5_1: return DType::q5_1;
    case ggml_type::q2_k: return DType::q2_k;
    case ggml_type::q3_k: return DType::q3_k;
    case ggml_type::q4_k: return DType::q4_k;
    case ggml_type::q5_k: return DType::q5_k;
    case ggml_type::q6_k: return DType::q6_k;
    default: return std::nullopt;
  }
}

/// Positive int hyper-parameter from the file, below a sanity limit.
int hp_int(const GgufFile& f, const std::string& key, std::optional<std::int64_t> dflt, std::int64_t lim = 1LL << 30) {
  std::int64_t v = dflt && !f.has(key) ? *dflt : f.get_int(key);
  if (v <= 0 || v > lim) f.fail_key(key, "must be in 1.." + std::to_string(lim) + ", got " + std::to_string(v));
  return static_cast<int>(v);
}

TensorView view(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols,
                const std::string& expect_why) {
  const GgufTensorInfo* ti = f.find_tensor(name);
  if (!ti) throw InputError(f.path() + ": tensor '" + name + "': missing");
  auto dt = dtype_of(ti->type);
  if (!dt)
    throw InputError(f.path() + ": tensor '" + name + "': unsupported tensor type " + ggml_type_name(ti->type) +
                     " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
  // [cols] for a vector, [cols, rows] for a matrix; trailing 1s are allowed.
  bool ok = ti->ne[0] == cols && ti->ne[1] == rows && ti->ne[2] == 1 && ti->ne[3] == 1;
  if (!ok) {
    std::string want = rows == 1 ? "[" + std::to_string(cols) + "]"
                                 : "[" + std::to_string(cols) + ", " + std::to_string(rows) + "]";
    throw InputError(f.path() + ": tensor '" + name + "': shape " + ti->shape() +
                     " does not match the metadata: expected " + want + " (" + expect_why + ")");
  }
  TensorView t;
  t.name = name;
  t.dtype = *dt;
  t.rows = rows;
  t.cols = cols;
  t.data = ti->data;
  t.bytes = ti->bytes;
  return t;
}

const ArchSpec& arch_spec(const GgufFile& f, const std::string& arch) {
  if (const ArchSpec* a = find_arch(arch)) return *a;
  f.fail_key("general.architecture", "unsupported architecture '" + printable(arch) + "' (supported: " + arch_names() + ")");
}

/// Refuses RoPE scaling other than Llama 3's rope_freqs (linear, YaRN):
/// applying none where the file asks for one would silently change outputs.
void refuse_rope_scaling(const GgufFile& f, const std::string& a) {
  if (f.has(a + "rope.scaling.type")) {
    const std::string t = f.get_string(a + "rope.scaling.type");
    if (t != "none") f.fail_key(a + "rope.scaling.type", "unsupported RoPE scaling '" + printable(t) + "'");
  }
  for (const std::string& key : {a + "rope.scaling.factor", a + "rope.scale_linear"})
    if (f.has(key)) {
      const double v = f.get_float(key);
      if (v != 0.0 && v != 1.0) f.fail_key(key, "unsupported RoPE scaling factor " + std::to_string(v));
    }
}

}  // namespace

Model model_from_gguf(const GgufFile& f) {
  Model m;
  m.path = f.path();
  m.format = "gguf";
  m.mapping = f.mapping();
  HParams& h = m.hparams;
  h.arch = f.get_string("general.architecture");
  const ArchSpec& spec = arch_spec(f, h.arch);
  h.rope_type = spec.rope;
  const std::string a = h.arch + ".";
  h.name = f.get_string_or("general.name", "");
  h.n_ctx_train = hp_int(f, a + "context_length", std::nullopt);
  h.n_embd = hp_int(f, a + "embedding_length", std::nullopt, 1 << 20);
  h.n_ff = hp_int(f, a + "feed_forward_length", std::nullopt, 1 << 22);
  h.n_layer = hp_int(f, a + "block_count", std::nullopt, 4096);
  h.n_head = hp_int(f, a + "attention.head_count", std::nullopt, 1 << 16);
  h.n_head_kv = hp_int(f, a + "attention.head_count_kv", h.n_head, 1 << 16);
  if (h.n_head % h.n_head_kv != 0)
    f.fail_key(a + "attention.head_count_kv", std::to_string(h.n_head_kv) + " does not divide head_count " +
                                                  std::to_string(h.n_head));
  if (f.has(a + "attention.key_length")) {
    h.head_dim = hp_int(f, a + "attention.key_length", std::nullopt, 1 << 16);
  } else {
    if (h.n_embd % h.n_head != 0)
      f.fail_key(a + "attention.head_count", std::to_string(h.n_head) + " does not divide embedding_length " +
                                                 std::to_string(h.n_embd));
    h.head_dim = h.n_embd / h.n_head;
  }
  if (f.has(a + "attention.value_length") && f.get_int(a + "attention.value_length") != h.head_dim)
    f.fail_key(a + "attention.value_length", "differs from the key length " + std::to_string(h.head_dim) +
                                                 ": unsupported");
  h.n_rot = hp_int(f, a + "rope.dimension_count", h.head_dim, 1 << 16);
  if (h.n_rot > h.head_dim || h.n_rot % 2 != 0)
    f.fail_key(a + "rope.dimension_count", "must be even and at most the head dimension " +
                                               std::to_string(h.head_dim) + ", got " + std::to_string(h.n_rot));
  double eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  if (!(eps > 0 && eps < 1)) f.fail_key(a + "attention.layer_norm_rms_epsilon", "must be in (0, 1)");
  h.rms_eps = static_cast<float>(eps);
  double theta = f.get_float_or(a + "rope.freq_base", 10000.0);
  if (!(theta > 0 && theta < 1e12)) f.fail_key(a + "rope.freq_base", "must be positive");
  h.rope_theta = static_cast<float>(theta);
  refuse_rope_scaling(f, a);

  m.tokenizer = tokenizer_from_gguf(f);
  m.built_tokenizer = build_tokenizer(m.tokenizer, f.path());

  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) throw InputError(f.path() + ": tensor 'token_embd.weight': missing");
  h.n_vocab = static_cast<int>(m.tokenizer.tokens.size());
  if (f.has(a + "vocab_size") && f.get_int(a + "vocab_size") != h.n_vocab)
    f.fail_key(a + "vocab_size", "differs from the " + std::to_string(h.n_vocab) + " tokens of tokenizer.ggml.tokens");

  const std::string e = "n_embd=" + std::to_string(h.n_embd);
  const std::string v = "n_vocab=" + std::to_string(h.n_vocab);
  const std::string ff = "n_ff=" + std::to_string(h.n_ff);
  const std::int64_t qd = static_cast<std::int64_t>(h.n_head) * h.head_dim;
  const std::int64_t kd = static_cast<std::int64_t>(h.n_head_kv) * h.head_dim;
  const std::string qs = "n_head*head_dim=" + std::to_string(qd);
  const std::string ks = "n_head_kv*head_dim=" + std::to_string(kd);
  const std::string hs = "head_dim=" + std::to_string(h.head_dim);
  Weights& w = m.weights;
  // Every tensor read, so that one the architecture does not use is refused.
  std::unordered_set<std::string> used;
  auto need = [&](const std::string& name, std::int64_t rows, std::int64_t cols, const std::string& why) {
    used.insert(name);
    return view(f, name, rows, cols, why);
  };
  // An ArchPart's tensor: missing is an error where the architecture
  // requires the part, an empty view where it allows it, and a tensor the
  // architecture does not use is left for the check below.
  auto part = [&](unsigned p, const std::string& name, std::int64_t rows, std::int64_t cols, const std::string& why) {
    if (!((spec.required | spec.optional) & p)) return TensorView{};
    if (!f.find_tensor(name)) {
      if (spec.required & p)
        throw InputError(f.path() + ": tensor '" + name + "': missing (architecture " + h.arch + " requires it)");
      return TensorView{};
    }
    return need(name, rows, cols, why);
  };
  w.tok_embd = need("token_embd.weight", h.n_vocab, h.n_embd, e + ", " + v);
  w.layers.resize(h.n_layer);
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[l];
    L.attn_norm = need(b + "attn_norm.weight", 1, h.n_embd, e);
    L.wq = need(b + "attn_q.weight", qd, h.n_embd, e + ", " + qs);
    L.wk = need(b + "attn_k.weight", kd, h.n_embd, e + ", " + ks);
    L.wv = need(b + "attn_v.weight", kd, h.n_embd, e + ", " + ks);
    L.wo = need(b + "attn_output.weight", h.n_embd, qd, qs + ", " + e);
    L.ffn_norm = need(b + "ffn_norm.weight", 1, h.n_embd, e);
    L.w_gate = need(b + "ffn_gate.weight", h.n_ff, h.n_embd, e + ", " + ff);
    L.w_down = need(b + "ffn_down.weight", h.n_embd, h.n_ff, ff + ", " + e);
    L.w_up = need(b + "ffn_up.weight", h.n_ff, h.n_embd, e + ", " + ff);
    L.bq = part(kQkvBias, b + "attn_q.bias", 1, qd, qs);
    L.bk = part(kQkvBias, b + "attn_k.bias", 1, kd, ks);
    L.bv = part(kQkvBias, b + "attn_v.bias", 1, kd, ks);
    L.q_norm = part(kQkNorm, b + "attn_q_norm.weight", 1, h.head_dim, hs);
    L.k_norm = part(kQkNorm, b + "attn_k_norm.weight", 1, h.head_dim, hs);
  }
  w.output_norm = need("output_norm.weight", 1, h.n_embd, e);
  h.tied_output = f.find_tensor("output.weight") == nullptr;
  w.output = h.tied_output ? w.tok_embd : need("output.weight", h.n_vocab, h.n_embd, e + ", " + v);
  w.rope_freqs = part(kRopeFreqs, "rope_freqs.weight", 1, h.n_rot / 2, "n_rot/2=" + std::to_string(h.n_rot / 2));
  for (const GgufTensorInfo& t : f.tensors())
    if (!used.count(t.name))
      throw InputError(f.path() + ": tensor '" + printable(t.name) + "': not used by architecture " + h.arch +
                       " (unsupported)");
  return m;
}

// ---------------------------------------------------------------------------
// Entry points

namespace {

bool has_gguf_magic(const std::shared_ptr<const void>& map, std::size_t size) {
  if (size < 4) return false;
  std::uint32_t magic;
  std::memcpy(&magic, map.get(), 4);
  return magic == kGgufMagic;
}

}  // namespace

std::shared_ptr<const Tokenizer> build_tokenizer(const TokenizerData& data, const std::string& source) {
  try {
    return std::make_shared<const Tokenizer>(Tokenizer::from(data));
  } catch (const InputError& e) {
    throw InputError(source + ": " + e.what());
  }
}

static Model load_model_unchecked(const std::string& path, const std::string& tokenizer_path);

Model load_model(const std::string& path, const std::string& tokenizer_path) {
  try {
    return load_model_unchecked(path, tokenizer_path);
  } catch (const std::bad_alloc&) {
    // A count or size in the file too large to hold: a corrupt file, named.
    throw InputError(path + ": out of memory while reading it (a corrupt count or size?)");
  }
}

static Model load_model_unchecked(const std::string& path, const std::string& tokenizer_path) {
  if (std::filesystem::is_directory(path)) {
    if (!tokenizer_path.empty())
      throw InputError(tokenizer_path + ": a separate tokenizer is for llama2.c checkpoints; " + path +
                       " is a Hugging Face folder with its own tokenizer.json");
    return load_hf_folder(path);
  }
  std::size_t size = 0;
  auto map = map_file(path, size);
  if (has_gguf_magic(map, size)) {
    if (!tokenizer_path.empty())
      throw InputError(tokenizer_path + ": a separate tokenizer is for llama2.c checkpoints; " + path +
                       " is a GGUF file with its own vocabulary");
    GgufFile f = GgufFile::open(path);
    Model m = model_from_gguf(f);
    m.weights_file_mapped = true;
    return m;
  }
  if (size >= 4) {
    // "GGUX", "GGML", "GGJT", ...: a GGUF-like file with a bad magic, or an
    // older ggml format; say so rather than try it as llama2.c.
    const char* c = static_cast<const char*>(map.get());
    bool gg = (c[0] == 'G' && c[1] == 'G') || std::memcmp(c, "lmgg", 4) == 0 || std::memcmp(c, "tjgg", 4) == 0;
    if (gg) {
      std::string got(c, 4);
      for (auto& ch : got)
        if (ch < 0x20 || ch > 0x7e) ch = '?';
      throw InputError(path + ": bad magic '" + got + "': not a GGUF file (expected 'GGUF')");
    }
  }
  map.reset();
  return load_llama2c(path, tokenizer_path);
}

TokenizerData load_tokenizer_data(const std::string& path) {
  std::size_t size = 0;
  auto map = map_file(path, size);
  if (has_gguf_magic(map, size)) return tokenizer_from_gguf(GgufFile::open(path));
  return parse_llama2c_tokenizer(map.get(), size, -1, path);
}

}  // namespace ftp::model
