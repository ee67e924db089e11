// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the llama2.c checkpoint and tokenizer.bin parsers:
// any input must give a result or an ftp::Error, never a crash (run by
// tests/fuzz/run-fuzz.sh). The same input is tried as both.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "model/llama2c.hpp"
#include "model/model.hpp"

using namespace ftp::model;

namespace {

void touch(const TensorView& t) {
  if (t.empty() || t.elements() <= 0) return;
  float x;
  to_f32(t, 0, 1, &x);
  to_f32(t, t.elements() - 1, 1, &x);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    Model m = parse_llama2c(data, size, "fuzz.bin");
    touch(m.weights.tok_embd);
    touch(m.weights.output);
    touch(m.weights.output_norm);
    for (const auto& l : m.weights.layers)
      for (const TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_down, &l.w_up})
        touch(*t);
  } catch (const ftp::Error&) {
  }
  // As a tokenizer: to the end, and with a vocabulary size from the first byte.
  try {
    (void)parse_llama2c_tokenizer(data, size, -1, "fuzz-tok.bin");
  } catch (const ftp::Error&) {
  }
  try {
    int n = size > 0 ? data[0] : 0;
    (void)parse_llama2c_tokenizer(data, size, n, "fuzz-tok.bin");
  } catch (const ftp::Error&) {
  }
  return 0;
}
