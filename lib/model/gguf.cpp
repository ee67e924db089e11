// SPDX-License-Identifier: Apache-2.0
#include "model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "core/escape.hpp"

namespace ftp::model {

namespace {

constexpr int kMaxArrayDepth = 4;

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    default: return 0;
  }
}

bool is_int(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16:
    case GgufType::u32: case GgufType::i32: case GgufType::u64: case GgufType::i64:
      return true;
    default:
      return false;
  }
}

/// Reads the file's bytes in order, every read checked against the end.
class Cursor {
 public:
  Cursor(const std::uint8_t* p, std::size_t size, const std::string& name)
      : p_(p), size_(size), name_(name) {}

  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }

  /// Reserves n bytes for `what` and returns their offset.
  std::size_t take(std::uint64_t n, const std::string& what) {
    if (n > left())
      throw InputError(name_ + ": truncated file: " + what + " needs " + std::to_string(n) +
                       " bytes at offset " + std::to_string(pos_) + ", file is " +
                       std::to_string(size_) + " bytes");
    std::size_t at = pos_;
    pos_ += static_cast<std::size_t>(n);
    return at;
  }
  template <class T>
  T read(const std::string& what) {
    return load<T>(p_ + take(sizeof(T), what));
  }
  std::string str(const std::string& what) {
    auto len = read<std::uint64_t>(what + " (string length)");
    std::size_t at = take(len, what + " (string of " + std::to_string(len) + " bytes)");
    return std::string(reinterpret_cast<const char*>(p_ + at), static_cast<std::size_t>(len));
  }
  /// Skips one value of type t (nested arrays up to kMaxArrayDepth).
  void skip_value(GgufType t, const std::string& what, int depth) {
    if (t == GgufType::string) {
      auto len = read<std::uint64_t>(what + " (string length)");
      take(len, what + " (string of " + std::to_string(len) + " bytes)");
      return;
    }
    if (t == GgufType::array) {
      if (depth >= kMaxArrayDepth)
        throw InputError(name_ + ": " + what + ": arrays nested deeper than " +
                         std::to_string(kMaxArrayDepth));
      auto et = static_cast<GgufType>(read<std::uint32_t>(what + " (array type)"));
      auto n = read<std::uint64_t>(what + " (array length)");
      skip_array(et, n, what, depth + 1);
      return;
    }
    std::size_t sz = scalar_size(t);
    if (sz == 0)
      throw InputError(name_ + ": " + what + ": unknown value type " +
                       std::to_string(static_cast<std::uint32_t>(t)));
    take(sz, what);
  }
  void skip_array(GgufType et, std::uint64_t n, const std::string& what, int depth) {
    std::size_t sz = scalar_size(et);
    if (sz != 0) {
      if (n > left() / sz)
        throw InputError(name_ + ": truncated file: " + what + ": array of " + std::to_string(n) +
                         " " + gguf_type_name(et) + " needs more than the " +
                         std::to_string(left()) + " bytes left");
      take(n * sz, what);
      return;
    }
    if (et != GgufType::string && et != GgufType::array)
      throw InputError(name_ + ": " + what + ": unknown array element type " +
                       std::to_string(static_cast<std::uint32_t>(et)));
    // Each string or array element takes at least 8 bytes: bound n first so a
    // huge count fails fast instead of looping.
    if (n > left() / 8)
      throw InputError(name_ + ": truncated file: " + what + ": array of " + std::to_string(n) +
                       " " + gguf_type_name(et) + " cannot fit in the " +
                       std::to_string(left()) + " bytes left");
    for (std::uint64_t i = 0; i < n; ++i) skip_value(et, what, depth);
  }

 private:
  const std::uint8_t* p_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::string& name_;
};

std::string quoted(std::string_view s) { return "'" + printable(s) + "'"; }

}  // namespace

