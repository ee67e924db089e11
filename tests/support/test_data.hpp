// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

/// The token ids of stories260K's golden greedy output, 256 steps from BOS
/// (the last line that is not a comment); empty when the file is absent.
inline std::vector<int> stories260k_golden_ids() {
  std::ifstream f(stories260k("golden_greedy_t0_steps256_token_ids.txt"));
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty() && line[0] != '#') last = line;
  std::istringstream ss(last);
  std::vector<int> ids;
  for (int t; ss >> t;) ids.push_back(t);
  return ids;
}

}  // namespace ftp::test
