// SPDX-License-Identifier: Apache-2.0
#include "plan/model_shape.hpp"

#include <cctype>
#include <filesystem>
#include <fstream>

#include "model/model.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::plan {

using json::Json;
using json::Node;

namespace {

double dtype_bytes(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "f16" || dtype == "bf16") return 2;
  if (dtype == "q8_0") return 34.0 / 32.0;  // 32 int8 weights + one f16 scale per block
  return 0;
}

/// A positive dimension, at most `most`: past the largest real models by
/// far, so that a typo such as 2147483647 layers is refused here, not met
/// as hours of planning or gigabytes of tables.
int int_field(const Node& n, std::string_view key, int most) {
  const int v = n.positive_int(key);
  if (v > most) n.at(key).fail("must be at most " + std::to_string(most) + ", got " + std::to_string(v));
  return v;
}

}  // namespace

std::uint64_t ModelShape::computed_params() const {
  const std::uint64_t h = static_cast<std::uint64_t>(hidden_size);
  const std::uint64_t q = static_cast<std::uint64_t>(n_heads) * static_cast<std::uint64_t>(head_dim);
  const std::uint64_t kv = static_cast<std::uint64_t>(n_kv_heads) * static_cast<std::uint64_t>(head_dim);
  const std::uint64_t layer = h * q + 2 * h * kv + q * h + 3 * h * static_cast<std::uint64_t>(intermediate_size) + 2 * h;
  const std::uint64_t emb = static_cast<std::uint64_t>(vocab_size) * h;
  return static_cast<std::uint64_t>(n_layers) * layer + emb + (tie_embeddings ? 0 : emb) + h;
}

double ModelShape::scale() const {
  const double c = static_cast<double>(computed_params());
  return n_params && c > 0 ? static_cast<double>(n_params) / c : 1.0;
}

double ModelShape::layer_params() const {
  const double h = hidden_size, q = double(n_heads) * head_dim, kv = double(n_kv_heads) * head_dim;
  return (h * q + 2 * h * kv + q * h + 3 * h * intermediate_size + 2 * h) * scale();
}

double ModelShape::embedding_params() const { return double(vocab_size) * hidden_size * scale(); }

double ModelShape::head_params() const { return (double(vocab_size) * hidden_size + hidden_size) * scale(); }

double ModelShape::weight_bytes() const { return static_cast<double>(n_params) * bytes_per_param; }

double ModelShape::kv_bytes_per_element() const { return kv_dtype == "f32" ? 4 : 2; }

double ModelShape::activation_bytes_per_element() const { return dtype == "f32" ? 4 : 2; }

double ModelShape::kv_bytes_per_token_layer() const { return 2.0 * n_kv_heads * head_dim * kv_bytes_per_element(); }

double ModelShape::kv_bytes_per_token_layer(int tp) const {
  const int heads = tp <= n_kv_heads ? (n_kv_heads + tp - 1) / tp : 1;
  return 2.0 * heads * head_dim * kv_bytes_per_element();
}

doc::ModelShape ModelShape::to_doc() const {
  doc::ModelShape d;
  d.name = name;
  d.n_layers = n_layers;
  d.n_heads = n_heads;
  d.n_kv_heads = n_kv_heads;
  d.hidden_size = hidden_size;
  d.n_params = n_params;
  return d;
}

Json to_json(const ModelShape& m) {
  Json o{{"kind", doc::kind::model_shape},
         {"name", m.name},
         {"n_layers", m.n_layers},
         {"n_heads", m.n_heads},
         {"n_kv_heads", m.n_kv_heads},
         {"hidden_size", m.hidden_size},
         {"intermediate_size", m.intermediate_size},
         {"vocab_size", m.vocab_size},
         {"head_dim", m.head_dim}};
  if (!m.dtype.empty()) o["dtype"] = m.dtype;
  o["bytes_per_param"] = m.bytes_per_param;
  o["kv_dtype"] = m.kv_dtype;
  o["context_length"] = m.context_length;
  o["tie_embeddings"] = m.tie_embeddings;
  o["n_params"] = m.n_params;
  return o;
}

