// SPDX-License-Identifier: Apache-2.0
#pragma once

// Hugging Face tokenizer.json (with tokenizer_config.json beside it) read
// into the TokenizerData the GGUF loader fills, so one Tokenizer serves both
// formats. Two families, the ones Llama and Qwen checkpoints use:
//
//  * BPE with byte fallback, SentencePiece style (Llama 2, TinyStories): a
//    normalizer that prepends "▁" and replaces " " by "▁", no pre-tokenizer,
//    <0xXX> byte tokens. Read as model "llama" with the file's merges, which
//    the SPM tokenizer then applies by rank as HF's BPE does.
//  * Byte-level BPE (GPT-2, Llama 3, Qwen2/3): a ByteLevel pre-tokenizer,
//    alone (GPT-2's regex) or after a Split whose regex is one of the known
//    ones (Llama 3's, Qwen2's). Read as model "gpt2" with tokenizer.ggml.pre
//    set to the matching style. An unknown regex is refused, named.
//
// tokenizer_config.json gives bos_token / eos_token, add_bos_token /
// add_eos_token and chat_template (a string, a list of named templates, or
// a chat_template.jinja file beside it). Errors (ftp::InputError) name the
// file and the field.

#include <string>

#include "core/json.hpp"
#include "model/model.hpp"

namespace ftp::model {

/// Reads tokenizer.json (`tok`, named `tok_path` in errors) and, when not
/// null, tokenizer_config.json (`cfg`, `cfg_path`). `n_vocab` (config.json's
/// vocab_size, 0 for the tokenizer's own size) pads the vocabulary with
/// unused "[PAD<id>]" tokens up to the model's rows, as llama.cpp's converter
/// does; a tokenizer larger than it is refused.
TokenizerData tokenizer_from_hf_json(const json::Json& tok, const std::string& tok_path, const json::Json* cfg,
                                     const std::string& cfg_path, int n_vocab = 0);

/// Reads DIR/tokenizer.json, DIR/tokenizer_config.json (optional) and
/// DIR/chat_template.jinja (optional).
TokenizerData read_hf_tokenizer(const std::string& dir, int n_vocab = 0);

}  // namespace ftp::model
