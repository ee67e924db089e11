// SPDX-License-Identifier: Apache-2.0
#pragma once

// Synthetic models for tests and benchmarks: a GGUF v3 file of any Llama
// shape, with seeded random weights and a valid SentencePiece-style
// tokenizer, for shapes that no small real model has (e.g. ~1 B parameters
// in F16 or Q8_0).

#include <cstdint>
#include <string>

#include "model/model.hpp"

namespace ftp::testing {

/// The shape of a synthetic Llama model.
struct SyntheticShape {
  int n_layer = 2;
  int n_embd = 64;
  int n_ff = 96;
  int n_head = 4;
  int n_head_kv = 2;
  int n_vocab = 512;      ///< >= 259 + 1: <unk>, <s>, </s>, 256 byte tokens, then pieces
  int n_ctx = 256;        ///< llama.context_length
  model::DType dtype = model::DType::f32;  ///< of the matrices (norms are F32)
  std::uint64_t seed = 1;
  float stddev = 0.02f;   ///< of the matrix weights (uniform with this deviation)
  bool tied_output = false;  ///< no output.weight: the classifier is token_embd
};

/// Writes the model to `path`, streaming (memory use stays small whatever
/// the shape). Q8_0 needs n_embd, n_ff and n_head * head_dim to be
/// multiples of 32. Throws ftp::Error on a bad shape or an I/O error.
void write_synthetic_gguf(const std::string& path, const SyntheticShape& shape);

/// float32 -> IEEE half (round to nearest even; no overflow handling
/// beyond infinity) and -> bfloat16 (round to nearest even), as the writer
/// stores F16/BF16 weights. Shared with the GPU tests.
std::uint16_t f32_to_f16(float f);
std::uint16_t f32_to_bf16(float f);

/// Bytes of the matrices and embeddings of a shape as written (what a
/// decode step reads, plus the embedding table when the output is untied).
std::uint64_t synthetic_weight_bytes(const SyntheticShape& shape);

}  // namespace ftp::testing
