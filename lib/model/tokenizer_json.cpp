// SPDX-License-Identifier: Apache-2.0
#include "model/tokenizer_json.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include "core/error.hpp"
#include "core/escape.hpp"

namespace ftp::model {

namespace {

using json::Json;
using json::Node;

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

// The Split regexes of the byte-level BPE families we read, as their
// tokenizer.json files spell them, and GGUF's name for each.
struct KnownRegex {
  std::string_view regex;
  const char* pre;
};
constexpr KnownRegex kRegexes[] = {
    // Llama 3 (and 3.1, 3.2)
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama3"},
    // Qwen2, Qwen2.5, Qwen3: as Llama 3's with single digits
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
    // GPT-2's own regex written out as a Split
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt2"},
};

std::string token_content(const Node& n) {
  if (n.value().is_string()) return n.str();
  return n.str("content");  // {"content": "<s>", ...} (AddedToken)
}

/// The pre-tokenizer style of a byte-level BPE, or "" when the file is not
/// byte-level. Refuses what it does not know, named.
std::string byte_level_pre(const Node& model_root) {
  const auto pt = model_root.find("pre_tokenizer");
  if (!pt) return "";
  std::vector<Node> parts;
  if (pt->str("type") == "Sequence") {
    for (const Node& p : pt->at("pretokenizers").items()) parts.push_back(p);
  } else {
    parts.push_back(*pt);
  }
  std::string pre;
  bool byte_level = false;
  for (const Node& p : parts) {
    const std::string type = p.str("type");
    if (type == "ByteLevel") {
      byte_level = true;
      if (p.boolean_or("add_prefix_space", false)) p.at("add_prefix_space").fail("true is not supported");
      if (p.boolean_or("use_regex", true)) {
        if (!pre.empty() && pre != "gpt2") p.at("use_regex").fail("a second regex after a Split is not supported");
        pre = "gpt2";
      }
    } else if (type == "Split") {
      const Node pat = p.at("pattern");
      const std::string rx = pat.has("Regex") ? pat.str("Regex") : "";
      const KnownRegex* hit = nullptr;
      for (const KnownRegex& k : kRegexes)
        if (rx == k.regex) hit = &k;
      if (!hit) pat.fail("unsupported pre-tokenizer regex '" + printable(rx, 80) + "' (known: Llama 3, Qwen2, GPT-2)");
      if (!pre.empty()) p.fail("more than one regex is not supported");
      pre = hit->pre;
    } else {
      p.at("type").fail("unsupported pre-tokenizer '" + printable(type) + "' (supported: ByteLevel, Split)");
    }
  }
  if (!byte_level) pt->fail("a pre-tokenizer without ByteLevel is not supported");
  return pre.empty() ? "gpt2" : pre;
}

/// True when the normalizer is SentencePiece's (" " as "▁"); sets `prefix`
/// when it also prepends "▁".
bool spm_normalizer(const Node& root, bool& prefix) {
  prefix = false;
  const auto nz = root.find("normalizer");
  if (!nz) return false;
  std::vector<Node> parts;
  if (nz->str("type") == "Sequence") {
    for (const Node& p : nz->at("normalizers").items()) parts.push_back(p);
  } else {
    parts.push_back(*nz);
  }
  bool replace = false;
  for (const Node& p : parts) {
    const std::string type = p.str("type");
    if (type == "Prepend" && p.str("prepend") == kSpace) {
      prefix = true;
    } else if (type == "Replace" && p.at("pattern").str_or("String", "") == " " && p.str("content") == kSpace) {
      replace = true;
    } else {
      p.at("type").fail("unsupported normalizer '" + printable(type) + "' (supported: Prepend \"▁\", Replace \" \" by \"▁\")");
    }
  }
  return replace;
}

/// Whether the post-processor puts a special token first ("single": [{SpecialToken}, {Sequence A}]).
bool post_adds_bos(const Node& root) {
  const auto pp = root.find("post_processor");
  if (!pp) return false;
  std::vector<Node> parts;
  if (pp->str("type") == "Sequence") {
    for (const Node& p : pp->at("processors").items()) parts.push_back(p);
  } else {
    parts.push_back(*pp);
  }
  for (const Node& p : parts) {
    if (p.str("type") != "TemplateProcessing") continue;
    const auto single = p.at("single").items();
    return !single.empty() && single[0].has("SpecialToken");
  }
  return false;
}

TokenizerData parse(const Node& root, int n_vocab) {
  root.expect_object();
  const Node model = root.at("model");
  const std::string type = model.str("type");
  if (type != "BPE") model.at("type").fail("unsupported tokenizer model '" + printable(type) + "' (supported: BPE)");
  TokenizerData t;
  bool prefix = false;
  const std::string pre = byte_level_pre(root);
  if (!pre.empty()) {
    t.model = "gpt2";
    t.pre = pre;
    t.add_space_prefix = false;
  } else if (spm_normalizer(root, prefix)) {
    if (!model.boolean_or("byte_fallback", false))
      model.fail("a SentencePiece-style BPE without byte_fallback is not supported");
    t.model = "llama";
    t.pre = "default";
    t.add_space_prefix = prefix;
    t.merge_by_rank = true;
  } else {
    root.fail("neither a byte-level BPE (ByteLevel pre-tokenizer) nor a SentencePiece-style BPE "
              "(normalizer replacing \" \" by \"▁\")");
  }

  // Vocabulary: model.vocab, then added_tokens (ids may lie past it).
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  auto put = [&](const Node& where, std::int64_t id, std::string text, std::int32_t ty) {
    if (id < 0 || id >= (1 << 24)) where.fail("token id " + std::to_string(id) + " out of range");
    const auto i = static_cast<std::size_t>(id);
    if (i >= tokens.size()) {
      tokens.resize(i + 1);
      types.resize(i + 1, 0);
    }
    tokens[i] = std::move(text);
    types[i] = ty;
  };
  const Node vocab = model.at("vocab");
  vocab.expect_object();
  for (const auto& [k, v] : vocab.value().items()) {
    const Node n(v, vocab.child_path(k));
    std::int32_t ty = 1;
    if (t.model == "llama" && k.size() == 6 && k.rfind("<0x", 0) == 0 && k[5] == '>') ty = 6;
    put(n, n.integer(), k, ty);
  }
  if (const auto added = root.find("added_tokens")) {
    for (const Node& a : added->items()) {
      const std::string content = a.str("content");
      const int id = static_cast<int>(a.integer("id"));
      put(a, id, content, a.boolean_or("special", false) ? 3 : 4);
    }
  }
  if (const auto unk = model.find("unk_token")) {
    const std::string u = unk->str();
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == u) {
        // An added special token stays control, as llama.cpp's converter has it.
        if (types[i] == 1) types[i] = 2;
        t.unk = static_cast<int>(i);
      }
  }
  if (n_vocab > 0 && tokens.size() > static_cast<std::size_t>(n_vocab))
    root.fail(std::to_string(tokens.size()) + " tokens, more than config.json's vocab_size " + std::to_string(n_vocab));
  if (n_vocab > 0) {
    tokens.resize(static_cast<std::size_t>(n_vocab));
    types.resize(static_cast<std::size_t>(n_vocab), 0);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 0) {  // a hole: llama.cpp's converter writes [PAD<id>], unused
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = 5;
    }
  t.tokens = std::move(tokens);
  t.types = std::move(types);
  for (const auto& s : t.tokens) t.max_token_length = std::max(t.max_token_length, static_cast<int>(s.size()));