const char* gguf_type_name(GgufType t) noexcept {
  switch (t) {
    case GgufType::u8: return "uint8";
    case GgufType::i8: return "int8";
    case GgufType::u16: return "uint16";
    case GgufType::i16: return "int16";
    case GgufType::u32: return "uint32";
    case GgufType::i32: return "int32";
    case GgufType::f32: return "float32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "uint64";
    case GgufType::i64: return "int64";
    case GgufType::f64: return "float64";
  }
  return "unknown";
}

std::string ggml_type_name(std::uint32_t type) {
  switch (type) {
    case ggml_type::f32: return "F32";
    case ggml_type::f16: return "F16";
    case ggml_type::q4_0: return "Q4_0";
    case ggml_type::q4_1: return "Q4_1";
    case ggml_type::q5_0: return "Q5_0";
    case ggml_type::q5_1: return "Q5_1";
    case ggml_type::q8_0: return "Q8_0";
    case ggml_type::q8_1: return "Q8_1";
    case ggml_type::q2_k: return "Q2_K";
    case ggml_type::q3_k: return "Q3_K";
    case ggml_type::q4_k: return "Q4_K";
    case ggml_type::q5_k: return "Q5_K";
    case ggml_type::q6_k: return "Q6_K";
    case ggml_type::q8_k: return "Q8_K";
    case ggml_type::i8: return "I8";
    case ggml_type::i16: return "I16";
    case ggml_type::i32: return "I32";
    case ggml_type::i64: return "I64";
    case ggml_type::f64: return "F64";
    case ggml_type::bf16: return "BF16";
    default: return "type " + std::to_string(type);
  }
}

std::optional<GgmlTypeSize> ggml_type_size(std::uint32_t type) noexcept {
  switch (type) {
    case ggml_type::f32: return GgmlTypeSize{1, 4};
    case ggml_type::f16: return GgmlTypeSize{1, 2};
    case ggml_type::bf16: return GgmlTypeSize{1, 2};
    case ggml_type::q4_0: return GgmlTypeSize{32, 18};
    case ggml_type::q4_1: return GgmlTypeSize{32, 20};
    case ggml_type::q5_0: return GgmlTypeSize{32, 22};
    case ggml_type::q5_1: return GgmlTypeSize{32, 24};
    case ggml_type::q8_0: return GgmlTypeSize{32, 34};
    case ggml_type::q8_1: return GgmlTypeSize{32, 36};
    case ggml_type::q2_k: return GgmlTypeSize{256, 84};
    case ggml_type::q3_k: return GgmlTypeSize{256, 110};
    case ggml_type::q4_k: return GgmlTypeSize{256, 144};
    case ggml_type::q5_k: return GgmlTypeSize{256, 176};
    case ggml_type::q6_k: return GgmlTypeSize{256, 210};
    case ggml_type::q8_k: return GgmlTypeSize{256, 292};
    case ggml_type::i8: return GgmlTypeSize{1, 1};
    case ggml_type::i16: return GgmlTypeSize{1, 2};
    case ggml_type::i32: return GgmlTypeSize{1, 4};
    case ggml_type::i64: return GgmlTypeSize{1, 8};
    case ggml_type::f64: return GgmlTypeSize{1, 8};
    default: return std::nullopt;
  }
}

