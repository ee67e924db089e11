// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

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

/// The byte offset where `text` nests arrays and objects deeper than
/// kMaxDepth, or npos. A scan of the bytes (strings skipped), before any
/// parse builds the value.
std::size_t too_deep(std::string_view text) noexcept;

/// Parses text; errors name `source` and the line/column of the fault.
Json parse(std::string_view text, std::string_view source);

/// Parses one line of a JSON Lines stream; errors say "malformed JSON: "
/// and what nlohmann found, for the caller to prefix with file and line.
Json parse_line(std::string_view line);

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
