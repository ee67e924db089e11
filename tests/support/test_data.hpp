// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdlib>
#include <string>

/// Where tests find the shared data (../shared/data: models, vocabularies,
/// traces): $FTP_TEST_DATA, else ../shared/data relative to the working
/// directory. Tests skip with a message naming the path when a file is absent.
namespace ftp::test {

inline std::string data_dir() {
  const char* d = std::getenv("FTP_TEST_DATA");
  return d && *d ? d : "../shared/data";
}

/// A file of the stories260K model folder.
inline std::string stories260k(const std::string& file) { return data_dir() + "/models/stories260K/" + file; }

}  // namespace ftp::test
