// SPDX-License-Identifier: Apache-2.0
// The bounded JSON reader behind json::parse and json::parse_line: nlohmann's
// SAX parser (iterative, no recursion) with a builder of our own, which
// enforces the Limits as it goes and appends an object's members without the
// ordered map's linear search per insert (80,000 keys cost 7.7 s that way).
#include <functional>
#include <iterator>
#include <memory>
#include <unordered_map>

#include "core/json.hpp"

namespace ftp::json {

namespace {

/// A byte iterator over the text that tells how far the lexer has read, so
/// that a refusal names the byte where the document passed a limit.
class CountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator(const char* p, const char** read) : p_(p), read_(read) {}
  reference operator*() const { return *p_; }
  CountingIterator& operator++() {
    *read_ = ++p_;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p_ == o.p_; }
  bool operator!=(const CountingIterator& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char** read_;
};

/// A limit passed: which one and why, at the byte read last.
struct LimitPassed {
  std::string limit, why;
};

/// Objects with more members than this find duplicates through a hash index
/// instead of a scan.
constexpr std::size_t kIndexFrom = 16;

class Builder {
  using Members = Json::object_t::Container;

 public:
  explicit Builder(const Limits& limits) : limits_(limits) {}

  Json& root() { return root_; }
  /// Set when the parse stopped at a limit.
  const std::optional<LimitPassed>& passed() const { return passed_; }
  /// Set when the parse stopped at a syntax error or a number past a double.
  const nlohmann::detail::exception* error() const { return error_.get(); }
  std::size_t error_byte() const { return error_byte_; }

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool b) { return put(Json(b)); }
  bool number_integer(Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(Json::number_float_t v, const std::string&) { return put(Json(v)); }
  bool string(std::string& s) { return put(Json(std::move(s))); }
  bool binary(Json::binary_t&) { return false; }  // not in JSON text

  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    Frame& f = stack_.back();
    if (++f.count > limits_.max_keys)
      return refuse("max_keys", "an object of more than " + std::to_string(limits_.max_keys) + " keys");
    // The map's vector: appended to directly, without its search.
    Members& members = *f.value->get_ptr<Json::object_t*>();
    // A duplicate keeps its first place and takes the last value (nlohmann's rule).
    if (f.index) {
      if (auto it = f.index->find(k); it != f.index->end()) return at_member(members, it->second);
    } else {
      for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i].first == k) return at_member(members, i);
      if (members.size() + 1 >= kIndexFrom) {
        f.index = std::make_unique<std::unordered_map<std::string, std::size_t>>();
        for (std::size_t i = 0; i < members.size(); ++i) f.index->emplace(members[i].first, i);
      }
    }
    if (f.index) f.index->emplace(k, members.size());
    members.emplace_back(std::move(k), nullptr);
    member_ = &members.back().second;
    return true;
  }

  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) {
    error_byte_ = byte;
    if (const auto* pe = dynamic_cast<const Json::parse_error*>(&e)) {
      error_ = std::make_unique<Json::parse_error>(*pe);
      error_byte_ = pe->byte;
    } else if (const auto* oe = dynamic_cast<const Json::out_of_range*>(&e)) {
      error_ = std::make_unique<Json::out_of_range>(*oe);
    } else {
      error_ = std::make_unique<Json::other_error>(Json::other_error::create(501, e.what(), nullptr));
    }
    return false;
  }

 private:
  struct Frame {
    Json* value;
    std::size_t count = 0;  ///< elements or members so far
    std::unique_ptr<std::unordered_map<std::string, std::size_t>> index;
  };

  bool refuse(std::string limit, std::string why) {
    passed_ = LimitPassed{std::move(limit), std::move(why)};
    return false;
  }

  bool at_member(Members& members, std::size_t i) {
    member_ = &members[i].second;
    return true;
  }

  /// Where the next value goes: a new element of the open array, the member
  /// key() named, or the root. Null when a limit refuses it.
  Json* slot() {
    if (++values_ > limits_.max_values) {
      refuse("max_values", "more than " + std::to_string(limits_.max_values) + " values in one document");
      return nullptr;
    }
    if (stack_.empty()) return &root_;
    Frame& f = stack_.back();
    if (!f.value->is_array()) return member_;
    if (++f.count > limits_.max_elements) {
      refuse("max_elements", "an array of more than " + std::to_string(limits_.max_elements) + " elements");
      return nullptr;
    }
    auto& elements = *f.value->get_ptr<Json::array_t*>();
    elements.emplace_back();
    return &elements.back();
  }

  bool put(Json v) {
    Json* s = slot();
    if (!s) return false;
    *s = std::move(v);
    return true;
  }

  bool open(Json empty) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      return refuse("max_depth", "nesting deeper than " + std::to_string(limits_.max_depth) + " arrays or objects");
    Json* s = slot();
    if (!s) return false;
    *s = std::move(empty);
    // The parent's container does not grow while this one is open, so s stays valid.
    stack_.push_back(Frame{s});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  const Limits& limits_;
  Json root_;
  std::vector<Frame> stack_;
  Json* member_ = nullptr;
  std::size_t values_ = 0;
  std::optional<LimitPassed> passed_;
  std::unique_ptr<nlohmann::detail::exception> error_;
  std::size_t error_byte_ = 0;
};

