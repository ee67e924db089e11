// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/escape.hpp"
#include "core/json.hpp"

using ftp::InputError;
using ftp::json::Json;
using ftp::json::Node;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string keys_object(std::size_t n) {
  std::string t = "{";
  for (std::size_t i = 0; i < n; ++i) t += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  return t + "}";
}

ftp::json::ParseError parse_error_of(std::string_view text, const ftp::json::Limits& limits = {}) {
  try {
    ftp::json::parse(text, "body", limits);
  } catch (const ftp::json::ParseError& e) {
    return e;
  }
  ADD_FAILURE() << "parsed, not refused";
  return ftp::json::ParseError("", 0, "");
}

}  // namespace

// Issue 20, hostile input 1 and item 7: nesting past kMaxDepth is refused
// while parsing, at the byte where it passes the limit (nlohmann copies
// values recursively: a deep one overflowed the stack); brackets in strings
// do not count.
TEST(Json, NestingDepthIsBoundedWhileParsing) {
  using ftp::json::kMaxDepth;
  auto nest = [](int d) { return std::string(d, '[') + std::string(d, ']'); };
  EXPECT_NO_THROW(ftp::json::parse(nest(kMaxDepth), "x"));
  EXPECT_NO_THROW(ftp::json::parse("{\"a\": \"" + std::string(1000, '[') + "\\\"[\"}", "x"));
  const std::string deep = "{\"a\":" + nest(200000) + ",\"b\":1}";
  EXPECT_EQ(error_of([&] { ftp::json::parse(deep, "body.json"); }),
            "body.json: byte " + std::to_string(kMaxDepth + 5) + ": nesting deeper than 128 arrays or objects");
  EXPECT_EQ(parse_error_of(deep).limit(), "max_depth");
  EXPECT_EQ(parse_error_of(deep).byte(), static_cast<std::size_t>(kMaxDepth + 5));
  EXPECT_NE(error_of([&] { ftp::json::parse_line(deep); }).find("nesting deeper than 128"), std::string::npos);
}

// Issue 20, hostile input 1: an object of 80,000 keys (869 KB; 7.7 s of a
// core through the ordered map's linear insert) is refused at the key past
// kMaxKeys, before the rest is read.
TEST(Json, KeysPerObjectAreBounded) {
  const std::string body = keys_object(80000);
  const auto e = parse_error_of(body);
  EXPECT_EQ(e.limit(), "max_keys");
  const std::string past = "\"k" + std::to_string(ftp::json::kMaxKeys) + "\"";
  const std::size_t byte = body.find(past) + past.size();  // the refused key's closing quote
  EXPECT_EQ(e.byte(), byte);
  EXPECT_EQ(std::string(e.what()), "body: byte " + std::to_string(byte) + ": an object of more than 4096 keys");
  EXPECT_NO_THROW(ftp::json::parse(keys_object(ftp::json::kMaxKeys), "body"));
  // Nested objects each have their own count.
  EXPECT_NO_THROW(ftp::json::parse("[" + keys_object(4000) + "," + keys_object(4000) + "]", "body"));
}

// Item 7: members are appended without the ordered map's search, in
// document order, so a table read and written again keeps its order; a
// duplicate keeps its first place and takes the last value, in small
// objects (scanned) and large ones (a hash index) alike.
TEST(Json, MembersKeepDocumentOrderAndLastDuplicateWins) {
  Json j = ftp::json::parse(R"({"z":1,"a":2,"m":{"y":1,"b":2},"z":3})", "x");
  EXPECT_EQ(j.dump(), R"({"z":3,"a":2,"m":{"y":1,"b":2}})");
  std::string big = keys_object(100);
  big.insert(big.size() - 1, ",\"k7\":\"last\",\"k99\":null");
  Json b = ftp::json::parse(big, "x");
  ASSERT_EQ(b.size(), 100u);
  EXPECT_EQ(b["k7"], "last");
  EXPECT_TRUE(b["k99"].is_null());
  EXPECT_EQ(b.begin().key(), "k0");
  EXPECT_EQ(std::next(b.begin(), 7).key(), "k7");
  EXPECT_EQ(std::prev(b.end()).key(), "k99");
  // With the limit raised, the 80,000-key object parses whole, in order.
  ftp::json::Limits wide;
  wide.max_keys = 100000;
  Json all = ftp::json::parse(keys_object(80000), "x", wide);
  ASSERT_EQ(all.size(), 80000u);
  EXPECT_EQ(std::prev(all.end()).key(), "k79999");
  EXPECT_EQ(all["k40000"], 40000);
}

// Issue 20, hostile input 4: a 16 MB body of [] pairs (375 MB per request
// before) is refused once it holds kMaxValues values, which bounds what it
// allocates (each empty array is ~48 bytes); tests/tools/json-memory.sh
// measures the RSS.
TEST(Json, ValuesPerDocumentAreBounded) {
  std::string pairs = "[";
  while (pairs.size() < (16u << 20)) pairs += "[],";
  pairs += "[]]";
  const auto e = parse_error_of(pairs);
  EXPECT_EQ(e.limit(), "max_values");
  // The refused pair is value kMaxValues + 1 (the outer array is the first);
  // pair i's '[' is byte 2 + 3 i.
  EXPECT_EQ(e.byte(), 2 + 3 * (ftp::json::kMaxValues - 1));
  EXPECT_NE(std::string(e.what()).find("more than 524288 values in one document"), std::string::npos);

  ftp::json::Limits small;
  small.max_elements = 3;
  EXPECT_NO_THROW(ftp::json::parse("[1,2,3]", "x", small));
  EXPECT_EQ(parse_error_of("[1,2,3,4]", small).limit(), "max_elements");
  // A number ends where the lexer reads the byte after it: the ']'.
  EXPECT_EQ(parse_error_of("[1,2,3,4]", small).byte(), 9u);
  small = {};
  small.max_values = 4;
  EXPECT_NO_THROW(ftp::json::parse(R"({"a":[1,2]})", "x", small));
  EXPECT_EQ(parse_error_of(R"({"a":[1,2,3]})", small).limit(), "max_values");
}

