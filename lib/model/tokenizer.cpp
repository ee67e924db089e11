// SPDX-License-Identifier: Apache-2.0
#include "model/tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "core/error.hpp"
#include "core/escape.hpp"

namespace ftp::model {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

std::string escape_spaces(std::string_view s) {
  std::string r;
  r.reserve(s.size() + s.size() / 4);
  for (const char c : s) {
    if (c == ' ') r += kSpace; else r += c;
  }
  return r;
}

std::string unescape_spaces(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpace.size(), kSpace) == 0) { r += ' '; i += kSpace.size(); }
    else r += s[i++];
  }
  return r;
}

// "<0xAB>" -> 0xAB; -1 when the text is not a byte token.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (const char c : t.substr(3, 2)) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return -1;
  }
  return v;
}

// Texts of tokens that end a turn (llama.cpp's list, in part).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "<|end_of_text|>",
};

struct Symbol {
  int prev, next;
  std::size_t off, n;  // bytes into the text being tokenized
};

}  // namespace

Tokenizer Tokenizer::from(const TokenizerData& d) {
  Tokenizer t;
  if (d.model == "llama") t.kind_ = Kind::spm;
  else if (d.model == "gpt2") t.kind_ = Kind::bpe;
  else if (d.model == "llama2c") t.kind_ = Kind::llama2c;
  else
    throw InputError("tokenizer: unsupported tokenizer model '" + printable(d.model) +
                     "' (supported: llama, gpt2, llama2c)");
  if (d.tokens.empty()) throw InputError("tokenizer: the vocabulary is empty");
  const std::size_t n = d.tokens.size();
  // run.c's byte fallback: byte b is token b + 3, so ids 3..258 must exist.
  if (t.kind_ == Kind::llama2c && n < 259)
    throw InputError("tokenizer: a llama2.c vocabulary holds the 256 byte tokens at ids 3..258; this one has " +
                     std::to_string(n) + " tokens");
  if (!d.scores.empty() && d.scores.size() != n)
    throw InputError("tokenizer: " + std::to_string(d.scores.size()) + " scores for " +
                     std::to_string(n) + " tokens");
  if (!d.types.empty() && d.types.size() != n)
    throw InputError("tokenizer: " + std::to_string(d.types.size()) + " token types for " +
                     std::to_string(n) + " tokens");
  if (t.kind_ == Kind::bpe && !unicode::pre_style_from_name(d.pre, t.pre_))
    throw InputError("tokenizer: unsupported pre-tokenizer '" + printable(d.pre) + "'");

  t.tokens_.resize(n);
  t.ids_.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    Token& tok = t.tokens_[i];
    tok.text = d.tokens[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : d.tokens[i];
    t.max_token_bytes_ = std::max(t.max_token_bytes_, tok.text.size());
    tok.score = d.scores.empty() ? 0.0f : d.scores[i];
    if (!d.types.empty()) {
      switch (d.types[i]) {
        case 1: tok.attr = normal; break;
        case 2: tok.attr = unknown; break;
        case 3: tok.attr = control; break;
        case 4: tok.attr = user_defined; break;
        case 5: tok.attr = unused; break;
        case 6: tok.attr = byte; break;
        default: tok.attr = 0; break;
      }
    } else if (t.kind_ == Kind::llama2c && parse_byte_token(tok.text) >= 0) {
      tok.attr = byte;
    }
    t.ids_[tok.text] = static_cast<int>(i);  // the last of duplicates wins, as in llama.cpp
  }

  auto check_id = [&](int id, const char* what) {
    if (id >= static_cast<int>(n))
      throw InputError(std::string("tokenizer: ") + what + " id " + std::to_string(id) +
                       " is out of range (vocabulary of " + std::to_string(n) + ")");
    return id;
  };
  t.bos_ = check_id(d.bos, "bos");
  t.eos_ = check_id(d.eos, "eos");
  t.unk_ = check_id(d.unk, "unk");
  if (t.kind_ == Kind::llama2c) {
    // run.c hard-codes BOS 1 and EOS 2; unk 0 is "<unk>".
    if (t.bos_ < 0) t.bos_ = 1;
    if (t.eos_ < 0) t.eos_ = 2;
    if (t.unk_ < 0) t.unk_ = 0;
    for (const int id : {t.bos_, t.eos_}) {
      if (id < static_cast<int>(n)) t.tokens_[id].attr = control;
    }
    if (t.unk_ < static_cast<int>(n)) t.tokens_[t.unk_].attr = unknown;
  }
  t.add_bos_ = d.add_bos;
  t.add_eos_ = d.add_eos;
  t.add_space_prefix_ = t.kind_ == Kind::spm && d.add_space_prefix;

  t.merge_by_rank_ = t.kind_ == Kind::spm && d.merge_by_rank;
  if (t.kind_ == Kind::bpe || t.merge_by_rank_) {
    t.ranks_.reserve(d.merges.size() * 2);
    for (std::size_t i = 0; i < d.merges.size(); ++i) {
      const std::string& m = d.merges[i];
      const std::size_t pos = m.find(' ', 1);
      if (pos == std::string::npos) continue;
      t.ranks_.emplace(std::make_pair(m.substr(0, pos), m.substr(pos + 1)), static_cast<int>(i));
    }
  }
  if (t.kind_ == Kind::bpe) {
    using P = unicode::PreStyle;
    t.ignore_merges_ = t.pre_ == P::llama3;
    t.clean_spaces_ = !(t.pre_ == P::llama3 || t.pre_ == P::qwen2 || t.pre_ == P::deepseek_llm ||
                        t.pre_ == P::deepseek_coder);
  }

  if (t.kind_ != Kind::llama2c) {
    for (std::size_t i = 0; i < n; ++i) {
      if (t.tokens_[i].attr & (control | user_defined | unknown)) t.special_.push_back(static_cast<int>(i));
    }
    std::stable_sort(t.special_.begin(), t.special_.end(), [&](int a, int b) {
      return t.tokens_[a].text.size() > t.tokens_[b].text.size();
    });
  }

  if (t.eos_ >= 0) t.eog_.push_back(t.eos_);
  for (const auto txt : kEogTexts) {
    const int id = t.find(txt);
    if (id >= 0 && std::find(t.eog_.begin(), t.eog_.end(), id) == t.eog_.end()) t.eog_.push_back(id);
  }

  t.pieces_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Token& tok = t.tokens_[i];
    std::string& p = t.pieces_[i];
    if (t.kind_ == Kind::llama2c) {
      const int b = parse_byte_token(tok.text);
      p = b >= 0 ? std::string(1, static_cast<char>(b)) : tok.text;
    } else if (tok.attr & (control | unknown | user_defined)) {
      p = tok.text;
    } else if (tok.attr & normal) {
      if (t.kind_ == Kind::spm) {
        p = unescape_spaces(tok.text);
      } else {
        // Map GPT-2's stand-in characters back to bytes; a character that is
        // not a stand-in is kept as it is.
        const unicode::Decoded dec = unicode::decode_utf8(tok.text);
        for (std::size_t k = 0; k < dec.cpts.size(); ++k) {
          const std::string_view ch(tok.text.data() + dec.offsets[k], dec.offsets[k + 1] - dec.offsets[k]);
          const int b = unicode::unicode_to_byte(ch);
          if (b >= 0) p += static_cast<char>(b); else p += ch;
        }
      }
    } else if ((tok.attr & byte) && t.kind_ == Kind::spm) {
      const int b = parse_byte_token(tok.text);
      if (b >= 0) p = std::string(1, static_cast<char>(b));
    }
  }
  return t;
}

