// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sstream>
#include <string>

namespace ftp {

/// A number as people read it in messages: std::ostream's default (six
/// significant digits, no trailing zeros: 0.1, 1.5, 1e+06).
inline std::string number_text(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace ftp
