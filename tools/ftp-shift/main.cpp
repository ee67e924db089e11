// SPDX-License-Identifier: Apache-2.0
// ftp-shift: ask the daemon to shift gear, or execute decisions read on stdin.
#include <iostream>

#include "cli/tool.hpp"
#include "core/error.hpp"
#include "doc/control.hpp"
#include "ipc/client.hpp"
#include "serve/remote.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-shift",
                      "Ask a running ftp-serve to shift to a gear: reserve devices, warm a shadow domain, ramp\n"
                      "traffic with checks, drain and retire the old domains; it rolls back by itself on a failed\n"
                      "check. Or execute ftp.decision/v1 JSON Lines read on stdin (--from-stdin).");
  ftp::serve::ShiftRequest req;
  std::string ramp;
  bool follow = false, from_stdin = false, history = false;
  std::string since;
  auto& app = tool.app();
  app.add_option("--to", req.to, "Target gear")->option_text("GEAR");
  app.add_option("--ramp", ramp, "Traffic shares of the ramp (default the daemon's, 0.1,0.5,1.0)")->option_text("LIST");
  app.add_option("--step-interval", req.step_interval_ms, "Wait at each ramp step, ms (default the daemon's)")
      ->check(ftp::cli::non_negative())
      ->option_text("MS");
  app.add_option("--trigger", req.trigger, "What asked for the shift, for the record (default manual)");
  app.add_flag("-f,--follow", follow, "Print every ftp.shift-event/v1 as it happens (JSON Lines)");
  app.add_flag("--queue", req.queue, "Wait while another shift runs instead of failing with ftp.ShiftInProgress");
  app.add_flag("--from-stdin", from_stdin, "Execute ftp.decision/v1 JSON Lines from stdin (action shift; hold is skipped)");
  tool.add_socket_option("");
  app.add_option("--inject-fault", req.inject_fault,
                 "Fault injection for tests: 'check' fails the first ramp check (a test hook: the daemon must enable them)")
      ->check(CLI::IsMember({"check"}));
  app.add_flag("--history", history,
                "Print the daemon's shift records (its journal: earlier runs and interrupted shifts too), JSON Lines");
  app.add_option("--since", since, "With --history: only records at or after TIME (ISO 8601 UTC, e.g. 2026-12-02T04:00:00Z)")
      ->option_text("TIME");
  app.get_option("--to")->excludes(app.get_option("--from-stdin"));
  app.get_option("--history")->excludes(app.get_option("--to"))->excludes(app.get_option("--from-stdin"));

  return tool.run(argc, argv, [&]() -> int {
    if (history) {
      ftp::ipc::Client client(tool.socket_path());
      for (const auto& r : ftp::serve::shift_history(client, since)) tool.emit_line(r);
      return 0;
    }
    if (!since.empty()) throw ftp::InputError("--since: only with --history");
    if (req.to.empty() && !from_stdin) throw ftp::InputError("give --to GEAR, --from-stdin or --history");
    req.ramp = ftp::serve::parse_ramp(ramp);
    ftp::ipc::Client client(tool.socket_path());
    auto on_event = [&](const ftp::json::Json& e) {
      if (follow) tool.emit_line(e);
      tool.progress(e.value("phase", "") + " " + e.value("message", ""));
    };
    if (!from_stdin) {
      ftp::json::Json done = ftp::serve::remote_shift(client, req, on_event);
      if (!follow) tool.emit(done);
      return ftp::serve::shift_exit_code(done);
    }
    return ftp::serve::execute_decisions(client, std::cin, req, on_event,
                                         [&](std::string_view w) { tool.warn(w); },
                                         [&](const ftp::json::Json& d) { if (!follow) tool.emit_line(d); });
  });
}
