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
  /// With dtype Q4_K: llama.cpp's Q4_K_M recipe instead, Q6_K for
  /// output.weight and for attn_v and ffn_down of the layers its
  /// use_more_bits picks (the first and last eighth, every third between).
  bool q4_k_m = false;
  std::uint64_t seed = 1;
  float stddev = 0.02f;   ///< of the matrix weights (uniform with this deviation)
  bool tied_output = false;  ///< no output.weight: the classifier is token_embd
};

/// Writes the model to `path`, streaming (memory use stays small whatever
/// the shape). Q8_0 and the legacy quants need n_embd, n_ff and n_head x
/// head_dim to be multiples of 32, the K-quants of 256. Quantized matrices
/// hold random_blocks. Throws ftp::Error on a bad shape or an I/O error.
/// The small shape several engine tests share: 2 layers, 64 wide, a
/// feed-forward of 192, 4 heads over 2 KV heads, context 128, F32.
inline SyntheticShape small_shape(int n_vocab, std::uint64_t seed) {
  SyntheticShape s;
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_ff = 192;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_vocab = n_vocab;
  s.n_ctx = 128;
  s.seed = seed;
  return s;
}

void write_synthetic_gguf(const std::string& path, const SyntheticShape& shape);

/// float32 -> IEEE half (round to nearest even; no overflow handling
/// beyond infinity) and -> bfloat16 (round to nearest even), as the writer
/// stores F16/BF16 weights. Shared with the GPU tests.
std::uint16_t f32_to_f16(float f);
std::uint16_t f32_to_bf16(float f);

/// `blocks` blocks of a block-quantized type (Q8_0, Q4_0 .. Q6_K) with
/// seeded random quants and scales: every byte random, then each f16 field
/// (scales, mins) set to a positive half near `scale` / (the type's
/// largest quant), so that the weights are finite and spread about
/// +-`scale`. A valid layout, not a quantization of any float values.
void random_blocks(model::DType t, std::uint8_t* out, std::int64_t blocks, std::uint64_t seed, float scale);

/// Bytes of the matrices and embeddings of a shape as written (what a
/// decode step reads, plus the embedding table when the output is untied).
std::uint64_t synthetic_weight_bytes(const SyntheticShape& shape);

}  // namespace ftp::testing
