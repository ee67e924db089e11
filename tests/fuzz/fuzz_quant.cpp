// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the block decoders of model/quant.hpp: the first
// input byte picks a block type (Q8_0, Q4_0 .. Q6_K), the rest is read as
// whole blocks of it and decoded -- through quant::dequantize and through
// to_f32 with a count that ends inside the last block -- and the activation
// quantization of the CPU backend runs on the decoded floats. Any bytes
// must decode without a crash or a read past the blocks (run by
// tests/fuzz/run-fuzz.sh under ASan and UBSan). NaN and infinite weights
// are allowed: a block's f16 scale may be one, as in ggml.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/quant_matmul.hpp"
#include "model/model.hpp"
#include "model/quant.hpp"

using namespace ftp::model;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const DType kTypes[] = {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1,
                                 DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k};
  if (size < 1) return 0;
  const DType t = kTypes[data[0] % (sizeof kTypes / sizeof kTypes[0])];
  const quant::BlockShape b = quant::block_shape(t);
  const std::size_t blocks = (size - 1) / static_cast<std::size_t>(b.bytes);
  if (blocks == 0) return 0;
  // A copy of exactly the blocks, so that ASan sees any read past them.
  std::vector<std::uint8_t> bytes(data + 1, data + 1 + blocks * static_cast<std::size_t>(b.bytes));
  std::vector<float> out(blocks * static_cast<std::size_t>(b.elems));
  quant::dequantize(t, bytes.data(), static_cast<std::int64_t>(blocks), out.data());
  TensorView v{"fuzz", t, 1, static_cast<std::int64_t>(out.size()), bytes.data(), bytes.size()};
  const std::int64_t count = v.cols - 1 - static_cast<std::int64_t>(data[0] >> 4);
  if (count > 0) to_f32(v, 0, count, out.data());
  std::vector<float> xq(out.size());
  ftp::engine::ops::quantize_activations(t, out.data(), 1, static_cast<int>(out.size()), xq.data());
  return 0;
}
