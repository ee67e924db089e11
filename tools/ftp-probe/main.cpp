// SPDX-License-Identifier: Apache-2.0
// ftp-probe: discover and measure devices, links and islands.
#include "cli/tool.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-probe", "Discover and measure devices, links and islands; print ftp.topology/v1.");
  return tool.run(argc, argv, [&] {
    tool.emit(ftp::json::Json{{"kind", "ftp.topology/v1"}});
    return 0;
  });
}
