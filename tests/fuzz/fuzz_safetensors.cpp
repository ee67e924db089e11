// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the safetensors reader: any input must give a parsed
// file or an ftp::Error, never a crash, a leak or an out-of-bounds read (run
// by tests/fuzz/run-fuzz.sh). Every tensor's first and last byte is read, so
// that ASan sees a range that points outside the input.

#include <cstddef>
#include <cstdint>

#include "core/error.hpp"
#include "model/safetensors.hpp"

using namespace ftp::model;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const SafetensorsFile f = SafetensorsFile::parse(data, size, "fuzz.safetensors");
    volatile std::uint8_t sink = 0;
    std::size_t prev_end = 0;
    for (const StTensor& t : f.tensors()) {
      if (t.end > t.begin) {
        const auto* p = static_cast<const std::uint8_t*>(t.data);
        sink = sink + p[0] + p[t.end - t.begin - 1];
      }
      // The reader's promise: sorted by offset and never overlapping.
      if (t.end > t.begin && t.begin < prev_end) __builtin_trap();
      if (t.end > t.begin) prev_end = t.end;
      if (f.find(t.name) == nullptr) __builtin_trap();
    }
    (void)sink;
  } catch (const ftp::Error&) {
  }
  return 0;
}
