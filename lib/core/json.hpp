// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ftp::json {

using Json = nlohmann::ordered_json;

/// One JSON value together with its path inside the document ("gears[2].tp"),
/// so that validation errors name the field at fault. Every failure throws
/// ftp::InputError with the message "<path>: <why>".
class Node {
 public:
  Node(const Json& value, std::string path) : v_(&value), path_(std::move(path)) {}

  const Json& value() const noexcept { return *v_; }
  /// Path of this value; "" for the document root.
  const std::string& path() const noexcept { return path_; }
  /// Path of a member key below this value ("a.b" or "b" at the root).
  std::string child_path(std::string_view key) const;

  [[noreturn]] void fail(std::string_view why) const;

  void expect_object() const;
  void expect_array() const;

  bool has(std::string_view key) const;
  /// A required member; missing or null: "<path>.<key>: missing required field".
  Node at(std::string_view key) const;
  /// An optional member; absent or null gives nullopt.
  std::optional<Node> find(std::string_view key) const;
  /// Elements of an array, each with its indexed path.
  std::vector<Node> items() const;

  std::string str() const;
  std::int64_t integer() const;
  double number() const;
  bool boolean() const;

  // Shorthands for members.
  std::string str(std::string_view key) const { return at(key).str(); }
  std::string str_or(std::string_view key, std::string dflt) const;
  std::int64_t integer(std::string_view key) const { return at(key).integer(); }
  std::int64_t integer_or(std::string_view key, std::int64_t dflt) const;
  double number(std::string_view key) const { return at(key).number(); }
  double number_or(std::string_view key, double dflt) const;
  bool boolean_or(std::string_view key, bool dflt) const;

  /// A number > 0 (or >= 0 with allow_zero), else "<path>: must be positive, got -1".
  double positive(std::string_view key, bool allow_zero = false) const;
  std::int64_t positive_integer(std::string_view key, bool allow_zero = false) const;
  /// positive_integer that also fits an int: "<path>: must be at most 2147483647, got ...".
  int positive_int(std::string_view key, bool allow_zero = false) const;
  /// A string member that must be one of `choices`.
  std::string one_of(std::string_view key, const std::vector<std::string>& choices) const;

 private:
  const Json* v_;
  std::string path_;
};

/// Output style of --json: pretty (indented) or short (one line).
enum class Style { pretty, short_ };

/// Serialises a document; always without a trailing newline.
std::string dump(const Json& doc, Style style);

/// Deepest nesting of arrays and objects a parsed document may have. No
/// document of ours comes near it; past it nlohmann's recursive copies of a
/// value overflow the stack (a 240 KB body of [[[...]]] ended the daemon).
inline constexpr int kMaxDepth = 128;
/// Most members of one object. No document of ours comes near it; an
/// object's lookups are linear in its members (nlohmann's ordered map).
inline constexpr std::size_t kMaxKeys = 4096;
/// Most values (scalars, arrays, objects, each counted once) in one
/// document, and so elements of one array: 2^19, twice the token ids of 128
/// prompts of 2,048 tokens. Each value costs 16 bytes and an array or object
/// 32 more, so this bounds what a document of empty arrays can allocate.
inline constexpr std::size_t kMaxValues = std::size_t{1} << 19;

/// Limits every parse of JSON input enforces while it reads, HTTP bodies,
/// control-socket lines and files alike: a document that passes one is
/// refused at the byte where it does, before the rest is read or built.
/// Parsing is linear in time and memory: members are appended in document
/// order without the ordered map's linear search (a duplicate key keeps its
/// first place and its last value, as nlohmann does).
struct Limits {
  int max_depth = kMaxDepth;                  ///< arrays and objects nested
  std::size_t max_keys = kMaxKeys;            ///< members of one object
  std::size_t max_elements = kMaxValues;      ///< elements of one array
  std::size_t max_values = kMaxValues;        ///< values in the document
};

/// Why a text was not parsed: a syntax error, a number past a double, or a
/// limit. An InputError (exit 2) that also says where.
class ParseError : public InputError {
 public:
  ParseError(std::string message, std::size_t byte, std::string limit)
      : InputError(std::move(message)), byte_(byte), limit_(std::move(limit)) {}
  /// 1-based offset of the byte at fault (for a limit passed by a number,
  /// the byte after it, which ends it); 0 when the parser names none.
  std::size_t byte() const noexcept { return byte_; }
  /// The limit passed ("max_depth", "max_keys", "max_elements",
  /// "max_values"), or "" for a syntax error.
  const std::string& limit() const noexcept { return limit_; }

 private:
  std::size_t byte_;
  std::string limit_;
};

/// Parses text; errors (ParseError) name `source` and the line/column of a
/// syntax error, or the byte where a limit was passed.
Json parse(std::string_view text, std::string_view source, const Limits& limits = {});

/// Parses one line of a JSON Lines stream or of the control socket; errors
/// (ParseError) say "malformed JSON: " and what nlohmann found, or
/// "JSON over a limit: byte N: ...", for the caller to prefix with file and
/// line.
Json parse_line(std::string_view line, const Limits& limits = {});

/// The text of the number that member `key` of the top-level object holds,
/// exactly as written, or nullopt (not an object, no such member, not a
/// number). For values a double cannot hold exactly: a JSON-RPC id of 30
/// digits is answered with the same digits.
std::optional<std::string> member_number_text(std::string_view text, std::string_view key);

/// Reads a whole file, or stdin when path is "-". Errors name the file.
std::string read_text(const std::string& path);

/// Reads and parses a JSON file ("-" is stdin).
Json read_file(const std::string& path);

/// Checks that a document carries `"kind": expected`, else
/// "kind: expected ftp.topology/v1, got ftp.gear-table/v1".
void expect_kind(const Node& doc, std::string_view expected);

/// Rethrows e with "<source>: " before its message, keeping its exit code.
[[noreturn]] void rethrow_with_source(const std::string& source, const std::exception& e);

/// Runs a document parser on a file's content and prefixes any InputError
/// with the file name: "gears.json: gears[2].tp: ...".
template <class Fn>
auto parse_file(const std::string& path, Fn&& parse_doc) {
  Json j = read_file(path);
  try {
    return parse_doc(j);
  } catch (const std::exception& e) {
    rethrow_with_source(path == "-" ? "<stdin>" : path, e);
  }
}


}  // namespace ftp::json
