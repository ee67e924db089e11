// SPDX-License-Identifier: Apache-2.0
// TextStream: the text streamed token by token is the text of the whole
// output, for vocabularies whose whole-text decode rewrites spaces.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include "model/gguf.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "serve/generate.hpp"
#include "test_data.hpp"

using ftp::model::Tokenizer;
using ftp::serve::TextStream;
namespace fs = std::filesystem;

namespace {

Tokenizer vocab(const std::string& name) {
  return Tokenizer::from(ftp::model::tokenizer_from_gguf(
      ftp::model::GgufFile::open(ftp::test::data_dir() + "/models/llama.cpp-vocab/" + name)));
}

/// Streams `out` after `prompt` one token at a time, as a domain does.
std::string stream(const Tokenizer& tok, const std::vector<int>& prompt, const std::vector<int>& out,
                   std::vector<std::string> stop = {}, bool include_stop = false, int min_tokens = 0) {
  TextStream ts(tok, prompt, std::move(stop), include_stop, min_tokens);
  std::string text;
  for (int t : out) {
    ts.feed(t);
    text += ts.take();
    if (ts.stopped()) return text;
  }
  return text + ts.finish();
}

}  // namespace

// GPT-2's vocabulary cleans " ." to "." in a whole decode. Streamed, a " "
// sent before its "." cannot be taken back: the stream keeps every piece
// as llama.cpp's server does, and loses nothing.
TEST(TextStream, BpePunctuationAfterASpaceIsKept) {
  const std::string path = ftp::test::data_dir() + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "test data not found: " << path << " (set FTP_TEST_DATA)";
  const Tokenizer tok = vocab("ggml-vocab-gpt-2.gguf");
  auto id = [&](const char* piece) {
    const std::vector<int> v = tok.encode(piece, false);
    EXPECT_EQ(v.size(), 1u) << piece;
    return v.at(0);
  };
  const std::vector<int> out = {id("Hello"), id(" "), id("."), id(" world"), id(" "), id(","), id(" ok"),
                                id(" '"),    id("s"), id(" "), id("?")};
  const std::vector<int> prompt = tok.encode("Say:", false);
  EXPECT_EQ(stream(tok, prompt, out), "Hello . world , ok 's ?");
  EXPECT_EQ(stream(tok, prompt, out), tok.decode(out, true, false, false));
  // The whole-text decode (llama_detokenize) still cleans the spaces.
  EXPECT_EQ(tok.decode(out, true), "Hello. world, ok's?");
  // A stop string across the pieces ends the text just before it.
  EXPECT_EQ(stream(tok, prompt, out, {" , ok"}), "Hello . world");
}

// Every vocabulary of llama.cpp's test set that loads: streaming a text's
// tokens after a prompt gives their pieces, byte for byte.
TEST(TextStream, StreamedTextIsEveryPieceForEveryVocab) {
  const fs::path dir = fs::path(ftp::test::data_dir()) / "models" / "llama.cpp-vocab";
  if (!fs::exists(dir)) GTEST_SKIP() << "test data not found: " << dir << " (set FTP_TEST_DATA)";
  const std::string text = "Hello , world ! It 's 3.14 , isn 't it ? ' quoted ' \u4e16\u754c \U0001F999 done .";
  int checked = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".gguf") continue;
    std::optional<Tokenizer> tok;
    try {
      tok.emplace(vocab(e.path().filename().string()));
    } catch (const std::exception&) {
      continue;  // a vocabulary this tokenizer does not support (the tokenizer tests report which)
    }
    const std::vector<int> ids = tok->encode(text, false);
    std::string pieces;
    for (int t : ids) pieces += tok->token_to_piece(t);
    EXPECT_EQ(stream(*tok, tok->encode("Q:", true), ids), pieces) << e.path();
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// include_stop_str_in_output keeps the stop string; min_tokens ignores a stop
// string that is complete before more than min_tokens tokens were pushed
// (vLLM's rule), and looks for one only in the text released after.
TEST(TextStream, IncludeStopAndMinTokens) {
  const std::string path = ftp::test::data_dir() + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "test data not found: " << path << " (set FTP_TEST_DATA)";
  const Tokenizer tok = vocab("ggml-vocab-gpt-2.gguf");
  auto id = [&](const char* piece) { return tok.encode(piece, false).at(0); };
  const std::vector<int> prompt = tok.encode("Say:", false);
  const std::vector<int> out = {id("Hello"), id(" world"), id(" and"), id(" world"), id(" again")};
  auto run = [&](bool include, int min_tokens) { return stream(tok, prompt, out, {" world"}, include, min_tokens); };
  EXPECT_EQ(run(false, 0), "Hello");
  EXPECT_EQ(run(true, 0), "Hello world");
  // The first " world" is token 2 of 5: with min_tokens 2 it does not count;
  // the second (token 4) does.
  EXPECT_EQ(run(false, 2), "Hello world and");
  EXPECT_EQ(run(true, 2), "Hello world and world");
  EXPECT_EQ(run(false, 5), "Hello world and world again");  // never more than 5 tokens: no stop
}
