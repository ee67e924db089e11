// SPDX-License-Identifier: Apache-2.0
// Tokenizers against real data: llama.cpp's tokenizer test vectors
// (models/llama.cpp-vocab: a vocab-only GGUF, its .inp test strings and .out
// expected ids, as tests/test-tokenizer-0 uses them) and llama2.c's golden
// text for stories260K (tok512.bin).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/llama2c.hpp"
#include "model/tokenizer.hpp"
#include "model/unicode.hpp"
#include "test_data.hpp"
#include "vocab_cases.hpp"

namespace fs = std::filesystem;
using ftp::model::Tokenizer;
using ftp::model::TokenizerData;

namespace {

fs::path data_dir() { return ftp::test::data_dir(); }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<int> parse_ids(const std::string& line) {
  std::vector<int> ids;
  std::istringstream in(line);
  int v;
  while (in >> v) ids.push_back(v);
  return ids;
}

using Case = ftp::test::VocabCase;

std::vector<Case> read_cases(const fs::path& gguf) {
  const ftp::test::VocabCases r = ftp::test::read_vocab_cases(gguf.string());
  EXPECT_EQ(r.inputs, r.lines) << gguf;
  return r.cases;
}

std::string show(const std::vector<int>& ids) {
  std::string s;
  for (const int id : ids) { s += ' '; s += std::to_string(id); }
  return s;
}

#define NEED_DATA(path)                                                                   \
  if (data_dir().empty() || !fs::exists(path)) {                                         \
    GTEST_SKIP() << "test data not found: " << (path)                                    \
                 << " (set FTP_TEST_DATA to the shared/data folder)";                    \
  }

}  // namespace

// Every vocab with test vectors: the pass rate is printed for each; llama-spm,
// phi-3 and gpt-2 must pass every case.
TEST(Tokenizer, LlamaCppVocabs) {
  const fs::path dir = data_dir() / "models" / "llama.cpp-vocab";
  NEED_DATA(dir);
  std::vector<fs::path> vocabs;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ggml-vocab-", 0) == 0 && e.path().extension() == ".gguf" &&
        fs::exists(e.path().string() + ".inp") && fs::exists(e.path().string() + ".out"))
      vocabs.push_back(e.path());
  }
  std::sort(vocabs.begin(), vocabs.end());
  ASSERT_FALSE(vocabs.empty());
  const std::vector<std::string> required = {"llama-spm", "phi-3", "gpt-2"};
  int n_required_seen = 0;

  for (const fs::path& p : vocabs) {
    std::string name = p.stem().string().substr(std::string("ggml-vocab-").size());
    const TokenizerData td = ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open(p.string()));
    const bool must_pass = std::find(required.begin(), required.end(), name) != required.end();
    n_required_seen += must_pass;
    Tokenizer tok;
    try {
      tok = Tokenizer::from(td);
    } catch (const ftp::Error& e) {
      std::printf("vocab %s: unsupported (%s)\n", name.c_str(), e.what());
      EXPECT_FALSE(must_pass) << e.what();
      continue;
    }
    const std::vector<Case> cases = read_cases(p);
    int pass = 0, round_trip = 0;
    for (const Case& c : cases) {
      // test-tokenizer-0: add_special = false, parse_special = false.
      const std::vector<int> ids = tok.encode(c.input, false, false);
      if (ids == c.expected) {
        ++pass;
      } else if (must_pass) {
        ADD_FAILURE() << name << ": '" << c.input << "'\n  expected" << show(c.expected)
                      << "\n  got     " << show(ids);
      }
      // Detokenizing the expected ids gives the input back: for SPM through
      // the leading-space rule of decode(); for BPE piece by piece.
      std::string text;
      if (tok.kind() == Tokenizer::Kind::spm) {
        text = tok.decode(c.expected);
      } else {
        for (const int id : c.expected) text += tok.token_to_piece(id);
      }
      round_trip += text == c.input;
      if (must_pass) {
        EXPECT_EQ(text, c.input) << name << ": decode of the expected ids";
      }
    }
    const int n = static_cast<int>(cases.size());
    std::printf("vocab %s: %d/%d (%.1f %%), detokenize %d/%d\n", name.c_str(), pass, n,
                n ? 100.0 * pass / n : 0.0, round_trip, n);
    std::fflush(stdout);
    if (must_pass) {
      EXPECT_EQ(pass, n) << name;
    }
  }
  EXPECT_EQ(n_required_seen, 3) << "llama-spm, phi-3 and gpt-2 vocabs must be present";
}

