// SPDX-License-Identifier: Apache-2.0
#include "model/hf_folder.hpp"

#include <filesystem>
#include <map>
#include <unordered_set>

#include "core/error.hpp"
#include "core/escape.hpp"
#include "core/json.hpp"
#include "model/hf_config.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"
#include "model/tokenizer_json.hpp"

namespace ftp::model {

namespace fs = std::filesystem;

namespace {

/// What the Model's mapping keeps alive: every shard and the owned tensors.
struct Holding {
  std::vector<SafetensorsFile> shards;
  std::vector<float> rope_freqs;
};

/// The shards of a folder and which holds each tensor.
struct Shards {
  std::vector<SafetensorsFile> files;
  std::unordered_map<std::string, std::pair<std::size_t, const StTensor*>> where;  ///< name -> (file, tensor)
};

Shards open_shards(const fs::path& dir) {
  Shards s;
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(index)) {
    const std::string ip = index.string();
    json::Json doc;
    try {
      doc = json::parse(json::read_text(ip), ip);
      const json::Node root(doc, "");
      const json::Node map = root.at("weight_map");
      map.expect_object();
      std::map<std::string, bool> seen;
      for (const auto& [k, v] : map.value().items()) {
        const json::Node n(v, map.child_path(k));
        const std::string file = n.str();
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
          n.fail("'" + printable(file) + "' is not a file name in the folder");
        if (!seen[file]) names.push_back(file);
        seen[file] = true;
      }
      if (names.empty()) map.fail("lists no tensor");
    } catch (const InputError& e) {
      const std::string what = e.what();
      throw InputError(what.rfind(ip, 0) == 0 ? what : ip + ": " + what);
    }
  } else if (fs::exists(single)) {
    names.push_back("model.safetensors");
  } else {
    throw InputError((dir / "model.safetensors").string() +
                     ": missing (and no model.safetensors.index.json listing shards)");
  }
  for (const std::string& n : names) s.files.push_back(SafetensorsFile::open((dir / n).string()));
  for (std::size_t i = 0; i < s.files.size(); ++i)
    for (const StTensor& t : s.files[i].tensors()) {
      auto [it, fresh] = s.where.emplace(t.name, std::make_pair(i, &t));
      if (!fresh)
        throw InputError(s.files[i].path() + ": tensor '" + printable(t.name) + "': also in " +
                         s.files[it->second.first].path());
    }
  // transformers saves a tied tensor once and names the dropped alias in
  // __metadata__ ({"model.embed_tokens.weight": "lm_head.weight"}).
  for (const SafetensorsFile& f : s.files)
    for (const auto& [alias, target] : f.metadata()) {
      const auto it = s.where.find(target);
      if (it != s.where.end() && !s.where.count(alias)) s.where.emplace(alias, it->second);
    }
  return s;
}

}  // namespace

