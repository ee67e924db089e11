// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>

namespace ftp {

/// `v` with \ and " preceded by a backslash and newlines written \n: the
/// inside of a double-quoted value in a key=value log line and in a label
/// of the Prometheus text format.
inline std::string backslash_escape(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

/// `v` as the inside of a double-quoted value of a key=value log line:
/// backslash_escape, and every other control byte (carriage return,
/// escape, ...) and DEL written \xNN, so that no client-given text can end
/// a line or drive a terminal.
inline std::string log_escape(std::string_view v) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      if (c == '\\' || c == '"') out += '\\';
      out += ch;
    }
  }
  return out;
}

/// Text read from a file, fit for a one-line error message: control bytes
/// (newline, escape, ...) and DEL written \xNN, at most `max` bytes kept
/// ("..." after a longer one). Bytes of 0x80 and above stay (UTF-8).
inline std::string printable(std::string_view v, std::size_t max = 200) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (v.size() > max) out += "...";
  return out;
}

}  // namespace ftp
