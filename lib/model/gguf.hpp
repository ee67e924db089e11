// SPDX-License-Identifier: Apache-2.0
#pragma once

// A reader for GGUF files (versions 2 and 3, little-endian): header, metadata
// key/values of every type, tensor infos, alignment and data offset.
// Everything read from the file is bounds-checked, so a hostile or truncated
// file gives an ftp::InputError ("<file>: <what>: <why>"), never a crash; the
// parser is fuzzed (tests/fuzz/fuzz_gguf.cpp).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/model.hpp"

namespace ftp::model {

/// "GGUF" read as a little-endian uint32.
inline constexpr std::uint32_t kGgufMagic = 0x46554747u;

/// Value types of GGUF metadata (the numbers are the file's).
enum class GgufType : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

const char* gguf_type_name(GgufType t) noexcept;

/// ggml tensor types we can name (the numbers are ggml's).
namespace ggml_type {
inline constexpr std::uint32_t f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7,
                               q8_0 = 8, q8_1 = 9, q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13,
                               q6_k = 14, q8_k = 15, i8 = 24, i16 = 25, i32 = 26, i64 = 27,
                               f64 = 28, bf16 = 30;
}
/// Name of a ggml type ("Q8_0"), or "type 99" for one we do not know.
std::string ggml_type_name(std::uint32_t type);

/// One metadata entry. The value stays in the file's bytes; the typed
/// accessors of GgufFile decode it.
struct GgufKV {
  std::string key;
  GgufType type = GgufType::u8;
  GgufType elem_type = GgufType::u8;  ///< for arrays
  std::uint64_t count = 0;            ///< for arrays: number of elements
  std::size_t offset = 0;             ///< of the value (for arrays: of the first element), bytes
  std::size_t raw_begin = 0;          ///< the value's encoding in the file (after the type
  std::size_t raw_end = 0;            ///< field; arrays include element type and count), bytes
};

/// One tensor info. ne[0] is the fastest dimension (columns).
struct GgufTensorInfo {
  std::string name;
  std::uint32_t n_dims = 0;
  std::int64_t ne[4] = {1, 1, 1, 1};
  std::uint32_t type = 0;             ///< ggml type
  std::uint64_t offset = 0;           ///< relative to the data section, bytes
  std::size_t bytes = 0;              ///< 0 when the type's size is unknown
  const void* data = nullptr;         ///< into the file; null when the size is unknown

  std::int64_t elements() const noexcept { return ne[0] * ne[1] * ne[2] * ne[3]; }
  /// "[64, 512]": the dimensions, fastest first, as GGUF lists them.
  std::string shape() const;
};

/// A parsed GGUF file. Opened from a path it memory-maps the file (read-only,
/// MAP_PRIVATE) and keeps the mapping alive; parsed from memory it borrows
/// the bytes, which must outlive it.
class GgufFile {
 public:
  /// Maps and parses a file. Errors name `path`.
  static GgufFile open(const std::string& path);
  /// Parses bytes in memory (for tests and fuzzing); `name` is used in errors.
  static GgufFile parse(const void* data, std::size_t size, std::string name);

  const std::string& path() const noexcept { return path_; }
  std::uint32_t version() const noexcept { return version_; }
  std::size_t alignment() const noexcept { return alignment_; }
  std::size_t data_offset() const noexcept { return data_offset_; }  ///< bytes from file start
  const std::uint8_t* bytes() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  /// The mapping (null when parsed from memory); keep it to keep views valid.
  const std::shared_ptr<const void>& mapping() const noexcept { return mapping_; }

  const std::vector<GgufKV>& kvs() const noexcept { return kvs_; }
  const GgufKV* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  const std::vector<GgufTensorInfo>& tensors() const noexcept { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Typed metadata. Each throws InputError naming the file and the key when
  // the key is absent (the *_or forms return the default instead) or holds
  // another type. Integers accept any integer type whose value fits.
  std::string get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, std::string dflt) const;
  std::int64_t get_int(std::string_view key) const;
  std::int64_t get_int_or(std::string_view key, std::int64_t dflt) const;
  /// f32 or f64 (integers are accepted too).
  double get_float(std::string_view key) const;
  double get_float_or(std::string_view key, double dflt) const;
  bool get_bool(std::string_view key) const;
  bool get_bool_or(std::string_view key, bool dflt) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<std::int64_t> get_int_array(std::string_view key) const;

  /// "<file>: <key>: <why>" as an InputError.
  [[noreturn]] void fail_key(std::string_view key, std::string_view why) const;

 private:
  GgufFile() = default;
  void parse_all();
  const GgufKV& need(std::string_view key) const;
  std::int64_t int_at(GgufType t, std::size_t off, std::string_view key) const;
  double float_at(GgufType t, std::size_t off, std::string_view key) const;

  std::string path_;
  std::shared_ptr<const void> mapping_;
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::size_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> kv_index_, tensor_index_;
};

/// Bytes of one block and elements per block of a ggml type, when known.
struct GgmlTypeSize {
  std::size_t block_elems = 0;
  std::size_t block_bytes = 0;
};
std::optional<GgmlTypeSize> ggml_type_size(std::uint32_t type) noexcept;

/// Maps a file read-only (MAP_PRIVATE). Errors name the file. Used by both
/// loaders; `size` receives the file size. A zero-byte file gives an empty
/// mapping (size 0), which the parsers report as truncated.
std::shared_ptr<const void> map_file(const std::string& path, std::size_t& size);

/// Tokenizer data from a GGUF's tokenizer.ggml.* keys (and
/// tokenizer.chat_template). Errors name the file and the key.
TokenizerData tokenizer_from_gguf(const GgufFile& f);

/// A Model from a parsed GGUF (architectures llama, qwen2, qwen3: the
/// loader's table in model.cpp says what each needs): hyper-parameters,
/// checked weight views, tokenizer data. The views point into f's bytes; the
/// Model keeps f's mapping alive (when f was parsed from memory, the caller
/// keeps the bytes alive).
Model model_from_gguf(const GgufFile& f);

}  // namespace ftp::model
