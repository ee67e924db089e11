// SPDX-License-Identifier: Apache-2.0
#pragma once

// A reader for safetensors files (Hugging Face's weight format): an 8-byte
// little-endian header length N, N bytes of JSON ({"name": {"dtype": "F32",
// "shape": [rows, cols], "data_offsets": [begin, end]}, "__metadata__":
// {...}}), then the tensor bytes, offsets relative to the byte after the
// header. Everything read is validated as the GGUF reader does (header
// length inside the file, offsets inside the data, size = elements x dtype
// size, no two tensors' ranges overlapping), so a hostile or truncated file
// gives an ftp::InputError ("<file>: <what>: <why>"), never a crash; the
// parser is fuzzed (tests/fuzz/fuzz_safetensors.cpp).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ftp::model {

/// Element types of safetensors tensors. The loader reads F32, F16 and BF16;
/// the others are known so that a file holding one is named precisely.
enum class StDType { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean, f8_e4m3, f8_e5m2 };

/// "F32" etc., as safetensors spells the type.
const char* st_dtype_name(StDType t) noexcept;

struct StTensor {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<std::int64_t> shape;  ///< slowest first ([rows, cols] for a matrix)
  std::size_t begin = 0, end = 0;   ///< byte range, relative to the data section
  const void* data = nullptr;       ///< into the file

  std::int64_t elements() const noexcept;
  /// "[2048, 128]".
  std::string shape_text() const;
};

/// A parsed safetensors file. Opened from a path it memory-maps the file
/// (read-only, MAP_PRIVATE) and keeps the mapping alive; parsed from memory
/// it borrows the bytes, which must outlive it.
class SafetensorsFile {
 public:
  /// Maps and parses a file. Errors name `path`.
  static SafetensorsFile open(const std::string& path);
  /// Parses bytes in memory (for tests and fuzzing); `name` is used in errors.
  static SafetensorsFile parse(const void* data, std::size_t size, std::string name);

  const std::string& path() const noexcept { return path_; }
  const std::shared_ptr<const void>& mapping() const noexcept { return mapping_; }
  /// Tensors in the order of their data offsets.
  const std::vector<StTensor>& tensors() const noexcept { return tensors_; }
  const StTensor* find(std::string_view name) const;
  /// The "__metadata__" strings (e.g. "format": "pt").
  const std::unordered_map<std::string, std::string>& metadata() const noexcept { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse_all();

  std::string path_;
  std::shared_ptr<const void> mapping_;
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  std::vector<StTensor> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
  std::unordered_map<std::string, std::string> metadata_;
};

}  // namespace ftp::model
