// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "core/json.hpp"
#include "doc/gear_table.hpp"

namespace ftp::model {
class Model;
}

namespace ftp::plan {

/// ftp.model-shape/v1: the shapes of a decoder-only (Llama-style) transformer,
/// enough to plan gears without its weights (man ftp-plan(1)). Parameter
/// counts follow the Llama layout: per layer wq, wk, wv, wo, three FFN
/// matrices (gate, up, down) and two RMS norms; an embedding, a final norm and
/// an output head (shared with the embedding when tie_embeddings).
struct ModelShape {
  std::string name;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;              ///< n_heads unless grouped-query attention
  int hidden_size = 0;
  int intermediate_size = 0;       ///< FFN inner size
  int vocab_size = 0;
  int head_dim = 0;                ///< hidden_size / n_heads unless given
  std::string dtype;               ///< weight dtype: "f32" | "f16" | "bf16" | "q8_0"; empty when only bytes_per_param was given
  double bytes_per_param = 0;      ///< bytes per weight of the matrices (q8_0: 34 bytes per 32 weights = 1.0625; a model file's: their mean); the norms are float32 in memory
  std::string kv_dtype;            ///< KV-cache dtype: "f32" | "f16" | "bf16"
  int context_length = 0;          ///< tokens
  bool tie_embeddings = false;     ///< output head shares the embedding matrix
  std::uint64_t n_params = 0;      ///< as given, else computed from the shapes

  /// Parameters of one transformer layer (scaled so that the total is n_params when n_params was given).
  double layer_params() const;
  /// Parameters of the token embedding (vocab x hidden), scaled like layer_params.
  double embedding_params() const;
  /// Parameters of the output head and final norm; a stage that holds the head
  /// holds them even when tied (a pipeline's last stage keeps its own copy).
  double head_params() const;
  /// Parameters the shapes imply, before scaling to n_params.
  std::uint64_t computed_params() const;
  /// Weight bytes of the whole model: n_params x bytes_per_param.
  double weight_bytes() const;
  /// Bytes per KV-cache element.
  double kv_bytes_per_element() const;
  /// Bytes of activations exchanged by all-reduce and pipeline sends, per element
  /// (4 for f32 weights, else 2).
  double activation_bytes_per_element() const;
  /// KV-cache bytes one token takes in one layer, all KV heads: 2 x n_kv_heads x head_dim x kv bytes.
  double kv_bytes_per_token_layer() const;
  /// KV-cache bytes one token takes in one layer on one of `tp` ranks: KV
  /// heads are split when tp <= n_kv_heads and replicated (one per rank) above.
  double kv_bytes_per_token_layer(int tp) const;

  /// The subset a gear table carries.
  doc::ModelShape to_doc() const;

  /// n_params / computed_params() when n_params was given (the counts
  /// above are scaled by it), else 1.
  double scale() const;
};

json::Json to_json(const ModelShape& m);
/// Parses and validates a ftp.model-shape/v1 document; errors name the JSON path
/// ("n_kv_heads: must divide n_heads (32), got 5").
ModelShape model_shape_from_json(const json::Json& j);
/// Reads a model-shape file ("-" is stdin); errors start with the file name.
ModelShape read_model_shape(const std::string& path);

/// The shape of a model file (GGUF or llama2.c): hyper-parameters from its
/// metadata, the weight dtype of its matrices, the exact parameter count.
ModelShape model_shape_of_file(const std::string& path);
/// The same for a loaded model, named `name`.
ModelShape model_shape_of(const model::Model& m, const std::string& name);

/// read_model_shape for a JSON document, model_shape_of_file for a model
/// file (told apart by the first byte: a JSON document starts with '{').
ModelShape read_model_input(const std::string& path);

}  // namespace ftp::plan