// Syntax errors and numbers past a double keep their messages.
TEST(Json, SyntaxAndOverflowErrors) {
  EXPECT_EQ(error_of([] { ftp::json::parse("[1e400]", "x.json"); }).rfind("x.json: number overflow", 0), 0u);
  EXPECT_EQ(error_of([] { ftp::json::parse_line("{\"a\":1e400}"); }).rfind("malformed JSON: number overflow", 0), 0u);
  const auto e = parse_error_of("{\"a\" 1}");
  EXPECT_EQ(e.limit(), "");
  EXPECT_EQ(e.byte(), 6u);
  EXPECT_EQ(error_of([] { ftp::json::parse_line("[1,]"); }).rfind("malformed JSON: syntax error", 0), 0u);
  EXPECT_EQ(ftp::json::parse("  7 ", "x"), 7);
}

// Issue 20, item 8 (a 30-digit JSON-RPC id comes back as a float): the text
// of a top-level member's number as written.
TEST(Json, MemberNumberTextIsExact) {
  using ftp::json::member_number_text;
  const std::string line =
      R"({"jsonrpc":"2.0","params":{"id":5,"x":[1,{"id":2}]},"id":123456789012345678901234567890,"method":"m"})";
  EXPECT_EQ(member_number_text(line, "id"), "123456789012345678901234567890");
  EXPECT_EQ(member_number_text(R"({"id":-1.50e3})", "id"), "-1.50e3");
  EXPECT_EQ(member_number_text(R"({"id":42})", "id"), "42");
  EXPECT_EQ(member_number_text(R"({"id":"42"})", "id"), std::nullopt);
  EXPECT_EQ(member_number_text(R"({"id":[42]})", "id"), std::nullopt);
  EXPECT_EQ(member_number_text(R"({"a":{"id":42}})", "id"), std::nullopt);
  EXPECT_EQ(member_number_text(R"([42])", "id"), std::nullopt);
}

// Client text in a log line stays on one line and drives no terminal.
TEST(Escape, LogEscapeWritesControlBytes) {
  EXPECT_EQ(ftp::log_escape("a\"b\\c\nd\re\x1b[2J"), "a\\\"b\\\\c\\nd\\x0de\\x1b[2J");
  EXPECT_EQ(ftp::log_escape("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 stays
}

TEST(Json, PathOfNestedFieldInError) {
  Json j = Json::parse(R"({"gears":[{"tp":1},{"tp":2},{"tp":"x"}]})");
  Node root(j, "");
  auto gears = root.at("gears").items();
  EXPECT_EQ(error_of([&] { gears[2].integer("tp"); }), "gears[2].tp: expected an integer, got \"x\"");
  EXPECT_EQ(error_of([&] { gears[1].str("name"); }), "gears[1].name: missing required field");
}

TEST(Json, PositiveAndOneOf) {
  Json j = Json::parse(R"({"memory_bytes":-1,"type":"tpu","n":0})");
  Node root(j, "");
  EXPECT_EQ(error_of([&] { root.positive("memory_bytes"); }), "memory_bytes: must be positive, got -1");
  EXPECT_EQ(error_of([&] { root.positive_integer("n"); }), "n: must be positive, got 0");
  EXPECT_EQ(root.positive_integer("n", true), 0);
  EXPECT_EQ(error_of([&] { root.one_of("type", {"cpu", "gpu"}); }), "type: must be one of cpu, gpu, got \"tpu\"");
}

TEST(Json, IntegerAcceptsIntegralFloatOnly) {
  Json j = Json::parse(R"({"a":4.0,"b":4.5})");
  Node root(j, "");
  EXPECT_EQ(root.integer("a"), 4);
  EXPECT_NE(error_of([&] { root.integer("b"); }).find("b: expected an integer"), std::string::npos);
}

TEST(Json, MalformedTextNamesSourceLineAndColumn) {
  std::string msg = error_of([] { ftp::json::parse("{\n  \"a\": 1,\n  \"b\": }\n", "x.json"); });
  EXPECT_EQ(msg.rfind("x.json:3:", 0), 0u) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos);
}

TEST(Json, KindIsChecked) {
  Json j = Json::parse(R"({"kind":"ftp.gear-table/v1"})");
  EXPECT_EQ(error_of([&] { ftp::json::expect_kind(Node(j, ""), "ftp.topology/v1"); }),
            "kind: expected \"ftp.topology/v1\", got \"ftp.gear-table/v1\"");
  Json none = Json::object();
  EXPECT_NE(error_of([&] { ftp::json::expect_kind(Node(none, ""), "ftp.topology/v1"); }).find("kind: missing"),
            std::string::npos);
}

TEST(Json, MissingFileNamesTheFile) {
  std::string msg = error_of([] { ftp::json::read_file("/nonexistent/t.json"); });
  EXPECT_EQ(msg.rfind("/nonexistent/t.json: cannot open", 0), 0u) << msg;
}