/// nlohmann's message from `marker` on (its own prefix names no place).
std::string from(const std::exception& e, std::string_view marker) {
  std::string what = e.what();
  auto pos = what.find(marker);
  return pos == std::string::npos ? what : what.substr(pos);
}

/// How a caller words the three kinds of failure.
struct Wording {
  /// A syntax error at 1-based byte `byte` of `text`.
  std::function<std::string(std::string_view text, std::size_t byte, const std::string& what)> syntax;
  std::function<std::string(const std::string& what)> overflow;
  std::function<std::string(std::size_t byte, const std::string& why)> limit;
};

Json read(std::string_view text, const Limits& limits, const Wording& say) {
  const char* read = text.data();
  Builder b(limits);
  CountingIterator first(text.data(), &read), last(text.data() + text.size(), &read);
  if (Json::sax_parse(first, last, &b)) return std::move(b.root());
  if (const auto& p = b.passed()) {
    const std::size_t byte = static_cast<std::size_t>(read - text.data());
    throw ParseError(say.limit(byte, p->why), byte, p->limit);
  }
  if (const auto* e = b.error()) {
    if (dynamic_cast<const Json::out_of_range*>(e)) throw ParseError(say.overflow(from(*e, "number overflow")), 0, "");
    throw ParseError(say.syntax(text, b.error_byte(), from(*e, "syntax error")), b.error_byte(), "");
  }
  throw ParseError(say.syntax(text, 0, "the parser stopped"), 0, "");
}

}  // namespace

Json parse(std::string_view text, std::string_view source, const Limits& limits) {
  const std::string src(source);
  return read(text, limits,
              Wording{
                  [&](std::string_view t, std::size_t byte, const std::string& what) {
                    // nlohmann reports a byte offset; turn it into line:column for people.
                    std::size_t line = 1, col = 1;
                    for (std::size_t i = 0; i + 1 < byte && i < t.size(); ++i) {
                      if (t[i] == '\n') {
                        ++line;
                        col = 1;
                      } else {
                        ++col;
                      }
                    }
                    return src + ":" + std::to_string(line) + ":" + std::to_string(col) + ": malformed JSON: " + what;
                  },
                  [&](const std::string& what) { return src + ": " + what; },
                  [&](std::size_t byte, const std::string& why) {
                    return src + ": byte " + std::to_string(byte) + ": " + why;
                  },
              });
}

Json parse_line(std::string_view line, const Limits& limits) {
  return read(line, limits,
              Wording{
                  [](std::string_view, std::size_t, const std::string& what) { return "malformed JSON: " + what; },
                  [](const std::string& what) { return "malformed JSON: " + what; },
                  [](std::size_t byte, const std::string& why) {
                    return "JSON over a limit: byte " + std::to_string(byte) + ": " + why;
                  },
              });
}

namespace {

/// Finds the text of one top-level member's number; builds nothing.
class NumberFinder : public nlohmann::json_sax<Json> {
 public:
  explicit NumberFinder(std::string_view key) : key_(key) {}
  std::optional<std::string> found;

  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t v) override { return number(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return number(std::to_string(v)); }
  bool number_float(number_float_t, const string_t& raw) override { return number(raw); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override {
    if (depth_ == 0) return false;  // not an object
    return open();
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    at_key_ = depth_ == 1 && k == key_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool scalar() {
    if (depth_ == 0) return false;
    return !std::exchange(at_key_, false);  // the member is not a number: stop
  }
  bool number(std::string text) {
    if (depth_ == 0) return false;
    if (!std::exchange(at_key_, false)) return true;
    found = std::move(text);
    return false;
  }
  bool open() {
    if (at_key_) return false;  // the member is not a number
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }

  std::string_view key_;
  int depth_ = 0;
  bool at_key_ = false;
};

}  // namespace

std::optional<std::string> member_number_text(std::string_view text, std::string_view key) {
  NumberFinder f(key);
  Json::sax_parse(text.begin(), text.end(), &f);
  return f.found;
}

}  // namespace ftp::json
