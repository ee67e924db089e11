// SPDX-License-Identifier: Apache-2.0
// Hugging Face tokenizer.json against llama.cpp's tokenizer test vectors and
// the TinyStories-656K folder:
//  * the byte-level BPE vocabularies of models/llama.cpp-vocab whose
//    pre-tokenizer is GPT-2's (gpt-2, mpt) written as the tokenizer.json
//    Hugging Face ships for them (ByteLevel with its regex, the merges, the
//    control tokens as added tokens), read back through tokenizer_json: every
//    .out case, as the GGUF gives them;
//  * the known Split regexes (Llama 3, Qwen2) map to their GGUF styles, an
//    unknown one is refused, named;
//  * TinyStories' own tokenizer.json (BPE with byte fallback): the four
//    prompts of its goldens as an independent Python BPE (merge by rank, the
//    algorithm of HF's tokenizers) computed them, and as the GGUF does.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/json.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "model/tokenizer_json.hpp"
#include "test_data.hpp"
#include "vocab_cases.hpp"

namespace fs = std::filesystem;
using ftp::json::Json;
using ftp::model::Tokenizer;
using ftp::model::TokenizerData;

namespace {

using Case = ftp::test::VocabCase;

std::vector<Case> read_cases(const std::string& gguf) { return ftp::test::read_vocab_cases(gguf).cases; }

/// The tokenizer.json of a byte-level BPE GGUF vocabulary, with `pre` as
/// its pre_tokenizer.
Json tokenizer_json_of(const TokenizerData& d, const Json& pre) {
  Json vocab = Json::object(), added = Json::array();
  for (std::size_t i = 0; i < d.tokens.size(); ++i) {
    vocab[d.tokens[i]] = i;
    const int type = d.types.empty() ? 1 : d.types[i];
    if (type == 3 || type == 4)
      added.push_back({{"id", i}, {"content", d.tokens[i]}, {"special", type == 3}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", d.merges}}}};
}

const Json kGpt2Pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};

Json split_pre(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
}

std::string vocab(const std::string& f) { return ftp::test::data_dir() + "/models/llama.cpp-vocab/" + f; }
std::string tiny(const std::string& f) { return ftp::test::data_dir() + "/models/tinystories-656k/" + f; }

}  // namespace

TEST(TokenizerJson, Gpt2StyleVocabsPassLlamaCppVectors) {
  int seen = 0;
  for (const char* name : {"gpt-2", "mpt"}) {
    const std::string p = vocab(std::string("ggml-vocab-") + name + ".gguf");
    if (!fs::exists(p)) continue;
    ++seen;
    const TokenizerData gg = ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open(p));
    const TokenizerData hf = ftp::model::tokenizer_from_hf_json(tokenizer_json_of(gg, kGpt2Pre), "t.json", nullptr, "");
    EXPECT_EQ(hf.model, "gpt2");
    EXPECT_EQ(hf.pre, "gpt2");
    EXPECT_EQ(hf.tokens, gg.tokens) << name;
    const Tokenizer tok = Tokenizer::from(hf);
    const std::vector<Case> cases = read_cases(p);
    ASSERT_EQ(cases.size(), 46u) << name;  // as test_tokenizer.cpp reads them
    int pass = 0;
    for (const Case& c : cases) {
      const std::vector<int> ids = tok.encode(c.input, false, false);
      pass += ids == c.expected;
      EXPECT_EQ(ids, c.expected) << name << ": '" << c.input << "'";
    }
    std::printf("tokenizer.json of %s: %d/%zu\n", name, pass, cases.size());
  }
  if (seen == 0) GTEST_SKIP() << "test data absent: " << vocab("") << " (set FTP_TEST_DATA)";
}

TEST(TokenizerJson, KnownRegexesAndRefusals) {
  const std::string p = vocab("ggml-vocab-gpt-2.gguf");
  if (!fs::exists(p)) GTEST_SKIP() << "test data absent: " << p;
  const TokenizerData gg = ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open(p));
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(ftp::model::tokenizer_from_hf_json(tokenizer_json_of(gg, split_pre(llama3)), "t", nullptr, "").pre, "llama3");
  EXPECT_EQ(ftp::model::tokenizer_from_hf_json(tokenizer_json_of(gg, split_pre(qwen2)), "t", nullptr, "").pre, "qwen2");
  try {
    ftp::model::tokenizer_from_hf_json(tokenizer_json_of(gg, split_pre("\\p{L}+")), "t.json", nullptr, "");
    ADD_FAILURE() << "an unknown regex was accepted";
  } catch (const ftp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: pre_tokenizer.pretokenizers[0].pattern: unsupported pre-tokenizer regex"),
              std::string::npos)
        << e.what();
  }
  Json wp = tokenizer_json_of(gg, kGpt2Pre);
  wp["model"]["type"] = "WordPiece";
  try {
    ftp::model::tokenizer_from_hf_json(wp, "t.json", nullptr, "");
    ADD_FAILURE() << "WordPiece was accepted";
  } catch (const ftp::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "t.json: model.type: unsupported tokenizer model 'WordPiece' (supported: BPE)");
  }
  // tokenizer_config.json: special tokens by text, the chat template.
  const Json cfg = {{"bos_token", "<|endoftext|>"},
                    {"eos_token", {{"content", "<|endoftext|>"}, {"special", true}}},
                    {"add_bos_token", true},
                    {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}};
  const TokenizerData t = ftp::model::tokenizer_from_hf_json(tokenizer_json_of(gg, kGpt2Pre), "t", &cfg, "c.json");
  EXPECT_EQ(t.bos, 50256);
  EXPECT_EQ(t.eos, 50256);
  EXPECT_TRUE(t.add_bos);
  EXPECT_EQ(t.chat_template, "{% for m in messages %}{{ m.content }}{% endfor %}");
  Json bad = cfg;
  bad["eos_token"] = "<nope>";
  try {
    ftp::model::tokenizer_from_hf_json(tokenizer_json_of(gg, kGpt2Pre), "t", &bad, "c.json");
    ADD_FAILURE() << "an unknown eos_token was accepted";
  } catch (const ftp::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "c.json: eos_token: token '<nope>' is not in the vocabulary");
  }
}

