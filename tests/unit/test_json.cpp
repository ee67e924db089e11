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

}  // namespace

// Nesting past kMaxDepth is refused before parsing (nlohmann copies values
// recursively: a deep one overflowed the stack); brackets in strings do
// not count.
TEST(Json, NestingDepthIsBounded) {
  using ftp::json::kMaxDepth;
  using ftp::json::too_deep;
  auto nest = [](int d) { return std::string(d, '[') + std::string(d, ']'); };
  EXPECT_EQ(too_deep(nest(kMaxDepth)), std::string_view::npos);
  EXPECT_EQ(too_deep(nest(kMaxDepth + 1)), static_cast<std::size_t>(kMaxDepth));
  EXPECT_EQ(too_deep("{\"a\": \"" + std::string(1000, '[') + "\\\"[\"}"), std::string_view::npos);
  EXPECT_NO_THROW(ftp::json::parse(nest(kMaxDepth), "x"));
  const std::string deep = "{\"a\":" + nest(200000) + ",\"b\":1}";
  EXPECT_EQ(error_of([&] { ftp::json::parse(deep, "body.json"); }),
            "body.json: byte " + std::to_string(kMaxDepth + 5) + ": nesting deeper than 128 arrays or objects");
  EXPECT_NE(error_of([&] { ftp::json::parse_line(deep); }).find("nesting deeper than 128"), std::string::npos);
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