  if (const auto merges = model.find("merges")) {
    for (const Node& m : merges->items()) {
      if (m.value().is_string()) {
        t.merges.push_back(m.str());
      } else {
        const auto pair = m.items();
        if (pair.size() != 2) m.fail("expected \"a b\" or [a, b]");
        t.merges.push_back(pair[0].str() + " " + pair[1].str());
      }
    }
  }

  t.add_bos = post_adds_bos(root);
  return t;
}

/// tokenizer_config.json: special tokens by text, add_bos/eos, the chat template.
void apply_config(TokenizerData& t, const Node& cfg) {
  cfg.expect_object();
  auto id_of = [&](const char* key) -> int {
    const auto n = cfg.find(key);
    if (!n) return -1;
    const std::string text = token_content(*n);
    for (std::size_t i = 0; i < t.tokens.size(); ++i)
      if (t.tokens[i] == text) return static_cast<int>(i);
    n->fail("token '" + printable(text) + "' is not in the vocabulary");
  };
  if (const int v = id_of("bos_token"); v >= 0) t.bos = v;
  if (const int v = id_of("eos_token"); v >= 0) t.eos = v;
  if (const int v = id_of("pad_token"); v >= 0) t.pad = v;
  if (const int v = id_of("unk_token"); v >= 0) t.unk = v;
  t.add_bos = cfg.boolean_or("add_bos_token", t.add_bos);
  t.add_eos = cfg.boolean_or("add_eos_token", t.add_eos);
  if (const auto ct = cfg.find("chat_template")) {
    if (ct->value().is_string()) {
      t.chat_template = ct->str();
    } else {
      // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
      for (const Node& e : ct->items())
        if (e.str_or("name", "") == "default") t.chat_template = e.str("template");
      if (t.chat_template.empty()) ct->fail("no template named \"default\"");
    }
  }
}

}  // namespace

TokenizerData tokenizer_from_hf_json(const Json& tok, const std::string& tok_path, const Json* cfg,
                                     const std::string& cfg_path, int n_vocab) {
  TokenizerData t;
  try {
    t = parse(Node(tok, ""), n_vocab);
  } catch (const InputError& e) {
    throw InputError(tok_path + ": " + e.what());
  }
  if (cfg) {
    try {
      apply_config(t, Node(*cfg, ""));
    } catch (const InputError& e) {
      throw InputError(cfg_path + ": " + e.what());
    }
  }
  return t;
}

namespace {

json::Json read_json(const std::string& path) {
  try {
    return json::parse(json::read_text(path), path);
  } catch (const InputError& e) {
    const std::string what = e.what();
    throw InputError(what.rfind(path, 0) == 0 ? what : path + ": " + what);
  }
}

}  // namespace

TokenizerData read_hf_tokenizer(const std::string& dir, int n_vocab) {
  namespace fs = std::filesystem;
  const std::string tok_path = (fs::path(dir) / "tokenizer.json").string();
  const std::string cfg_path = (fs::path(dir) / "tokenizer_config.json").string();
  if (!fs::exists(tok_path)) throw InputError(tok_path + ": missing (a Hugging Face folder needs its tokenizer.json)");
  const json::Json tok = read_json(tok_path);
  std::optional<json::Json> cfg;
  if (fs::exists(cfg_path)) cfg = read_json(cfg_path);
  TokenizerData t = tokenizer_from_hf_json(tok, tok_path, cfg ? &*cfg : nullptr, cfg_path, n_vocab);
  const std::string jinja = (fs::path(dir) / "chat_template.jinja").string();
  if (t.chat_template.empty() && fs::exists(jinja)) t.chat_template = json::read_text(jinja);
  return t;
}

}  // namespace ftp::model
