// SPDX-License-Identifier: Apache-2.0
#pragma once

// llama2.c's legacy float32 checkpoint (run.c "version 0": a header of 7
// int32, then the float32 weights) and its tokenizer.bin. Both parsers check
// every size against the bytes present and are fuzzed
// (tests/fuzz/fuzz_llama2c.cpp).

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/model.hpp"

namespace ftp::model {

/// The checkpoint header, as in llama2.c's run.c Config.
struct Llama2cConfig {
  std::int32_t dim = 0;         ///< transformer dimension
  std::int32_t hidden_dim = 0;  ///< feed-forward dimension
  std::int32_t n_layers = 0;
  std::int32_t n_heads = 0;
  std::int32_t n_kv_heads = 0;
  std::int32_t vocab_size = 0;  ///< negative: the classifier wcls follows (untied)
  std::int32_t seq_len = 0;
};

/// Bytes of a checkpoint with header c (header included); throws InputError
/// naming `name` when the header is implausible.
std::size_t llama2c_expected_bytes(const Llama2cConfig& c, const std::string& name);

/// Parses a checkpoint in memory: hyper-parameters and weight views into
/// `data` (which must outlive the Model). No tokenizer is read.
Model parse_llama2c(const void* data, std::size_t size, const std::string& name);

/// Parses a tokenizer.bin in memory: int32 max_token_length, then per token
/// float32 score, int32 length, bytes. n_vocab tokens, or with n_vocab < 0
/// every token up to the end of the data.
TokenizerData parse_llama2c_tokenizer(const void* data, std::size_t size, int n_vocab,
                                      const std::string& name);

/// Reads a tokenizer.bin file (see parse_llama2c_tokenizer).
TokenizerData load_llama2c_tokenizer(const std::string& path, int n_vocab);

/// Maps and parses a checkpoint, with its tokenizer from tokenizer_path, or
/// else tokenizer.bin or tok<vocab>.bin in the checkpoint's folder.
Model load_llama2c(const std::string& path, const std::string& tokenizer_path);

}  // namespace ftp::model
