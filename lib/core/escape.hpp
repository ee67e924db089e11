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

}  // namespace ftp
