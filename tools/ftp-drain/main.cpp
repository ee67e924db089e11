// SPDX-License-Identifier: Apache-2.0
// ftp-drain: stop new work on a domain or devices, wait, release the devices.
#include "cli/tool.hpp"
#include "core/error.hpp"
#include "ipc/client.hpp"
#include "serve/remote.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-drain",
                      "Stop new work on a domain (or on every domain holding some devices), wait for its in-flight\n"
                      "requests, retire it and release its devices. Draining the last serving domain needs --force.");
  std::string domain, devices;
  bool force = false, follow = false;
  int timeout_s = 600;
  auto& app = tool.app();
  app.add_option("--domain", domain, "Domain id, as the status method or ftp-probe watch output shows it")->option_text("ID");
  app.add_option("--devices", devices, "Devices: vd0,vd1 or a range of indices such as vd4-7")->option_text("LIST");
  app.add_flag("--force", force, "Allow draining the last serving domain (the daemon then refuses new requests)");
  app.add_option("--timeout", timeout_s, "Give up after this many seconds, at most 2000000 (exit 4; default 600)")
      ->check(ftp::cli::in_range(1, 2000000))
      ->option_text("S");
  app.add_flag("-f,--follow", follow, "Print progress as JSON Lines");
  tool.add_socket_option("");

  return tool.run(argc, argv, [&]() -> int {
    if (domain.empty() == devices.empty()) throw ftp::InputError("give exactly one of --domain ID or --devices LIST");
    // A bad list is a usage error whether or not a daemon is there.
    const std::vector<std::string> device_list = ftp::serve::parse_device_list(devices);
    ftp::ipc::Client client(tool.socket_path());
    ftp::json::Json done = ftp::serve::remote_drain(
        client, domain, device_list, force, timeout_s * 1000, [&](const ftp::json::Json& e) {
          if (follow) tool.emit_line(e);
          tool.progress(e.dump());
        });
    tool.emit(done);
    return 0;
  });
}