TEST(Tokenizer, SpmSpecialsAndBos) {
  const fs::path p = data_dir() / "models" / "llama.cpp-vocab" / "ggml-vocab-llama-spm.gguf";
  NEED_DATA(p);
  const Tokenizer tok = Tokenizer::from(ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open(p.string())));
  EXPECT_EQ(tok.n_vocab(), 32000);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.is_eog(2));
  EXPECT_FALSE(tok.is_eog(1));
  const std::vector<int> plain = tok.encode("Hello world", false);
  std::vector<int> with_bos = tok.encode("Hello world", true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int>(with_bos.begin() + 1, with_bos.end()), plain);
  // "<s>" is text unless parse_special; then it is BOS, and the text after
  // it gets a space prefix again.
  EXPECT_NE(tok.encode("<s>Hi", false, false)[0], 1);
  const std::vector<int> sp = tok.encode("<s>Hi", false, true);
  ASSERT_FALSE(sp.empty());
  EXPECT_EQ(sp[0], 1);
  EXPECT_EQ(std::vector<int>(sp.begin() + 1, sp.end()), tok.encode("Hi", false));
  // llama.cpp's detokenize: BOS renders empty and keeps the space after it,
  // unless asked to render specials.
  EXPECT_EQ(tok.decode(plain), "Hello world");
  EXPECT_EQ(tok.decode(with_bos), " Hello world");
  EXPECT_EQ(tok.decode(with_bos, false, true), "<s> Hello world");
  // Byte fallback: a character outside the vocabulary as <0xXX> tokens.
  const std::vector<int> emoji = tok.encode("\xF0\x9F\xA6\x99", false);  // U+1F999
  EXPECT_EQ(tok.decode(emoji), "\xF0\x9F\xA6\x99");
}

TEST(Tokenizer, Gpt2SpecialAndPieces) {
  const fs::path p = data_dir() / "models" / "llama.cpp-vocab" / "ggml-vocab-gpt-2.gguf";
  NEED_DATA(p);
  const Tokenizer tok = Tokenizer::from(ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open(p.string())));
  EXPECT_EQ(tok.kind(), Tokenizer::Kind::bpe);
  EXPECT_EQ(tok.n_vocab(), 50257);
  EXPECT_EQ(tok.encode("Hello world", false), (std::vector<int>{15496, 995}));
  const int eot = 50256;  // <|endoftext|>
  EXPECT_TRUE(tok.is_eog(eot));
  EXPECT_EQ(tok.encode("a<|endoftext|>b", false, true), (std::vector<int>{64, eot, 65}));
  EXPECT_NE(tok.encode("a<|endoftext|>b", false, false)[1], eot);
  EXPECT_EQ(tok.token_to_piece(995), " world");
  EXPECT_EQ(tok.token_to_piece(eot), "");
  EXPECT_EQ(tok.token_to_piece(eot, true), "<|endoftext|>");
}

// llama2.c: the ids behind golden_greedy_t0_steps256.txt decode to it byte for
// byte (after BOS, run.c's rules), and encoding the text gives them back.
TEST(Tokenizer, Llama2cGolden) {
  const fs::path dir = data_dir() / "models" / "stories260K";
  NEED_DATA(dir / "tok512.bin");
  const Tokenizer tok = Tokenizer::from(ftp::model::load_llama2c_tokenizer((dir / "tok512.bin").string(), 512));
  EXPECT_EQ(tok.kind(), Tokenizer::Kind::llama2c);
  EXPECT_EQ(tok.n_vocab(), 512);
  EXPECT_EQ(tok.bos(), 1);

  std::string ids_txt = read_file(dir / "golden_greedy_t0_steps256_token_ids.txt");
  // The first line is a comment.
  if (!ids_txt.empty() && ids_txt[0] == '#') ids_txt = ids_txt.substr(ids_txt.find('\n') + 1);
  const std::vector<int> gen = parse_ids(ids_txt);
  ASSERT_EQ(gen.size(), 256u);
  const std::string golden = read_file(dir / "golden_greedy_t0_steps256.txt");
  std::vector<int> ids = {1};
  ids.insert(ids.end(), gen.begin(), gen.end());
  EXPECT_EQ(tok.decode(ids), golden);

  // run.c's prompt "Zoo": [BOS, " ", "Z", "oo"].
  EXPECT_EQ(tok.encode("Zoo", true), (std::vector<int>{1, 410, 469, 347}));
  EXPECT_EQ(tok.encode("", true), (std::vector<int>{1}));
  EXPECT_EQ(tok.decode(tok.encode(golden, true)), golden);
  // Byte fallback: "世" is not a token of tok512; its bytes are (+3).
  const std::vector<int> e = tok.encode("\xE4\xB8\x96", false);
  EXPECT_EQ(e, (std::vector<int>{410, 0xE4 + 3, 0xB8 + 3, 0x96 + 3}));
  EXPECT_EQ(tok.decode(e), " \xE4\xB8\x96");
  // run.c drops a leading space after BOS only from a piece whose vocabulary
  // string starts with one: the byte token <0x20> (id 35) keeps it.
  EXPECT_EQ(tok.decode({1, 35}), " ");
  EXPECT_EQ(tok.decode({1, 35, 35}), "  ");
  EXPECT_EQ(tok.decode({1, 410}), "");  // " " itself (id 410) does lose it
}

