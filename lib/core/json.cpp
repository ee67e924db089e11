// SPDX-License-Identifier: Apache-2.0
#include "core/json.hpp"

#include <limits>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "core/error.hpp"

namespace ftp::json {

namespace {

const char* type_name(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

std::string brief(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace

std::string Node::child_path(std::string_view key) const {
  if (path_.empty()) return std::string(key);
  return path_ + "." + std::string(key);
}

void Node::fail(std::string_view why) const {
  throw InputError((path_.empty() ? std::string("document") : path_) + ": " + std::string(why));
}

void Node::expect_object() const {
  if (!v_->is_object()) fail(std::string("expected an object, got ") + type_name(*v_));
}

void Node::expect_array() const {
  if (!v_->is_array()) fail(std::string("expected an array, got ") + type_name(*v_));
}

bool Node::has(std::string_view key) const {
  if (!v_->is_object()) return false;
  auto it = v_->find(key);
  return it != v_->end() && !it->is_null();
}

Node Node::at(std::string_view key) const {
  expect_object();
  auto it = v_->find(key);
  if (it == v_->end() || it->is_null()) throw InputError(child_path(key) + ": missing required field");
  return Node(*it, child_path(key));
}

std::optional<Node> Node::find(std::string_view key) const {
  expect_object();
  auto it = v_->find(key);
  if (it == v_->end() || it->is_null()) return std::nullopt;
  return Node(*it, child_path(key));
}

std::vector<Node> Node::items() const {
  expect_array();
  std::vector<Node> out;
  out.reserve(v_->size());
  for (std::size_t i = 0; i < v_->size(); ++i)
    out.emplace_back((*v_)[i], path_ + "[" + std::to_string(i) + "]");
  return out;
}

std::string Node::str() const {
  if (!v_->is_string()) fail(std::string("expected a string, got ") + type_name(*v_));
  return v_->get<std::string>();
}

std::int64_t Node::integer() const {
  // An unsigned value past INT64_MAX would wrap to a negative one.
  if (v_->is_number_unsigned() && v_->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    fail(std::string("integer ") + brief(*v_) + " is too large");
  if (v_->is_number_integer()) return v_->get<std::int64_t>();
  if (v_->is_number_float()) {
    double d = v_->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<std::int64_t>(d);
  }
  fail(std::string("expected an integer, got ") + brief(*v_));
}

double Node::number() const {
  if (!v_->is_number()) fail(std::string("expected a number, got ") + type_name(*v_));
  double d = v_->get<double>();
  if (!std::isfinite(d)) fail("expected a finite number");
  return d;
}

bool Node::boolean() const {
  if (!v_->is_boolean()) fail(std::string("expected true or false, got ") + type_name(*v_));
  return v_->get<bool>();
}

std::string Node::str_or(std::string_view key, std::string dflt) const {
  auto n = find(key);
  return n ? n->str() : dflt;
}

std::int64_t Node::integer_or(std::string_view key, std::int64_t dflt) const {
  auto n = find(key);
  return n ? n->integer() : dflt;
}

double Node::number_or(std::string_view key, double dflt) const {
  auto n = find(key);
  return n ? n->number() : dflt;
}

bool Node::boolean_or(std::string_view key, bool dflt) const {
  auto n = find(key);
  return n ? n->boolean() : dflt;
}

double Node::positive(std::string_view key, bool allow_zero) const {
  Node n = at(key);
  double d = n.number();
  if (d < 0 || (!allow_zero && d == 0))
    n.fail(std::string(allow_zero ? "must not be negative" : "must be positive") + ", got " + brief(n.value()));
  return d;
}

std::int64_t Node::positive_integer(std::string_view key, bool allow_zero) const {
  Node n = at(key);
  std::int64_t i = n.integer();
  if (i < 0 || (!allow_zero && i == 0))
    n.fail(std::string(allow_zero ? "must not be negative" : "must be positive") + ", got " + std::to_string(i));
  return i;
}

int Node::positive_int(std::string_view key, bool allow_zero) const {
  const std::int64_t i = positive_integer(key, allow_zero);
  if (i > std::numeric_limits<int>::max())
    at(key).fail("must be at most " + std::to_string(std::numeric_limits<int>::max()) + ", got " + std::to_string(i));
  return static_cast<int>(i);
}

std::string Node::one_of(std::string_view key, const std::vector<std::string>& choices) const {
  Node n = at(key);
  std::string s = n.str();
  for (const auto& c : choices)
    if (c == s) return s;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  n.fail("must be one of " + list + ", got \"" + s + "\"");
}

std::string dump(const Json& doc, Style style) {
  return style == Style::pretty ? doc.dump(2) : doc.dump();
}


std::string read_text(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw InputError(path + ": read error");
  return ss.str();
}

Json read_file(const std::string& path) {
  return parse(read_text(path), path == "-" ? "<stdin>" : path);
}

void expect_kind(const Node& doc, std::string_view expected) {
  doc.expect_object();
  auto k = doc.find("kind");
  if (!k) throw InputError("kind: missing, expected \"" + std::string(expected) + "\"");
  std::string got = k->str();
  if (got != expected)
    throw InputError("kind: expected \"" + std::string(expected) + "\", got \"" + got + "\"");
}

void rethrow_with_source(const std::string& source, const std::exception& e) {
  if (auto* ie = dynamic_cast<const InputError*>(&e)) throw InputError(source + ": " + ie->what());
  if (auto* fe = dynamic_cast<const Error*>(&e)) throw Error(source + ": " + fe->what(), fe->exit());
  throw Error(source + ": " + e.what());
}

}  // namespace ftp::json
