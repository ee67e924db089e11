// SPDX-License-Identifier: Apache-2.0
#pragma once

// Unicode helpers for the tokenizers: UTF-8 decoding that never fails,
// general-category flags (from ICU), GPT-2's byte <-> unicode mapping, and the
// pre-tokenizer splits of byte-level BPE vocabularies, written as matching
// code equivalent to the regular expressions llama.cpp uses for each `pre`.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ftp::model::unicode {

/// Category flags of one code point (the classes the pre-tokenizer regexes use).
struct CptFlags {
  bool in_range = false;   ///< false past the end of a fragment (matches nothing)
  bool letter = false;     ///< \p{L}
  bool number = false;     ///< \p{N}
  bool punct = false;      ///< \p{P}
  bool whitespace = false; ///< \s (Unicode White_Space, as llama.cpp lists it)
};

CptFlags flags(std::uint32_t cpt);

/// Byte length of the UTF-8 sequence that starts with `lead` (1 for a
/// continuation or invalid byte, so that decoding always moves on).
std::size_t utf8_len(unsigned char lead) noexcept;

/// UTF-8 text decoded into code points with the byte offset of each (plus a
/// final offset = text size). Invalid sequences decode as U+FFFD, one byte
/// each, so that every byte of the input stays covered.
struct Decoded {
  std::vector<std::uint32_t> cpts;
  std::vector<std::size_t> offsets;  ///< cpts.size() + 1 entries, bytes
};
Decoded decode_utf8(std::string_view text);

/// Encodes one code point as UTF-8.
std::string encode_utf8(std::uint32_t cpt);

/// GPT-2's printable stand-in (UTF-8) for a raw byte, and back (-1 when the
/// text is not one of the 256 stand-ins).
const std::string& byte_to_unicode(unsigned char b);
int unicode_to_byte(std::string_view utf8);

/// Pre-tokenizer styles of byte-level BPE vocabularies (GGUF tokenizer.ggml.pre).
enum class PreStyle {
  default_,        ///< llama.cpp's default: punctuation runs, gpt2, \p{N}+, [0-9]{3}
  gpt2,            ///< gpt-2, mpt, olmo, jais, gpt-neox style
  llama3,          ///< llama3 / llama-bpe, dbrx, smaug-bpe
  qwen2,           ///< llama3 with single digits
  falcon,
  starcoder,       ///< starcoder, refact, command-r, codeshell, exaone, minerva
  deepseek_llm,
  deepseek_coder,
};

/// Maps a GGUF `pre` value to its style; false when unknown. An empty value
/// means llama.cpp's default.
bool pre_style_from_name(std::string_view pre, PreStyle& out);

/// Splits text into the words BPE merges run inside; the words are byte
/// substrings of `text`, in order, covering it entirely.
std::vector<std::string_view> pre_tokenize(std::string_view text, PreStyle style);

}  // namespace ftp::model::unicode