ModelShape model_shape_from_json(const Json& j) {
  Node root(j, "");
  json::expect_kind(root, doc::kind::model_shape);
  ModelShape m;
  m.name = root.str("name");
  if (m.name.empty()) root.at("name").fail("must not be empty");
  m.n_layers = int_field(root, "n_layers", 4096);
  m.n_heads = int_field(root, "n_heads", 65536);
  m.n_kv_heads = root.has("n_kv_heads") ? int_field(root, "n_kv_heads", 65536) : m.n_heads;
  if (m.n_heads % m.n_kv_heads != 0)
    root.at("n_kv_heads").fail("must divide n_heads (" + std::to_string(m.n_heads) + "), got " + std::to_string(m.n_kv_heads));
  m.hidden_size = int_field(root, "hidden_size", 1 << 20);
  m.intermediate_size = int_field(root, "intermediate_size", 1 << 22);
  m.vocab_size = int_field(root, "vocab_size", 1 << 24);
  if (root.has("head_dim")) {
    m.head_dim = int_field(root, "head_dim", 65536);
  } else {
    if (m.hidden_size % m.n_heads != 0)
      root.at("hidden_size").fail("must be a multiple of n_heads (" + std::to_string(m.n_heads) + ") unless head_dim is given, got " +
                                  std::to_string(m.hidden_size));
    m.head_dim = m.hidden_size / m.n_heads;
  }
  const std::vector<std::string> dtypes{"f32", "f16", "bf16", "q8_0"};
  if (root.has("dtype")) m.dtype = root.one_of("dtype", dtypes);
  if (root.has("bytes_per_param")) {
    m.bytes_per_param = root.positive("bytes_per_param");
    if (!m.dtype.empty() && m.bytes_per_param != dtype_bytes(m.dtype))
      root.at("bytes_per_param").fail("contradicts dtype " + m.dtype + " (" + json::Json(dtype_bytes(m.dtype)).dump() +
                                      " bytes per parameter), got " + json::Json(m.bytes_per_param).dump());
  } else if (!m.dtype.empty()) {
    m.bytes_per_param = dtype_bytes(m.dtype);
  } else {
    root.at("dtype");  // throws "dtype: missing required field"
  }
  m.kv_dtype = root.has("kv_dtype") ? root.one_of("kv_dtype", {"f32", "f16", "bf16"}) : (m.dtype == "bf16" ? "bf16" : "f16");
  m.context_length = int_field(root, "context_length", 1 << 26);
  m.tie_embeddings = root.boolean_or("tie_embeddings", false);
  m.n_params = root.has("n_params") ? static_cast<std::uint64_t>(root.positive_integer("n_params")) : m.computed_params();
  return m;
}

ModelShape read_model_shape(const std::string& path) {
  return json::parse_file(path, [](const Json& j) { return model_shape_from_json(j); });
}

ModelShape model_shape_of_file(const std::string& path) {
  // The file's stem, as ftp-serve names the model it serves (/v1/models):
  // a table planned from a file is the table of the daemon serving it
  // (ftp-gear-bench --write-capacity checks that). GGUF general.name is
  // often a converter's default ("llama") or a long title.
  return model_shape_of(model::load_model(path), std::filesystem::path(path).stem().string());
}

ModelShape model_shape_of(const model::Model& m, const std::string& name) {
  const auto& hp = m.hparams;
  ModelShape s;
  s.name = name;
  s.n_layers = hp.n_layer;
  s.n_heads = hp.n_head;
  s.n_kv_heads = hp.n_head_kv;
  s.hidden_size = hp.n_embd;
  s.intermediate_size = hp.n_ff;
  s.vocab_size = hp.n_vocab;
  s.head_dim = hp.head_dim;
  s.context_length = hp.n_ctx_train;
  s.tie_embeddings = hp.tied_output || m.weights.output.data == m.weights.tok_embd.data;
  // The dtype named is wq's; the bytes per parameter are the file's own
  // mean over its matrices, so that a mixed file (Q4_K_M: Q4_K and Q6_K)
  // is counted as it is.
  const model::TensorView& wq = m.weights.layers.at(0).wq;
  s.dtype = model::dtype_name(wq.dtype);
  // ftp-serve's default KV cache (--kv-cache-dtype auto): 16 bits in the
  // model's compute type.
  s.kv_dtype = wq.dtype == model::DType::bf16 ? "bf16" : "f16";
  // The mean over the matrices: the vectors (norms) are float32 in the
  // engine's memory whatever the file stores, and counted so
  // (shard_union_bytes).
  std::uint64_t n = 0, mat_n = 0, bytes = 0;
  auto add = [&](const model::TensorView& t) {
    n += static_cast<std::uint64_t>(t.elements());
    if (t.rows > 1) {
      mat_n += static_cast<std::uint64_t>(t.elements());
      bytes += t.bytes;
    }
  };
  add(m.weights.tok_embd);
  add(m.weights.output_norm);
  if (!s.tie_embeddings) add(m.weights.output);
  for (const auto& l : m.weights.layers)
    for (const auto* t : l.tensors()) add(*t);
  s.n_params = n;
  s.bytes_per_param = mat_n > 0 ? static_cast<double>(bytes) / static_cast<double>(mat_n) : 4.0;
  return s;
}

ModelShape read_model_input(const std::string& path) {
  if (path != "-") {
    std::ifstream f(path, std::ios::binary);
    char c = 0;
    while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
    }
    if (f && c != '{') return model_shape_of_file(path);
  }
  return read_model_shape(path);
}

}  // namespace ftp::plan
