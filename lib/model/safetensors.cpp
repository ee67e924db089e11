// SPDX-License-Identifier: Apache-2.0
#include "model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "core/escape.hpp"
#include "core/json.hpp"
#include "model/gguf.hpp"  // map_file

namespace ftp::model {

namespace {

/// Largest header we read: the Rust reference refuses over 100 MB.
constexpr std::uint64_t kMaxHeader = 100'000'000;

struct DTypeInfo {
  const char* name;
  StDType type;
  std::size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {"F64", StDType::f64, 8},  {"F32", StDType::f32, 4},       {"F16", StDType::f16, 2},
    {"BF16", StDType::bf16, 2}, {"I64", StDType::i64, 8},      {"I32", StDType::i32, 4},
    {"I16", StDType::i16, 2},  {"I8", StDType::i8, 1},         {"U8", StDType::u8, 1},
    {"BOOL", StDType::boolean, 1}, {"F8_E4M3", StDType::f8_e4m3, 1}, {"F8_E5M2", StDType::f8_e5m2, 1},
};

}  // namespace

const char* st_dtype_name(StDType t) noexcept {
  for (const DTypeInfo& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

std::int64_t StTensor::elements() const noexcept {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

std::string StTensor::shape_text() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = map_file(path, f.size_);
  f.base_ = static_cast<const std::uint8_t*>(f.mapping_.get());
  f.parse_all();
  return f;
}

SafetensorsFile SafetensorsFile::parse(const void* data, std::size_t size, std::string name) {
  SafetensorsFile f;
  f.path_ = std::move(name);
  f.base_ = static_cast<const std::uint8_t*>(data);
  f.size_ = size;
  f.parse_all();
  return f;
}

const StTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse_all() {
  const std::string& p = path_;
  if (size_ < 8)
    throw InputError(p + ": truncated: " + std::to_string(size_) + " bytes, too short for the 8-byte header length");
  std::uint64_t n = 0;
  std::memcpy(&n, base_, 8);
  if (n > kMaxHeader) throw InputError(p + ": header length " + std::to_string(n) + " is over the limit of 100 MB");
  if (n > size_ - 8)
    throw InputError(p + ": truncated: the header says " + std::to_string(n) + " bytes of JSON, the file holds " +
                     std::to_string(size_ - 8) + " after the length");
  const std::string_view text(reinterpret_cast<const char*>(base_ + 8), static_cast<std::size_t>(n));
  json::Json doc;
  try {
    doc = json::parse(text, "header");
  } catch (const InputError& e) {
    throw InputError(p + ": " + e.what());
  }
  if (!doc.is_object()) throw InputError(p + ": header: expected a JSON object");
  const std::size_t data_size = size_ - 8 - static_cast<std::size_t>(n);
  const std::uint8_t* data = base_ + 8 + n;
  for (const auto& [key, v] : doc.items()) {
    const std::string where = p + ": tensor '" + printable(key) + "': ";
    if (key == "__metadata__") {
      if (!v.is_object()) throw InputError(p + ": __metadata__: expected an object of strings");
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) throw InputError(p + ": __metadata__." + printable(mk) + ": expected a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) throw InputError(where + "expected an object with dtype, shape and data_offsets");
    StTensor t;
    t.name = key;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) throw InputError(where + "dtype: missing or not a string");
    const std::string dts = dt->get<std::string>();
    const DTypeInfo* info = nullptr;
    for (const DTypeInfo& d : kDTypes)
      if (dts == d.name) info = &d;
    if (!info) throw InputError(where + "dtype: unknown dtype '" + printable(dts) + "'");
    t.dtype = info->type;
    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) throw InputError(where + "shape: missing or not an array");
    if (sh->size() > 8) throw InputError(where + "shape: " + std::to_string(sh->size()) + " dimensions (at most 8)");
    // Element count, overflow-checked: it must fit the data section anyway.
    std::uint64_t elems = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) throw InputError(where + "shape: dimensions must be non-negative integers");
      const std::uint64_t x = d.get<std::uint64_t>();
      if (x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw InputError(where + "shape: dimension " + std::to_string(x) + " too large");
      t.shape.push_back(static_cast<std::int64_t>(x));
      if (x != 0 && elems > std::numeric_limits<std::uint64_t>::max() / x)
        throw InputError(where + "shape " + t.shape_text() + ": element count overflows");
      elems *= x;
    }
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw InputError(where + "data_offsets: expected [begin, end], two non-negative integers");
    const std::uint64_t b = (*off)[0].get<std::uint64_t>(), e = (*off)[1].get<std::uint64_t>();
    if (b > e) throw InputError(where + "data_offsets: begin " + std::to_string(b) + " after end " + std::to_string(e));
    if (e > data_size)
      throw InputError(where + "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                       ") past the end of the data (" + std::to_string(data_size) + " bytes): truncated file?");
    if (elems > (e - b) / info->size || elems * info->size != e - b)
      throw InputError(where + "data_offsets: " + std::to_string(e - b) + " bytes, but shape " + t.shape_text() +
                       " of " + info->name + " needs " +
                       (elems > std::numeric_limits<std::uint64_t>::max() / info->size
                            ? std::string("more")
                            : std::to_string(elems * info->size)));
    t.begin = static_cast<std::size_t>(b);
    t.end = static_cast<std::size_t>(e);
    t.data = data + t.begin;
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 1; i < tensors_.size(); ++i) {
    const StTensor& a = tensors_[i - 1];
    const StTensor& b = tensors_[i];
    if (b.begin < a.end && b.end > b.begin && a.end > a.begin)
      throw InputError(p + ": tensor '" + printable(b.name) + "': data_offsets [" + std::to_string(b.begin) + ", " +
                       std::to_string(b.end) + ") overlap tensor '" + printable(a.name) + "' [" +
                       std::to_string(a.begin) + ", " + std::to_string(a.end) + ")");
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

}  // namespace ftp::model
