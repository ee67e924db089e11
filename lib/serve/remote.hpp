// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.hpp"
#include "ipc/client.hpp"

/// What ftp-shift and ftp-drain do over the control socket, kept out of
/// their main() so it is tested and shared.
namespace ftp::serve {

struct ShiftRequest {
  std::string to;
  std::vector<double> ramp;        ///< empty: the daemon's
  int step_interval_ms = -1;       ///< < 0: the daemon's
  std::string trigger = "manual";
  std::string inject_fault;
  bool queue = false;              ///< wait while another shift runs instead of failing
};

/// "0.1,0.5,1.0" -> {0.1, 0.5, 1.0}; "" -> {}. Each in (0, 1], increasing, ending at 1.
std::vector<double> parse_ramp(const std::string& text);

/// "vd0,vd2" or "vd4-7" (indices 4..7 of the prefix) -> device ids.
std::vector<std::string> parse_device_list(const std::string& text);

/// Calls the shift method, streaming events to on_event; returns the closing
/// record. With `queue`, a refusal because another shift runs
/// (ftp.ShiftInProgress) is retried every 100 ms until this shift starts. RPC errors become ftp::Error with the exit code of STYLE.md:
/// 2 for a bad request (no such gear, same gear), 3 when unreachable, 1 else.
json::Json remote_shift(ipc::Client& client, const ShiftRequest& req,
                        const std::function<void(const json::Json&)>& on_event);

/// 0 for a committed shift, 6 for a rollback, 1 for a failure.
int shift_exit_code(const json::Json& done);

/// The daemon's shift records (`records`: its journal), oldest first; with
/// `since` (ISO 8601 UTC, "2026-12-02T04:00:00Z", fraction optional) only
/// those whose "time" is at or after it. Throws InputError for a bad `since`.
std::vector<json::Json> shift_history(ipc::Client& client, const std::string& since);

/// Reads ftp.decision/v1 JSON Lines and executes each "shift" (a "hold" is
/// skipped; a decision with not_before_ms is executed when read: the
/// producer paces the stream). A bad line is skipped with a warning naming
/// its number. Returns the worst exit code (6 if any shift rolled back).
int execute_decisions(ipc::Client& client, std::istream& in, const ShiftRequest& defaults,
                      const std::function<void(const json::Json&)>& on_event,
                      const std::function<void(std::string_view)>& warn,
                      const std::function<void(const json::Json&)>& on_done);

/// Calls the drain method; returns {"drained": [...], "waited": n}.
json::Json remote_drain(ipc::Client& client, const std::string& domain, const std::vector<std::string>& devices,
                        bool force, int timeout_ms, const std::function<void(const json::Json&)>& on_event);

}  // namespace ftp::serve