std::string GgufTensorInfo::shape() const {
  std::string s = "[";
  for (std::uint32_t i = 0; i < n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

std::shared_ptr<const void> map_file(const std::string& path, std::size_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw InputError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file");
  }
  size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return {};
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (p == MAP_FAILED) throw InputError(path + ": cannot map: " + std::strerror(e));
  return std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  f.mapping_ = map_file(path, f.size_);
  f.base_ = static_cast<const std::uint8_t*>(f.mapping_.get());
  f.parse_all();
  return f;
}

GgufFile GgufFile::parse(const void* data, std::size_t size, std::string name) {
  GgufFile f;
  f.path_ = std::move(name);
  f.base_ = static_cast<const std::uint8_t*>(data);
  f.size_ = data ? size : 0;
  f.parse_all();
  return f;
}

void GgufFile::parse_all() {
  static const std::uint8_t empty = 0;
  if (!base_) base_ = &empty;  // so that pointer arithmetic stays defined
  Cursor c(base_, size_, path_);
  auto magic = c.read<std::uint32_t>("magic");
  if (magic != kGgufMagic) {
    std::string got(reinterpret_cast<const char*>(base_), 4);
    for (auto& ch : got)
      if (ch < 0x20 || ch > 0x7e) ch = '?';
    throw InputError(path_ + ": bad magic '" + got + "': not a GGUF file");
  }
  version_ = c.read<std::uint32_t>("version");
  if (version_ == 1)
    throw InputError(path_ + ": unsupported GGUF version 1 (an early 2023 format; "
                     "convert the model again with a current llama.cpp): versions 2 and 3 are read");
  if (version_ != 2 && version_ != 3) {
    // A big-endian file has its version byte-swapped (3 reads as 0x03000000).
    if ((version_ & 0xffffu) == 0 && version_ != 0)
      throw InputError(path_ + ": big-endian GGUF (version field " + std::to_string(version_) +
                       ") is not supported");
    throw InputError(path_ + ": unsupported GGUF version " + std::to_string(version_) +
                     ": versions 2 and 3 are read");
  }
  auto n_tensors = c.read<std::uint64_t>("tensor count");
  auto n_kv = c.read<std::uint64_t>("metadata count");
  // Every key/value takes at least 8 + 4 + 1 bytes, every tensor info 8+4+8+4+8.
  if (n_kv > c.left() / 13)
    throw InputError(path_ + ": truncated file: metadata count " + std::to_string(n_kv) +
                     " cannot fit in " + std::to_string(size_) + " bytes");
  if (n_tensors > c.left() / 32)
    throw InputError(path_ + ": truncated file: tensor count " + std::to_string(n_tensors) +
                     " cannot fit in " + std::to_string(size_) + " bytes");

  // Counts come from the file: reserve a little, let a real one grow (a
  // corrupt count would otherwise ask for several times the file's size).
  kvs_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_kv, 4096)));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string what = "metadata key #" + std::to_string(i);
    GgufKV kv;
    kv.key = c.str(what);
    what = "metadata " + quoted(kv.key);
    auto t = c.read<std::uint32_t>(what + " (type)");
    kv.type = static_cast<GgufType>(t);
    kv.raw_begin = c.pos();
    if (kv.type == GgufType::array) {
      auto et = c.read<std::uint32_t>(what + " (array type)");
      kv.elem_type = static_cast<GgufType>(et);
      kv.count = c.read<std::uint64_t>(what + " (array length)");
      kv.offset = c.pos();
      c.skip_array(kv.elem_type, kv.count, what, 1);
    } else {
      kv.offset = c.pos();
      c.skip_value(kv.type, what, 0);
    }
    kv.raw_end = c.pos();
    if (!kv_index_.emplace(kv.key, kvs_.size()).second)
      throw InputError(path_ + ": metadata " + quoted(kv.key) + " appears twice");
    kvs_.push_back(std::move(kv));
  }

  if (const GgufKV* a = find("general.alignment")) {
    if (!is_int(a->type)) fail_key(a->key, std::string("expected an integer, got ") + gguf_type_name(a->type));
    auto v = int_at(a->type, a->offset, a->key);
    if (v <= 0 || (v & (v - 1)) != 0 || v > (1 << 30))
      fail_key(a->key, "must be a power of two, got " + std::to_string(v));
    alignment_ = static_cast<std::size_t>(v);
  }

  tensors_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_tensors, 4096)));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    std::string what = "tensor info #" + std::to_string(i);
    GgufTensorInfo ti;
    ti.name = c.str(what + " name");
    what = "tensor " + quoted(ti.name);
    ti.n_dims = c.read<std::uint32_t>(what + " (dimension count)");
    if (ti.n_dims == 0 || ti.n_dims > 4)
      throw InputError(path_ + ": " + what + ": " + std::to_string(ti.n_dims) +
                       " dimensions (1 to 4 allowed)");
    for (std::uint32_t d = 0; d < ti.n_dims; ++d) {
      auto n = c.read<std::uint64_t>(what + " (dimension " + std::to_string(d) + ")");
      if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw InputError(path_ + ": " + what + ": dimension " + std::to_string(d) + " = " +
                         std::to_string(n) + " is too large");
      ti.ne[d] = static_cast<std::int64_t>(n);
    }
    ti.type = c.read<std::uint32_t>(what + " (type)");
    ti.offset = c.read<std::uint64_t>(what + " (offset)");
    if (!tensor_index_.emplace(ti.name, tensors_.size()).second)
      throw InputError(path_ + ": " + what + " appears twice");
    tensors_.push_back(std::move(ti));
  }

  std::size_t end_of_infos = c.pos();
  std::size_t pad = (alignment_ - end_of_infos % alignment_) % alignment_;
  data_offset_ = end_of_infos + pad;  // may lie past the end in a file without tensor data

  for (auto& ti : tensors_) {
    std::string what = "tensor " + quoted(ti.name);
    // Element count, guarding against overflow: every dimension < 2^63 and the
    // product checked step by step.
    std::uint64_t elems = 1;
    for (std::uint32_t d = 0; d < ti.n_dims; ++d) {
      auto n = static_cast<std::uint64_t>(ti.ne[d]);
      if (n != 0 && elems > std::numeric_limits<std::uint64_t>::max() / 2 / n)
        throw InputError(path_ + ": " + what + ": shape " + ti.shape() + " is too large");
      elems *= n;
    }
    if (ti.offset % alignment_ != 0)
      throw InputError(path_ + ": " + what + ": data offset " + std::to_string(ti.offset) +
                       " is not a multiple of the alignment " + std::to_string(alignment_));
    auto ts = ggml_type_size(ti.type);
    if (!ts) continue;  // the loader reports the unsupported type by name
    if (ti.ne[0] % static_cast<std::int64_t>(ts->block_elems) != 0)
      throw InputError(path_ + ": " + what + ": " + ggml_type_name(ti.type) + " needs rows of a multiple of " +
                       std::to_string(ts->block_elems) + " elements, shape is " + ti.shape());
    std::uint64_t blocks = elems / ts->block_elems;
    if (blocks > std::numeric_limits<std::uint64_t>::max() / ts->block_bytes)
      throw InputError(path_ + ": " + what + ": shape " + ti.shape() + " is too large");
    std::uint64_t bytes = blocks * ts->block_bytes;
    std::uint64_t begin = static_cast<std::uint64_t>(data_offset_);
    if (ti.offset > std::numeric_limits<std::uint64_t>::max() - begin ||
        begin + ti.offset > size_ || bytes > size_ - (begin + ti.offset))
      throw InputError(path_ + ": " + what + ": tensor data out of bounds: " + std::to_string(bytes) +
                       " bytes at offset " + std::to_string(ti.offset) + " of the data section (which starts at " +
                       std::to_string(data_offset_) + "), file is " + std::to_string(size_) + " bytes");
    ti.bytes = static_cast<std::size_t>(bytes);
    ti.data = base_ + begin + ti.offset;
  }
}

