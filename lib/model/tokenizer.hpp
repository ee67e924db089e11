// SPDX-License-Identifier: Apache-2.0
#pragma once

// Tokenizers built from TokenizerData (GGUF tokenizer.ggml.* metadata or a
// llama2.c tokenizer.bin), with the behaviour of the reference
// implementations so that token ids match theirs:
//
//  * "llama": SentencePiece-style, as llama.cpp's llm_tokenizer_spm (spaces
//    escaped as U+2581, a space prefix, bigram merges by score, byte fallback
//    to <0xXX> tokens); from a Hugging Face tokenizer.json (BPE with byte
//    fallback) the same with pairs merged by rank, as HF's BPE does.
//  * "gpt2": byte-level BPE, as llama.cpp's llm_tokenizer_bpe (pre-tokenizer
//    chosen by tokenizer.ggml.pre, GPT-2 byte-to-unicode mapping, merges by
//    rank).
//  * "llama2c": karpathy's run.c encode()/decode() (a " " dummy prefix,
//    greedy merges of the best-scoring pair, byte fallback to id byte + 3).

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/model.hpp"
#include "model/unicode.hpp"

namespace ftp::model {

class Tokenizer {
 public:
  enum class Kind { spm, bpe, llama2c };

  /// Builds a tokenizer. Throws ftp::InputError for an unknown model or
  /// pre-tokenizer, or inconsistent data (scores/types of the wrong length,
  /// special ids out of range).
  static Tokenizer from(const TokenizerData& data);

  /// Token ids of `text`. `add_special` adds BOS (when the vocabulary's
  /// add_bos says so) and EOS (add_eos). `parse_special` turns the text of
  /// control tokens ("<s>", "<|endoftext|>") into those tokens; user-defined
  /// tokens are always matched, as llama.cpp does.
  std::vector<int> encode(std::string_view text, bool add_special, bool parse_special = false) const;

  /// Token ids of a prompt to generate from: encode(text, true), and for an
  /// empty prompt BOS alone. Throws ftp::InputError when that is empty and
  /// the vocabulary has no BOS to start from.
  std::vector<int> encode_prompt(std::string_view text) const;

  /// Text of tokens, as llama.cpp's llama_detokenize: byte tokens give their
  /// raw byte, control tokens give nothing unless `unparse_special`; with the
  /// vocabulary's add_space_prefix the first token loses one leading space
  /// (SentencePiece); `remove_special` drops a leading BOS / trailing EOS
  /// (and then keeps the space). For llama2c, run.c's rule instead: a piece
  /// right after BOS loses its leading space. `clean_spaces` applies the
  /// vocabulary's clean-up of spaces before punctuation and contractions
  /// (HF's clean_up_tokenization_spaces, on for most BPE vocabularies) as
  /// llama_detokenize does; streaming passes false, as llama.cpp's server
  /// does, since the clean-up rewrites text already sent (" " then ".").
  std::string decode(const std::vector<int>& ids, bool remove_special = false, bool unparse_special = false,
                     bool clean_spaces = true) const;

  /// Text of one token (for streaming): "▁" as " ", byte tokens as the raw
  /// byte, BPE pieces mapped back to bytes; control tokens give "" unless
  /// `special`. The bytes of a multi-byte character may span several tokens.
  std::string token_to_piece(int id, bool special = false) const;

  /// The token's text as stored in the vocabulary.
  const std::string& token_text(int id) const { return tokens_.at(static_cast<std::size_t>(id)).text; }

  /// Bytes of the longest token text in the vocabulary. No token of any
  /// kind here covers more bytes of the input than its own text holds
  /// (SentencePiece's "▁" stands for one space in 3 bytes, byte-level BPE
  /// maps a byte to 1-2), so `text` takes at least text.size() / this
  /// many tokens: a bound that needs no encoding.
  std::size_t max_token_bytes() const noexcept { return max_token_bytes_; }

  int bos() const noexcept { return bos_; }
  int eos() const noexcept { return eos_; }
  int n_vocab() const noexcept { return static_cast<int>(tokens_.size()); }
  Kind kind() const noexcept { return kind_; }
  bool add_bos() const noexcept { return add_bos_; }
  /// True for tokens that end generation: EOS and end-of-turn tokens
  /// ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", ...).
  bool is_eog(int id) const noexcept;
  bool is_control(int id) const noexcept;

 private:
  enum Attr : std::uint8_t {
    normal = 1, unknown = 2, control = 4, user_defined = 8, unused = 16, byte = 32,
  };
  struct Token {
    std::string text;
    float score = 0.0f;
    std::uint8_t attr = normal;
  };
  struct PairHash {
    std::size_t operator()(const std::pair<std::string, std::string>& p) const noexcept {
      return std::hash<std::string>{}(p.first) ^ (std::hash<std::string>{}(p.second) * 31);
    }
  };

  int find(std::string_view text) const;
  int byte_to_token(unsigned char b) const;
  void encode_spm(const std::string& text, std::vector<int>& out) const;
  void encode_bpe(std::string_view text, std::vector<int>& out) const;
  void encode_llama2c(std::string_view text, std::vector<int>& out) const;

  Kind kind_ = Kind::spm;
  unicode::PreStyle pre_ = unicode::PreStyle::default_;
  std::vector<Token> tokens_;
  std::unordered_map<std::string, int> ids_;
  std::unordered_map<std::pair<std::string, std::string>, int, PairHash> ranks_;
  std::vector<int> special_;       ///< control / user-defined / unknown ids, longest text first
  std::vector<int> eog_;
  std::vector<std::string> pieces_;  ///< token_to_piece(id, true), precomputed
  int bos_ = -1, eos_ = -1, unk_ = -1;
  std::size_t max_token_bytes_ = 1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  bool ignore_merges_ = false, clean_spaces_ = false;
  bool merge_by_rank_ = false;  ///< spm from tokenizer.json: merges by rank (TokenizerData::merge_by_rank)
};

/// The model's tokenizer: the one its loader built (Model::built_tokenizer),
/// or, for a model made in code, one built now from its tokenizer data.
std::shared_ptr<const Tokenizer> tokenizer_of(const Model& model);

}  // namespace ftp::model