Model load_hf_folder(const std::string& dir_str) {
  const fs::path dir(dir_str);
  const std::string cfg_path = (dir / "config.json").string();
  if (!fs::exists(cfg_path)) throw InputError(cfg_path + ": missing (not a Hugging Face model folder)");
  HfConfig cfg = read_hf_config(cfg_path);
  Model m;
  m.path = dir_str;
  m.format = "safetensors";
  m.hparams = cfg.hparams;
  HParams& h = m.hparams;
  const ArchSpec& spec = *cfg.arch;

  m.tokenizer = read_hf_tokenizer(dir_str, h.n_vocab);
  if (m.tokenizer.bos < 0) m.tokenizer.bos = cfg.bos;
  if (m.tokenizer.eos < 0) m.tokenizer.eos = cfg.eos;
  m.built_tokenizer = build_tokenizer(m.tokenizer, (dir / "tokenizer.json").string());

  auto hold = std::make_shared<Holding>();
  Shards shards = open_shards(dir);
  std::unordered_set<std::string> used;

  const std::string e = "hidden_size=" + std::to_string(h.n_embd);
  const std::string v = "vocab_size=" + std::to_string(h.n_vocab);
  const std::string ff = "intermediate_size=" + std::to_string(h.n_ff);
  const std::int64_t qd = static_cast<std::int64_t>(h.n_head) * h.head_dim;
  const std::int64_t kd = static_cast<std::int64_t>(h.n_head_kv) * h.head_dim;
  const std::string qs = "num_attention_heads*head_dim=" + std::to_string(qd);
  const std::string ks = "num_key_value_heads*head_dim=" + std::to_string(kd);
  const std::string hs = "head_dim=" + std::to_string(h.head_dim);

  // A view of HF tensor `hf` under the engine's name `name`.
  auto view = [&](const std::string& hf, const std::string& name, std::int64_t rows, std::int64_t cols,
                  const std::string& why) {
    const auto it = shards.where.find(hf);
    if (it == shards.where.end())
      throw InputError(shards.files.front().path() + ": tensor '" + hf + "': missing");
    used.insert(hf);
    const std::string& file = shards.files[it->second.first].path();
    const StTensor& t = *it->second.second;
    DType dt;
    switch (t.dtype) {
      case StDType::f32: dt = DType::f32; break;
      case StDType::f16: dt = DType::f16; break;
      case StDType::bf16: dt = DType::bf16; break;
      default:
        throw InputError(file + ": tensor '" + hf + "': unsupported dtype " + st_dtype_name(t.dtype) +
                         " (supported: F32, F16, BF16)");
    }
    const bool ok = rows == 1 ? (t.shape.size() == 1 && t.shape[0] == cols)
                              : (t.shape.size() == 2 && t.shape[0] == rows && t.shape[1] == cols);
    if (!ok) {
      const std::string want = rows == 1 ? "[" + std::to_string(cols) + "]"
                                         : "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
      throw InputError(file + ": tensor '" + hf + "': shape " + t.shape_text() + " does not match " + cfg_path +
                       ": expected " + want + " (" + why + ")");
    }
    TensorView tv;
    tv.name = name;
    tv.dtype = dt;
    tv.rows = rows;
    tv.cols = cols;
    tv.data = t.data;
    tv.bytes = t.end - t.begin;
    return tv;
  };
  auto part = [&](unsigned p, const std::string& hf, const std::string& name, std::int64_t rows, std::int64_t cols,
                  const std::string& why) {
    if (!((spec.required | spec.optional) & p)) return TensorView{};
    if (!shards.where.count(hf)) {
      if (spec.required & p)
        throw InputError(shards.files.front().path() + ": tensor '" + hf + "': missing (architecture " +
                         spec.hf_class + " requires it)");
      return TensorView{};
    }
    return view(hf, name, rows, cols, why);
  };

  Weights& w = m.weights;
  w.tok_embd = view("model.embed_tokens.weight", "token_embd.weight", h.n_vocab, h.n_embd, e + ", " + v);
  w.layers.resize(static_cast<std::size_t>(h.n_layer));
  for (int l = 0; l < h.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<std::size_t>(l)];
    L.attn_norm = view(p + "input_layernorm.weight", b + "attn_norm.weight", 1, h.n_embd, e);
    L.wq = view(p + "self_attn.q_proj.weight", b + "attn_q.weight", qd, h.n_embd, e + ", " + qs);
    L.wk = view(p + "self_attn.k_proj.weight", b + "attn_k.weight", kd, h.n_embd, e + ", " + ks);
    L.wv = view(p + "self_attn.v_proj.weight", b + "attn_v.weight", kd, h.n_embd, e + ", " + ks);
    L.wo = view(p + "self_attn.o_proj.weight", b + "attn_output.weight", h.n_embd, qd, qs + ", " + e);
    L.ffn_norm = view(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", 1, h.n_embd, e);
    L.w_gate = view(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", h.n_ff, h.n_embd, e + ", " + ff);
    L.w_down = view(p + "mlp.down_proj.weight", b + "ffn_down.weight", h.n_embd, h.n_ff, ff + ", " + e);
    L.w_up = view(p + "mlp.up_proj.weight", b + "ffn_up.weight", h.n_ff, h.n_embd, e + ", " + ff);
    L.bq = part(kQkvBias, p + "self_attn.q_proj.bias", b + "attn_q.bias", 1, qd, qs);
    L.bk = part(kQkvBias, p + "self_attn.k_proj.bias", b + "attn_k.bias", 1, kd, ks);
    L.bv = part(kQkvBias, p + "self_attn.v_proj.bias", b + "attn_v.bias", 1, kd, ks);
    L.q_norm = part(kQkNorm, p + "self_attn.q_norm.weight", b + "attn_q_norm.weight", 1, h.head_dim, hs);
    L.k_norm = part(kQkNorm, p + "self_attn.k_norm.weight", b + "attn_k_norm.weight", 1, h.head_dim, hs);
  }
  w.output_norm = view("model.norm.weight", "output_norm.weight", 1, h.n_embd, e);
  if (cfg.tie_word_embeddings) {
    w.output = w.tok_embd;
  } else {
    if (!shards.where.count("lm_head.weight"))
      throw InputError(shards.files.front().path() + ": tensor 'lm_head.weight': missing (" + cfg_path +
                       " has tie_word_embeddings false)");
    w.output = view("lm_head.weight", "output.weight", h.n_vocab, h.n_embd, e + ", " + v);
  }
  used.insert("lm_head.weight");  // a tied model may still carry a copy
  if (!cfg.rope_freqs.empty()) {
    hold->rope_freqs = std::move(cfg.rope_freqs);
    TensorView& rf = w.rope_freqs;
    rf.name = "rope_freqs.weight";
    rf.dtype = DType::f32;
    rf.rows = 1;
    rf.cols = static_cast<std::int64_t>(hold->rope_freqs.size());
    rf.data = hold->rope_freqs.data();
    rf.bytes = hold->rope_freqs.size() * sizeof(float);
  }
  for (const SafetensorsFile& f : shards.files)
    for (const StTensor& t : f.tensors()) {
      if (used.count(t.name)) continue;
      // Old checkpoints store RoPE's inverse frequencies; the engine computes them.
      if (t.name.find("rotary_emb.inv_freq") != std::string::npos) continue;
      throw InputError(f.path() + ": tensor '" + printable(t.name) + "': not used by architecture " + spec.hf_class +
                       " (unsupported)");
    }
  hold->shards = std::move(shards.files);
  m.mapping = hold;
  m.weights_file_mapped = true;
  return m;
}

}  // namespace ftp::model
