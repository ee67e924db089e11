// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

/// llama.cpp's tokenizer test vectors (models/llama.cpp-vocab, as its
/// tests/test-tokenizer-0 reads them): the .inp file holds the cases
/// separated (and ended) by "\n__ggml_vocab_test__\n", the .out file one
/// line of space-separated ids per case.
namespace ftp::test {

struct VocabCase {
  std::string input;
  std::vector<int> expected;
};

struct VocabCases {
  std::vector<VocabCase> cases;
  std::size_t inputs = 0, lines = 0;  ///< as read, to check they agree
};

inline VocabCases read_vocab_cases(const std::string& gguf) {
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  const std::string inp = slurp(gguf + ".inp"), out = slurp(gguf + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (std::size_t pos = 0;;) {
    const std::size_t hit = inp.find(sep, pos);
    if (hit == std::string::npos) break;
    inputs.push_back(inp.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  std::vector<std::string> lines;
  std::istringstream ls(out);
  for (std::string l; std::getline(ls, l);) lines.push_back(l);
  VocabCases r;
  r.inputs = inputs.size();
  r.lines = lines.size();
  for (std::size_t i = 0; i < inputs.size() && i < lines.size(); ++i) {
    std::istringstream in(lines[i]);
    std::vector<int> ids;
    for (int v; in >> v;) ids.push_back(v);
    r.cases.push_back({inputs[i], ids});
  }
  return r;
}

}  // namespace ftp::test