const GgufKV* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::fail_key(std::string_view key, std::string_view why) const {
  throw InputError(path_ + ": metadata " + quoted(key) + ": " + std::string(why));
}

const GgufKV& GgufFile::need(std::string_view key) const {
  const GgufKV* kv = find(key);
  if (!kv) fail_key(key, "missing required key");
  return *kv;
}

std::int64_t GgufFile::int_at(GgufType t, std::size_t off, std::string_view key) const {
  const std::uint8_t* p = base_ + off;
  switch (t) {
    case GgufType::u8: return load<std::uint8_t>(p);
    case GgufType::i8: return load<std::int8_t>(p);
    case GgufType::u16: return load<std::uint16_t>(p);
    case GgufType::i16: return load<std::int16_t>(p);
    case GgufType::u32: return load<std::uint32_t>(p);
    case GgufType::i32: return load<std::int32_t>(p);
    case GgufType::i64: return load<std::int64_t>(p);
    case GgufType::u64: {
      auto v = load<std::uint64_t>(p);
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail_key(key, "value " + std::to_string(v) + " is too large");
      return static_cast<std::int64_t>(v);
    }
    default:
      fail_key(key, std::string("expected an integer, got ") + gguf_type_name(t));
  }
}

double GgufFile::float_at(GgufType t, std::size_t off, std::string_view key) const {
  if (t == GgufType::f32) return load<float>(base_ + off);
  if (t == GgufType::f64) return load<double>(base_ + off);
  if (is_int(t)) return static_cast<double>(int_at(t, off, key));
  fail_key(key, std::string("expected a number, got ") + gguf_type_name(t));
}

