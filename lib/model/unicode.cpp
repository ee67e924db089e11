// SPDX-License-Identifier: Apache-2.0
#include "model/unicode.hpp"

#include <unicode/uchar.h>

#include <array>
#include <functional>

namespace ftp::model::unicode {

namespace {

// Unicode White_Space: the list llama.cpp's \s stands for.
bool is_white_space(std::uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace

CptFlags flags(std::uint32_t cpt) {
  CptFlags f;
  f.in_range = true;
  if (cpt > 0x10FFFF) return f;
  switch (u_charType(static_cast<UChar32>(cpt))) {
    case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER: case U_OTHER_LETTER:
      f.letter = true; break;
    case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER:
      f.number = true; break;
    case U_CONNECTOR_PUNCTUATION: case U_DASH_PUNCTUATION: case U_START_PUNCTUATION:
    case U_END_PUNCTUATION: case U_INITIAL_PUNCTUATION: case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      f.punct = true; break;
    default: break;
  }
  f.whitespace = is_white_space(cpt);
  return f;
}

std::size_t utf8_len(unsigned char lead) noexcept {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

Decoded decode_utf8(std::string_view s) {
  Decoded d;
  d.cpts.reserve(s.size());
  d.offsets.reserve(s.size() + 1);
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    std::size_t n = utf8_len(b0);
    std::uint32_t c = 0xFFFD;
    bool ok = n > 1 && i + n <= s.size();
    if (n == 1) {
      ok = b0 < 0x80;
      c = ok ? b0 : 0xFFFD;
    } else if (ok) {
      c = b0 & (0xFF >> (n + 1));
      for (std::size_t k = 1; k < n; ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        if ((b & 0xC0) != 0x80) { ok = false; break; }
        c = (c << 6) | (b & 0x3F);
      }
    }
    if (!ok) { n = 1; c = 0xFFFD; }
    d.cpts.push_back(c);
    d.offsets.push_back(i);
    i += n;
  }
  d.offsets.push_back(s.size());
  return d;
}

std::string encode_utf8(std::uint32_t c) {
  std::string r;
  if (c < 0x80) {
    r += static_cast<char>(c);
  } else if (c < 0x800) {
    r += static_cast<char>(0xC0 | (c >> 6));
    r += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    r += static_cast<char>(0xE0 | (c >> 12));
    r += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    r += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    r += static_cast<char>(0xF0 | (c >> 18));
    r += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    r += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    r += static_cast<char>(0x80 | (c & 0x3F));
  }
  return r;
}

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
// others to U+0100 + n in byte order.
struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> from_cpt;  // code point (< 0x200) -> byte, or -1
  ByteMap() {
    from_cpt.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const std::uint32_t c = printable ? static_cast<std::uint32_t>(b) : 0x100u + n++;
      to_unicode[b] = encode_utf8(c);
      from_cpt[c] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

const std::string& byte_to_unicode(unsigned char b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(std::string_view utf8) {
  const Decoded d = decode_utf8(utf8);
  if (d.cpts.size() != 1 || d.cpts[0] >= 512) return -1;
  return byte_map().from_cpt[d.cpts[0]];
}

bool pre_style_from_name(std::string_view pre, PreStyle& out) {
  struct Entry { std::string_view name; PreStyle style; };
  static constexpr Entry table[] = {
      {"", PreStyle::default_},         {"default", PreStyle::default_},
      {"llama3", PreStyle::llama3},     {"llama-v3", PreStyle::llama3},
      {"llama-bpe", PreStyle::llama3},  {"dbrx", PreStyle::llama3},
      {"smaug-bpe", PreStyle::llama3},  {"qwen2", PreStyle::qwen2},
      {"gpt-2", PreStyle::gpt2},        {"gpt2", PreStyle::gpt2},
      {"mpt", PreStyle::gpt2},          {"olmo", PreStyle::gpt2},
      {"jais", PreStyle::gpt2},         {"phi-2", PreStyle::gpt2},
      {"stablelm2", PreStyle::gpt2},    {"falcon", PreStyle::falcon},
      {"starcoder", PreStyle::starcoder}, {"refact", PreStyle::starcoder},
      {"command-r", PreStyle::starcoder}, {"codeshell", PreStyle::starcoder},
      {"exaone", PreStyle::starcoder},  {"minerva-7b", PreStyle::starcoder},
      {"deepseek-llm", PreStyle::deepseek_llm},
      {"deepseek-coder", PreStyle::deepseek_coder},
  };
  for (const auto& e : table) {
    if (e.name == pre) { out = e.style; return true; }
  }
  return false;
}

namespace {

// A pre-tokenizer works on code points; fragments are runs of code points
// given by their lengths, as in llama.cpp's unicode_regex_split.
using Lengths = std::vector<std::size_t>;
using Cpts = std::vector<std::uint32_t>;

constexpr std::uint32_t kOutOfRange = 0xFFFFFFFF;

// One fragment [begin, end) of the code points with bounds-aware accessors.
struct Frag {
  const Cpts& cpts;
  std::size_t begin, end;
  std::uint32_t cpt(std::size_t pos) const {
    return (pos >= begin && pos < end) ? cpts[pos] : kOutOfRange;
  }
  CptFlags fl(std::size_t pos) const {
    return (pos >= begin && pos < end) ? flags(cpts[pos]) : CptFlags{};
  }
};

// Splits by a full tokenizer of each fragment (the hand-written gpt2 and
// llama3 regexes): `step(frag, pos)` returns the end of the word at pos.
template <typename Step>
Lengths split_full(const Cpts& cpts, const Lengths& in, Step step) {
  Lengths out;
  std::size_t start = 0;
  for (const std::size_t len : in) {
    const Frag f{cpts, start, start + len};
    std::size_t pos = f.begin;
    while (pos < f.end) {
      std::size_t next = step(f, pos);
      if (next <= pos) next = pos + 1;
      out.push_back(next - pos);
      pos = next;
    }
    start += len;
  }
  return out;
}

// Splits by a pattern: each match becomes a word, and so does each gap
// between matches (std::regex-style search, leftmost match first).
// `match(frag, pos)` returns the match length at pos, 0 for none.
template <typename Match>
Lengths split_matches(const Cpts& cpts, const Lengths& in, Match match) {
  Lengths out;
  std::size_t start = 0;
  for (const std::size_t len : in) {
    const Frag f{cpts, start, start + len};
    std::size_t prev = f.begin, pos = f.begin;
    while (pos < f.end) {
      const std::size_t m = match(f, pos);
      if (m == 0) { ++pos; continue; }
      if (pos > prev) out.push_back(pos - prev);
      out.push_back(m);
      pos += m;
      prev = pos;
    }
    if (f.end > prev) out.push_back(f.end - prev);
    start += len;
  }
  return out;
}

std::uint32_t ascii_lower(std::uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive; returns the end or 0.
std::size_t contraction(const Frag& f, std::size_t pos, bool ignore_case) {
  if (f.cpt(pos) != '\'' || pos + 1 >= f.end) return 0;
  auto low = [&](std::uint32_t c) { return ignore_case ? ascii_lower(c) : c; };
  const std::uint32_t c1 = low(f.cpt(pos + 1));
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
  if (pos + 2 < f.end) {
    const std::uint32_t c2 = low(f.cpt(pos + 2));
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return pos + 3;
  }
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::size_t gpt2_step(const Frag& f, std::size_t pos) {
  if (const std::size_t e = contraction(f, pos, false)) return e;
  const std::uint32_t c = f.cpt(pos);
  CptFlags f2 = c == ' ' ? f.fl(pos + 1) : f.fl(pos);
  if (f2.letter) {
    pos += (c == ' ');
    while (f.fl(pos).letter) ++pos;
    return pos;
  }
  if (f2.number) {
    pos += (c == ' ');
    while (f.fl(pos).number) ++pos;
    return pos;
  }
  auto other = [](const CptFlags& x) { return x.in_range && !(x.whitespace || x.letter || x.number); };
  if (other(f2)) {
    pos += (c == ' ');
    while (other(f.fl(pos))) ++pos;
    return pos;
  }
  std::size_t n_ws = 0;
  while (f.fl(pos + n_ws).whitespace) ++n_ws;
  if (n_ws > 1 && f.cpt(pos + n_ws) != kOutOfRange) return pos + n_ws - 1;  // \s+(?!\S)
  if (n_ws > 0) return pos + n_ws;                                         // \s+
  return pos + 1;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
std::size_t llama3_step(const Frag& f, std::size_t pos, std::size_t max_digits) {
  if (const std::size_t e = contraction(f, pos, true)) return e;
  const std::uint32_t c = f.cpt(pos);
  const CptFlags fl = f.fl(pos);
  if (!(c == '\r' || c == '\n' || fl.number)) {
    if (fl.letter || f.fl(pos + 1).letter) {
      ++pos;
      while (f.fl(pos).letter) ++pos;
      return pos;
    }
  }
  if (fl.number) {
    const std::size_t ini = pos;
    while (f.fl(pos).number && pos - ini < max_digits) ++pos;
    return pos;
  }
  const CptFlags f2 = c == ' ' ? f.fl(pos + 1) : fl;
  auto other = [](const CptFlags& x) { return x.in_range && !(x.whitespace || x.letter || x.number); };
  if (other(f2)) {
    pos += (c == ' ');
    while (other(f.fl(pos))) ++pos;
    while (f.cpt(pos) == '\r' || f.cpt(pos) == '\n') ++pos;
    return pos;
  }
  std::size_t n_ws = 0, last_rn = 0;
  while (f.fl(pos + n_ws).whitespace) {
    const std::uint32_t c2 = f.cpt(pos + n_ws);
    if (c2 == '\r' || c2 == '\n') last_rn = pos + n_ws + 1;
    ++n_ws;
  }
  if (last_rn > 0) return last_rn;                                          // \s*[\r\n]+
  if (n_ws > 1 && f.cpt(pos + n_ws) != kOutOfRange) return pos + n_ws - 1;  // \s+(?!\S)
  if (n_ws > 0) return pos + n_ws;
  return pos + 1;
}

// [class]+ with an optional single leading \s, and a bound on the run.
template <typename Class>
auto run_of(Class cls, bool opt_space, std::size_t min_n = 1, std::size_t max_n = SIZE_MAX) {
  return [=](const Frag& f, std::size_t pos) -> std::size_t {
    auto run = [&](std::size_t p) {
      std::size_t n = 0;
      while (n < max_n && f.cpt(p + n) != kOutOfRange && cls(f.cpt(p + n))) ++n;
      return n;
    };
    if (opt_space && f.fl(pos).whitespace) {
      const std::size_t n = run(pos + 1);
      if (n >= min_n) return n + 1;
    }
    const std::size_t n = run(pos);
    return n >= min_n ? n : 0;
  };
}

bool is_p_or_sym(std::uint32_t c, bool backtick) {
  if (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|')
    return true;
  if (backtick && c == '`') return true;
  return flags(c).punct;
}
bool is_number(std::uint32_t c) { return flags(c).number; }
bool is_letter(std::uint32_t c) { return flags(c).letter; }
bool is_punct(std::uint32_t c) { return flags(c).punct; }
bool is_ascii_digit(std::uint32_t c) { return c >= '0' && c <= '9'; }
bool is_cjk(std::uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) || (c >= 0xAC00 && c <= 0xD7FF);
}
// DeepSeek-LLM's letter class lists the cased letters of many scripts;
// approximated by the cased letter categories.
bool is_cased_letter(std::uint32_t c) {
  const auto t = u_charType(static_cast<UChar32>(c));
  return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER;
}
bool is_deepseek_punct(std::uint32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) ||
         (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
}
bool is_cr_lf(std::uint32_t c) { return c == '\r' || c == '\n'; }

Lengths gpt2(const Cpts& c, const Lengths& in) { return split_full(c, in, gpt2_step); }

}  // namespace

std::vector<std::string_view> pre_tokenize(std::string_view text, PreStyle style) {
  const Decoded d = decode_utf8(text);
  const Cpts& c = d.cpts;
  Lengths l;
  if (!c.empty()) l.push_back(c.size());
  switch (style) {
    case PreStyle::default_:
      l = split_matches(c, l, run_of([](std::uint32_t x) { return is_p_or_sym(x, false); }, false));
      l = gpt2(c, l);
      l = split_matches(c, l, run_of(is_number, false));
      l = split_matches(c, l, run_of(is_ascii_digit, false, 3, 3));
      break;
    case PreStyle::gpt2:
      l = gpt2(c, l);
      break;
    case PreStyle::llama3:
      l = split_full(c, l, [](const Frag& f, std::size_t p) { return llama3_step(f, p, 3); });
      break;
    case PreStyle::qwen2:
      l = split_full(c, l, [](const Frag& f, std::size_t p) { return llama3_step(f, p, 1); });
      break;
    case PreStyle::falcon:
      l = split_matches(c, l, run_of([](std::uint32_t x) { return is_p_or_sym(x, true); }, false));
      l = gpt2(c, l);
      l = split_matches(c, l, run_of(is_ascii_digit, false, 3, 3));
      break;
    case PreStyle::starcoder:
      l = split_matches(c, l, run_of(is_number, false, 1, 1));
      l = gpt2(c, l);
      break;
    case PreStyle::deepseek_llm:
      l = split_matches(c, l, run_of(is_cr_lf, false, 1, 1));
      l = split_matches(c, l, run_of(is_cased_letter, true));
      l = split_matches(c, l, run_of(is_deepseek_punct, true));
      l = split_matches(c, l, [](const Frag& f, std::size_t pos) -> std::size_t {
        std::size_t n = 0;  // \s+$
        while (f.fl(pos + n).whitespace) ++n;
        return (n > 0 && pos + n == f.end) ? n : 0;
      });
      l = split_matches(c, l, run_of(is_cjk, false));
      l = split_matches(c, l, run_of(is_number, false));
      break;
    case PreStyle::deepseek_coder:
      l = split_matches(c, l, run_of(is_cr_lf, false, 1, 1));
      l = split_matches(c, l, run_of(is_letter, true));
      l = split_matches(c, l, run_of(is_punct, true));
      l = split_matches(c, l, run_of(is_cjk, false));
      l = split_matches(c, l, run_of(is_number, false, 1, 1));
      break;
  }
  std::vector<std::string_view> words;
  words.reserve(l.size());
  std::size_t cp = 0;
  for (const std::size_t n : l) {
    const std::size_t b0 = d.offsets[cp], b1 = d.offsets[cp + n];
    words.push_back(text.substr(b0, b1 - b0));
    cp += n;
  }
  return words;
}

}  // namespace ftp::model::unicode