// run.c's encode(), literally (quadratic), as a reference for the heap-based
// merge loop of the llama2c tokenizer.
std::vector<int> runc_encode(const Tokenizer& t, const std::vector<float>& scores, const std::string& text) {
  std::map<std::string, int> vocab;
  for (int i = 0; i < t.n_vocab(); ++i) vocab.emplace(t.token_text(i), i);
  auto lookup = [&](const std::string& s) { auto it = vocab.find(s); return it == vocab.end() ? -1 : it->second; };
  std::vector<int> tokens;
  if (!text.empty()) tokens.push_back(lookup(" "));
  std::string buf;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) buf.clear();
    buf += text[i];
    const auto nx = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((nx & 0xC0) == 0x80 && buf.size() < 4) continue;
    const int id = lookup(buf);
    if (id >= 0) tokens.push_back(id);
    else for (const char b : buf) tokens.push_back(static_cast<unsigned char>(b) + 3);
    buf.clear();
  }
  while (true) {
    float best = -1e10f;
    int best_id = -1, best_i = -1;
    for (int i = 0; i + 1 < static_cast<int>(tokens.size()); ++i) {
      const int id = lookup(t.token_text(tokens[i]) + t.token_text(tokens[i + 1]));
      if (id != -1 && scores[id] > best) { best = scores[id]; best_id = id; best_i = i; }
    }
    if (best_i < 0) break;
    tokens[best_i] = best_id;
    tokens.erase(tokens.begin() + best_i + 1);
  }
  return tokens;
}

TEST(Tokenizer, Llama2cMatchesRunC) {
  const fs::path p = data_dir() / "models" / "stories260K" / "tok512.bin";
  NEED_DATA(p);
  const TokenizerData td = ftp::model::load_llama2c_tokenizer(p.string(), 512);
  const Tokenizer tok = Tokenizer::from(td);
  std::mt19937 rng(7);
  const std::string golden = read_file(p.parent_path() / "golden_greedy_t0_steps256.txt");
  for (int iter = 0; iter < 200; ++iter) {
    const std::size_t a = rng() % golden.size(), n = rng() % 120;
    std::string s = golden.substr(a, n);
    if (iter % 3 == 0 && !s.empty()) s[rng() % s.size()] = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok.encode(s, false), runc_encode(tok, td.scores, s)) << "'" << s << "'";
  }
}

// The same vocabulary as a GGUF (SentencePiece "llama" model) agrees with
// tok512.bin on the golden text.
TEST(Tokenizer, Stories260kGgufMatchesTokenizerBin) {
  const fs::path dir = data_dir() / "models" / "stories260K";
  NEED_DATA(dir / "stories260K.gguf");
  const Tokenizer spm = Tokenizer::from(
      ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open((dir / "stories260K.gguf").string())));
  const Tokenizer bin = Tokenizer::from(ftp::model::load_llama2c_tokenizer((dir / "tok512.bin").string(), 512));
  const std::string golden = read_file(dir / "golden_greedy_t0_steps256.txt");
  EXPECT_EQ(spm.encode(golden, true), bin.encode(golden, true));
  EXPECT_EQ(spm.encode("Zoo", true), (std::vector<int>{1, 410, 469, 347}));
  std::vector<int> ids = spm.encode(golden, false);
  EXPECT_EQ(spm.decode(ids), golden);
}

