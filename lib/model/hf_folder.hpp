// SPDX-License-Identifier: Apache-2.0
#pragma once

// A Hugging Face model folder as a Model: config.json (model/hf_config.hpp),
// model.safetensors or the shards model-0000N-of-0000M.safetensors listed by
// model.safetensors.index.json (model/safetensors.hpp, memory-mapped, F32,
// F16 or BF16), tokenizer.json and tokenizer_config.json
// (model/tokenizer_json.hpp).
//
// Tensor names map to the engine's (GGUF's) names: model.embed_tokens ->
// token_embd, model.layers.N.self_attn.q_proj -> blk.N.attn_q, ...,
// lm_head -> output. The views point into the shards' mappings, so no weight
// byte is copied.
//
// Q/K rows: HF checkpoints keep each head's query and key rows in
// rotate-half order, pairing dimensions (i, i + head_dim/2). llama.cpp's
// converter permutes the rows of Llama's q_proj/k_proj (permute() in
// convert_hf_to_gguf.py: row (h, i) and (h, i + d/2) become (h, 2i) and
// (h, 2i + 1)) into the adjacent-pair order its "norm" RoPE rotates. Rather
// than copy the two matrices to permute them, the loader keeps HF's rows and
// sets RopeType::neox, which rotates exactly those pairs with the same
// angles: the same attention, with the weights still mapped. (qwen2 and
// qwen3 are neox in GGUF too: llama.cpp does not permute them.)

#include <string>

#include "model/model.hpp"

namespace ftp::model {

/// Loads the folder. Errors (ftp::InputError) name the file and the
/// problem: a missing config field, a missing or mis-shaped tensor, an
/// unsupported dtype, a safetensors header that does not hold together.
Model load_hf_folder(const std::string& dir);

}  // namespace ftp::model