int Tokenizer::find(std::string_view text) const {
  const auto it = ids_.find(std::string(text));
  return it == ids_.end() ? -1 : it->second;
}

int Tokenizer::byte_to_token(unsigned char b) const {
  if (kind_ == Kind::bpe) return find(unicode::byte_to_unicode(b));
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  int id = find(buf);
  if (id < 0) id = find(std::string(1, static_cast<char>(b)));
  return id;
}

bool Tokenizer::is_eog(int id) const noexcept {
  return id >= 0 && std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

bool Tokenizer::is_control(int id) const noexcept {
  return id >= 0 && id < n_vocab() && (tokens_[id].attr & control);
}

std::vector<int> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<int> ids = encode(text, true);
  if (ids.empty()) {
    if (bos_ < 0) throw InputError("the prompt is empty and the model's vocabulary has no BOS token to start from");
    ids.push_back(bos_);
  }
  return ids;
}

std::shared_ptr<const Tokenizer> tokenizer_of(const Model& model) {
  if (model.built_tokenizer) return model.built_tokenizer;
  return std::make_shared<const Tokenizer>(Tokenizer::from(model.tokenizer));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int> out;
  if (kind_ == Kind::llama2c) {
    if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
    encode_llama2c(text, out);
    if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
    return out;
  }

  // Split out special tokens (llama.cpp's tokenizer_st_partition): longest
  // first; control and unknown tokens only when parse_special.
  struct Fragment { int token; std::size_t off, len; };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  for (const int id : special_) {
    const Token& sp = tokens_[id];
    if (!parse_special && (sp.attr & (control | unknown))) continue;
    std::vector<Fragment> next;
    next.reserve(frags.size());
    for (const Fragment& f : frags) {
      if (f.token >= 0) { next.push_back(f); continue; }
      std::size_t pos = f.off;
      const std::size_t end = f.off + f.len;
      while (pos < end) {
        const std::size_t hit = text.substr(0, end).find(sp.text, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, pos, hit - pos});
        next.push_back({id, hit, 0});
        pos = hit + sp.text.size();
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    frags = std::move(next);
  }

  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  bool prev_special = true;  // SPM: a space prefix for the first text and after specials
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.off, f.len);
    if (kind_ == Kind::spm) {
      std::string s = (add_space_prefix_ && prev_special) ? " " : "";
      s += raw;
      encode_spm(escape_spaces(s), out);
    } else {
      encode_bpe(raw, out);
    }
    prev_special = false;
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

void Tokenizer::encode_spm(const std::string& text, std::vector<int>& out) const {
  std::vector<Symbol> sym;
  for (std::size_t off = 0; off < text.size();) {
    const std::size_t len = std::min(unicode::utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
    off += len;
  }
  if (sym.empty()) return;

  struct Bigram { int left, right; float score; std::size_t size; };
  // Highest score first; on a tie the leftmost pair.
  auto cmp = [](const Bigram& l, const Bigram& r) {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
  std::unordered_map<std::string, std::pair<int, int>> rev_merge;

  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string s = text.substr(sym[left].off, sym[left].n + sym[right].n);
    float score = 0;
    if (merge_by_rank_) {
      // HF BPE: the pair's rank decides (lowest first), not the token's score.
      const auto it = ranks_.find({text.substr(sym[left].off, sym[left].n), text.substr(sym[right].off, sym[right].n)});
      if (it == ranks_.end() || find(s) < 0) return;
      score = -static_cast<float>(it->second);
    } else {
      const int id = find(s);
      if (id < 0) return;
      score = tokens_[id].score;
    }
    queue.push({left, right, score, s.size()});
    rev_merge[std::move(s)] = {left, right};
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  // A symbol that is no token goes back to the pair it was merged from, and
  // down to bytes.
  auto resegment = [&](auto&& self, const Symbol& s) -> void {
    const std::string str = text.substr(s.off, s.n);
    const int id = find(str);
    if (id >= 0) { out.push_back(id); return; }
    const auto p = rev_merge.find(str);
    if (p == rev_merge.end()) {
      if (merge_by_rank_) {
        // HF's BPE: the bytes when every one has a <0xXX> token, else one
        // unknown token, fused with an unknown just before it (fuse_unk).
        std::vector<int> bytes;
        for (const char c : str) {
          const int bid = byte_to_token(static_cast<unsigned char>(c));
          if (bid < 0) { bytes.clear(); break; }
          bytes.push_back(bid);
        }
        if (!bytes.empty()) out.insert(out.end(), bytes.begin(), bytes.end());
        else if (out.empty() || out.back() != unk_) out.push_back(unk_);
        return;
      }
      for (const char c : str) {
        const int bid = byte_to_token(static_cast<unsigned char>(c));
        out.push_back(bid >= 0 ? bid : unk_);
      }
      return;
    }
    self(self, sym[p->second.first]);
    self(self, sym[p->second.second]);
  };
  for (int i = 0; i != -1; i = sym[i].next) resegment(resegment, sym[i]);
}

void Tokenizer::encode_bpe(std::string_view text, std::vector<int>& out) const {
  struct Bigram { int left, right; std::string text; int rank; };
  // Lowest rank first; on a tie the leftmost pair.
  auto cmp = [](const Bigram& l, const Bigram& r) {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  };
  for (const std::string_view raw : unicode::pre_tokenize(text, pre_)) {
    std::string word;
    word.reserve(raw.size() * 2);
    for (const char c : raw) word += unicode::byte_to_unicode(static_cast<unsigned char>(c));

    std::vector<Symbol> sym;
    if (ignore_merges_ && find(word) >= 0) {
      sym.push_back({-1, -1, 0, word.size()});
    } else {
      for (std::size_t off = 0; off < word.size();) {
        const std::size_t len = std::min(unicode::utf8_len(static_cast<unsigned char>(word[off])), word.size() - off);
        const int idx = static_cast<int>(sym.size());
        sym.push_back({idx - 1, off + len == word.size() ? -1 : idx + 1, off, len});
        off += len;
      }
    }

    std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
    auto add = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      std::string a = word.substr(sym[left].off, sym[left].n);
      std::string b = word.substr(sym[right].off, sym[right].n);
      const auto it = ranks_.find({a, b});
      if (it == ranks_.end()) return;
      queue.push({left, right, a + b, it->second});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) add(i - 1, i);

    while (!queue.empty()) {
      const Bigram bg = queue.top();
      queue.pop();
      Symbol& l = sym[bg.left];
      Symbol& r = sym[bg.right];
      if (l.n == 0 || r.n == 0) continue;
      if (word.compare(l.off, l.n + r.n, bg.text) != 0 || l.off + l.n != r.off) continue;  // outdated
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = bg.left;
      add(l.prev, bg.left);
      add(bg.left, l.next);
    }

    for (const Symbol& s : sym) {
      if (s.n == 0) continue;
      const std::string str = word.substr(s.off, s.n);
      const int id = find(str);
      if (id >= 0) { out.push_back(id); continue; }
      // No token for the piece: its single bytes, where they are tokens
      // (llama.cpp does the same).
      for (const char c : str) {
        const int bid = find(std::string(1, c));
        if (bid >= 0) out.push_back(bid);
      }
    }
  }
}

void Tokenizer::encode_llama2c(std::string_view text, std::vector<int>& out) const {
  // run.c encode(): the dummy prefix, one token per code point (or its
  // bytes + 3), then merge the best-scoring adjacent pair until none is left.
  const std::size_t first = out.size();
  if (!text.empty()) {
    const int sp = find(" ");
    if (sp >= 0) out.push_back(sp);
  }
  std::string buf;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) buf.clear();
    buf += static_cast<char>(c);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((next & 0xC0) == 0x80 && buf.size() < 4) continue;
    const int id = find(buf);
    if (id >= 0) {
      out.push_back(id);
    } else {
      for (const char b : buf) {
        const int id = static_cast<unsigned char>(b) + 3;  // run.c's byte tokens (from() checked they exist)
        out.push_back(id < static_cast<int>(tokens_.size()) ? id : std::max(unk_, 0));
      }
    }
    buf.clear();
  }

  // run.c scans for the best pair on every merge (quadratic); a heap with
  // stale entries skipped picks the same pair: highest score, leftmost on a
  // tie (a merged token keeps its left position, so order is kept).
  const std::size_t n = out.size() - first;
  if (n < 2) return;
  std::vector<int> tok(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  std::vector<int> prev(n), next(n);
  std::vector<std::uint32_t> version(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int>(i) + 1 : -1;
  }
  struct Cand { float score; int left, right, id; std::uint32_t vl, vr; };
  auto cmp = [](const Cand& a, const Cand& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(cmp)> heap(cmp);
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const int id = find(tokens_[tok[l]].text + tokens_[tok[r]].text);
    if (id < 0 || !(tokens_[id].score > -1e10f)) return;
    heap.push({tokens_[id].score, l, r, id, version[l], version[r]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(static_cast<int>(i), static_cast<int>(i) + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (tok[c.left] < 0 || tok[c.right] < 0 || next[c.left] != c.right || version[c.left] != c.vl ||
        version[c.right] != c.vr)
      continue;
    tok[c.left] = c.id;
    ++version[c.left];
    tok[c.right] = -1;
    ++version[c.right];
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    push(prev[c.left], c.left);
    push(c.left, next[c.left]);
  }
  out.resize(first);
  for (int i = 0; i >= 0; i = next[i]) out.push_back(tok[i]);
}

std::string Tokenizer::token_to_piece(int id, bool special) const {
  if (id < 0 || id >= n_vocab()) return {};
  if (!special && (tokens_[id].attr & (control | unknown))) return {};
  return pieces_[id];
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool remove_special, bool unparse_special,
                              bool clean_spaces) const {
  std::string out;
  if (kind_ == Kind::llama2c) {
    // run.c decode(): a piece right after BOS loses its leading space.
    int prev = -1;
    for (const int id : ids) {
      std::string p = token_to_piece(id, unparse_special);
      // run.c tests the vocabulary's string, not the piece: a byte token
      // <0x20> after BOS keeps its space.
      const bool text_space = id >= 0 && id < static_cast<int>(tokens_.size()) && !tokens_[static_cast<std::size_t>(id)].text.empty() &&
                              tokens_[static_cast<std::size_t>(id)].text[0] == ' ';
      if (prev == bos_ && bos_ >= 0 && text_space && !p.empty() && p[0] == ' ') p.erase(0, 1);
      out += p;
      prev = id;
    }
    return out;
  }

  std::size_t begin = 0, end = ids.size();
  bool remove_space = add_space_prefix_;
  if (remove_special && add_bos_ && end > 0 && ids[0] == bos_) {
    remove_space = false;
    ++begin;
  }
  if (remove_special && add_eos_ && end > begin && ids[end - 1] == eos_) --end;
  for (std::size_t i = begin; i < end; ++i) {
    std::string p = token_to_piece(ids[i], unparse_special);
    if (remove_space && !p.empty() && p[0] == ' ') p.erase(0, 1);
    remove_space = false;
    out += p;
  }

  if (clean_spaces && clean_spaces_ && !out.empty()) {
    // HF's clean_up_tokenization_spaces, as llama.cpp applies it.
    std::string a;
    a += out[0];
    for (std::size_t i = 1; i < out.size(); ++i) {
      const char x = out[i];
      if (out[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
      a += x;
    }
    std::string b;
    b += a[0];
    for (std::size_t i = 1; i < a.size(); ++i) {
      const char x = a[i];
      if (x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {  // " ' "
        b.pop_back();
        b += x;
        ++i;  // drop the next space
        continue;
      }
      b += x;
    }
    std::string c;
    c += b[0];
    for (std::size_t i = 1; i < b.size(); ++i) {
      const char x = b[i];
      if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
        const char x1 = b[i + 1];
        const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
        if (x1 == 's' || x1 == 'm' || (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) c.pop_back();
      }
      c += x;
    }
    out = std::move(c);
  }
  return out;
}

}  // namespace ftp::model