// Random bytes (invalid UTF-8 included) never break a tokenizer, and the
// byte-level ones give every byte back.
TEST(Tokenizer, RandomBytesRoundTrip) {
  const fs::path vocab = data_dir() / "models" / "llama.cpp-vocab";
  const fs::path stories = data_dir() / "models" / "stories260K";
  NEED_DATA(vocab / "ggml-vocab-gpt-2.gguf");
  NEED_DATA(stories / "tok512.bin");
  auto gguf = [](const fs::path& p) {
    return Tokenizer::from(ftp::model::tokenizer_from_gguf(ftp::model::GgufFile::open(p.string())));
  };
  const Tokenizer gpt2 = gguf(vocab / "ggml-vocab-gpt-2.gguf");
  const Tokenizer deepseek = gguf(vocab / "ggml-vocab-deepseek-llm.gguf");
  const Tokenizer spm = gguf(vocab / "ggml-vocab-llama-spm.gguf");
  const Tokenizer l2c = Tokenizer::from(ftp::model::load_llama2c_tokenizer((stories / "tok512.bin").string(), 512));
  std::mt19937 rng(42);
  const char alphabet[] = " \n\ta1'.\xC3\xA9\xE4\xB8\x96\xF0\x9F\xA6\x99\xFF\x80";
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      s += (iter % 2) ? static_cast<char>(rng() % 256) : alphabet[rng() % (sizeof alphabet - 1)];
    }
    std::string back;
    for (const int id : gpt2.encode(s, false)) back += gpt2.token_to_piece(id);
    EXPECT_EQ(back, s);
    // deepseek-llm has added tokens that repeat byte stand-ins ("ÿ" at
    // 100005), which render as their text, as in llama.cpp: no byte round trip.
    for (const int id : deepseek.encode(s, true)) EXPECT_TRUE(id >= 0 && id < deepseek.n_vocab());
    std::string expected = s;
    if (!s.empty()) expected.insert(expected.begin(), ' ');  // run.c's dummy prefix
    EXPECT_EQ(l2c.decode(l2c.encode(s, false)), expected);
    const std::vector<int> ids = spm.encode(s, true);
    for (const int id : ids) EXPECT_TRUE(id >= 0 && id < spm.n_vocab());
  }
}

TEST(PreTokenizer, Gpt2AndLlama3) {
  using ftp::model::unicode::PreStyle;
  using ftp::model::unicode::pre_tokenize;
  using V = std::vector<std::string_view>;
  EXPECT_EQ(pre_tokenize("Hello world's  123 !!\n", PreStyle::gpt2),
            (V{"Hello", " world", "'s", " ", " 123", " !!", "\n"}));
  EXPECT_EQ(pre_tokenize("abc1234567 x", PreStyle::llama3), (V{"abc", "123", "456", "7", " x"}));
  EXPECT_EQ(pre_tokenize("HE'LL  \n\n x", PreStyle::llama3), (V{"HE", "'LL", "  \n\n", " x"}));
  EXPECT_EQ(pre_tokenize("\xD0\x9F\xD1\x80\xD0\xB8 \xE4\xB8\x96", PreStyle::gpt2),
            (V{"\xD0\x9F\xD1\x80\xD0\xB8", " \xE4\xB8\x96"}));
  // Invalid UTF-8 is kept, byte for byte.
  EXPECT_EQ(pre_tokenize("a\xFF" "b", PreStyle::gpt2), (V{"a", "\xFF", "b"}));
  EXPECT_TRUE(pre_tokenize("", PreStyle::default_).empty());
}

TEST(Tokenizer, BadData) {
  TokenizerData d;
  d.model = "bert";
  d.tokens = {"a"};
  EXPECT_THROW(Tokenizer::from(d), ftp::InputError);
  d.model = "gpt2";
  d.pre = "no-such-pre";
  EXPECT_THROW(Tokenizer::from(d), ftp::InputError);
  d.pre = "default";
  d.scores = {1.0f, 2.0f};
  EXPECT_THROW(Tokenizer::from(d), ftp::InputError);
  d.scores.clear();
  d.bos = 7;
  EXPECT_THROW(Tokenizer::from(d), ftp::InputError);
  d.model = "llama";
  d.tokens.clear();
  EXPECT_THROW(Tokenizer::from(d), ftp::InputError);
}