std::string GgufFile::get_string(std::string_view key) const {
  const GgufKV& kv = need(key);
  if (kv.type != GgufType::string)
    fail_key(key, std::string("expected a string, got ") + gguf_type_name(kv.type));
  auto len = load<std::uint64_t>(base_ + kv.offset);
  return std::string(reinterpret_cast<const char*>(base_ + kv.offset + 8), static_cast<std::size_t>(len));
}

std::string GgufFile::get_string_or(std::string_view key, std::string dflt) const {
  return has(key) ? get_string(key) : dflt;
}

std::int64_t GgufFile::get_int(std::string_view key) const {
  const GgufKV& kv = need(key);
  return int_at(kv.type, kv.offset, key);
}

std::int64_t GgufFile::get_int_or(std::string_view key, std::int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}

double GgufFile::get_float(std::string_view key) const {
  const GgufKV& kv = need(key);
  return float_at(kv.type, kv.offset, key);
}

double GgufFile::get_float_or(std::string_view key, double dflt) const {
  return has(key) ? get_float(key) : dflt;
}

bool GgufFile::get_bool(std::string_view key) const {
  const GgufKV& kv = need(key);
  if (kv.type != GgufType::boolean)
    fail_key(key, std::string("expected a bool, got ") + gguf_type_name(kv.type));
  return base_[kv.offset] != 0;
}

bool GgufFile::get_bool_or(std::string_view key, bool dflt) const {
  return has(key) ? get_bool(key) : dflt;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufKV& kv = need(key);
  if (kv.type != GgufType::array || kv.elem_type != GgufType::string)
    fail_key(key, std::string("expected an array of strings, got ") + gguf_type_name(kv.type) +
                      (kv.type == GgufType::array ? std::string(" of ") + gguf_type_name(kv.elem_type) : ""));
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(kv.count, 1u << 20)));
  std::size_t off = kv.offset;  // bounds were checked by the parse
  for (std::uint64_t i = 0; i < kv.count; ++i) {
    auto len = static_cast<std::size_t>(load<std::uint64_t>(base_ + off));
    out.emplace_back(reinterpret_cast<const char*>(base_ + off + 8), len);
    off += 8 + len;
  }
  return out;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const GgufKV& kv = need(key);
  std::size_t sz = scalar_size(kv.elem_type);
  if (kv.type != GgufType::array || sz == 0 || kv.elem_type == GgufType::boolean)
    fail_key(key, std::string("expected an array of numbers, got ") + gguf_type_name(kv.type) +
                      (kv.type == GgufType::array ? std::string(" of ") + gguf_type_name(kv.elem_type) : ""));
  std::vector<float> out(static_cast<std::size_t>(kv.count));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(float_at(kv.elem_type, kv.offset + i * sz, key));
  return out;
}

std::vector<std::int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufKV& kv = need(key);
  if (kv.type != GgufType::array || !is_int(kv.elem_type))
    fail_key(key, std::string("expected an array of integers, got ") + gguf_type_name(kv.type) +
                      (kv.type == GgufType::array ? std::string(" of ") + gguf_type_name(kv.elem_type) : ""));
  std::size_t sz = scalar_size(kv.elem_type);
  std::vector<std::int64_t> out(static_cast<std::size_t>(kv.count));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = int_at(kv.elem_type, kv.offset + i * sz, key);
  return out;
}

}  // namespace ftp::model
