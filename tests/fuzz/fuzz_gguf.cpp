// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the GGUF reader and the Llama model built on it:
// any input must give a parsed file or an ftp::Error, never a crash, a leak
// or an out-of-bounds read (run by tests/fuzz/run-fuzz.sh).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/model.hpp"

using namespace ftp::model;

namespace {

// Reads the first and last elements of a view, so that ASan sees a view that
// points outside the input.
void touch(const TensorView& t) {
  if (t.empty() || t.elements() <= 0) return;
  const std::int64_t blk = dtype_block(t.dtype);  // 1, 32 or 256: decode whole blocks
  std::int64_t n = std::min<std::int64_t>(256, t.elements());
  std::vector<float> out(static_cast<std::size_t>(std::max<std::int64_t>(n, blk)));
  to_f32(t, 0, n, out.data());
  std::int64_t last = (t.elements() - 1) / blk * blk;
  to_f32(t, last, t.elements() - last, out.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    GgufFile f = GgufFile::parse(data, size, "fuzz.gguf");
    for (const GgufKV& kv : f.kvs()) {
      try {
        switch (kv.type) {
          case GgufType::string: (void)f.get_string(kv.key); break;
          case GgufType::boolean: (void)f.get_bool(kv.key); break;
          case GgufType::f32: case GgufType::f64: (void)f.get_float(kv.key); break;
          case GgufType::array:
            if (kv.elem_type == GgufType::string) (void)f.get_string_array(kv.key);
            else if (kv.elem_type == GgufType::f32 || kv.elem_type == GgufType::f64) (void)f.get_float_array(kv.key);
            else (void)f.get_int_array(kv.key);
            break;
          default: (void)f.get_int(kv.key); break;
        }
      } catch (const ftp::Error&) {
      }
    }
    try {
      (void)tokenizer_from_gguf(f);
    } catch (const ftp::Error&) {
    }
    Model m = model_from_gguf(f);
    touch(m.weights.tok_embd);
    touch(m.weights.output);
    touch(m.weights.output_norm);
    for (const auto& l : m.weights.layers)
      for (const TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_down, &l.w_up})
        touch(*t);
  } catch (const ftp::Error&) {
  }
  return 0;
}