TEST(TokenizerJson, TinyStoriesPrompts) {
  if (!fs::exists(tiny("hf/tokenizer.json"))) GTEST_SKIP() << "test data absent: " << tiny("hf/tokenizer.json");
  const TokenizerData hf = ftp::model::read_hf_tokenizer(tiny("hf"));
  EXPECT_EQ(hf.model, "llama");
  EXPECT_TRUE(hf.merge_by_rank);
  EXPECT_EQ(hf.bos, 1);
  EXPECT_EQ(hf.eos, 2);
  EXPECT_EQ(hf.unk, 0);
  EXPECT_TRUE(hf.add_bos);
  EXPECT_EQ(hf.tokens.size(), 2048u);
  const Tokenizer tok = Tokenizer::from(hf);
  // Expected ids from an independent Python implementation of HF's BPE
  // (the tokenizer.json's merges applied lowest rank first to "▁" + the
  // text with spaces as "▁", byte fallback for pieces outside the vocab),
  // after BOS 1.
  const std::vector<std::pair<std::string, std::vector<int>>> want = {
      {"Once upon a time", {1, 80, 147, 201, 282, 57}},
      {"The little dog", {1, 80, 247, 229, 604}},
      {"Lily and Tom", {1, 80, 669, 380}},
      {"One day, a big bear", {1, 80, 429, 202, 1316}},
  };
  for (const auto& [text, ids] : want) EXPECT_EQ(tok.encode(text, true), ids) << "\"" << text << "\"";
  // byte_fallback with no <0xXX> tokens in this vocabulary: a character
  // outside it is <unk> (0), and a run of them one <unk> (fuse_unk), as
  // HF's BPE does.
  EXPECT_EQ(tok.encode("\xC3\xA9", false), (std::vector<int>{80, 0}));          // "é"
  EXPECT_EQ(tok.encode("\xC3\xA9\xC3\xA9", false), (std::vector<int>{80, 0}));  // "éé"
}
