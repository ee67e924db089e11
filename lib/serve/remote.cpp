// SPDX-License-Identifier: Apache-2.0
#include "serve/remote.hpp"

#include <regex>

#include <chrono>
#include <thread>

#include "core/error.hpp"
#include "doc/control.hpp"
#include "ipc/protocol.hpp"
#include "serve/service.hpp"

namespace ftp::serve {

using json::Json;

namespace {

/// Turns an RPC error into the exit code a tool reports.
[[noreturn]] void rethrow_rpc(const ipc::RpcError& e) {
  const std::string& n = e.name();
  Exit exit = e.exit();  // the protocol's own errors carry theirs (TooManyConnections: 3, IdleTimeout: 4, ...)
  if (n == "ftp.NoSuchGear" || n == "ftp.SameGear" || n == "ftp.InvalidParams" || n == "ftp.NoSuchDomain")
    exit = Exit::usage;
  else if (n == "ftp.DrainTimeout" || n == "ftp.Timeout")
    exit = Exit::timeout;
  else if (n == "ftp.ShuttingDown" || n == "ftp.Disconnected")
    exit = Exit::unreachable;
  throw Error(n + ": " + e.message(), exit);
}

}  // namespace

std::vector<double> parse_ramp(const std::string& text) {
  std::vector<double> out;
  if (text.empty()) return out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = std::min(text.find(',', pos), text.size());
    std::string part = text.substr(pos, end - pos);
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(part, &used);
    } catch (...) {
      used = 0;
    }
    if (used != part.size() || part.empty()) throw InputError("--ramp: \"" + part + "\" is not a number");
    out.push_back(v);
    pos = end + 1;
  }
  check_ramp(out, "--ramp");
  return out;
}

std::vector<std::string> parse_device_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    std::size_t end = std::min(text.find(',', pos), text.size());
    std::string part = text.substr(pos, end - pos);
    auto dash = part.find('-');
    if (dash != std::string::npos) {
      std::size_t digits = dash;
      while (digits > 0 && std::isdigit(static_cast<unsigned char>(part[digits - 1]))) --digits;
      std::string prefix = part.substr(0, digits);
      try {
        // The whole of each bound is a number, and a range names at most
        // 65536 devices (no cluster has more in one drain).
        const std::string lo = part.substr(digits, dash - digits), hi = part.substr(dash + 1);
        std::size_t used_lo = 0, used_hi = 0;
        const int a = std::stoi(lo, &used_lo), b = std::stoi(hi, &used_hi);
        if (used_lo != lo.size() || used_hi != hi.size() || a > b || b - a >= 65536) throw std::out_of_range("");
        for (int i = a; i <= b; ++i) out.push_back(prefix + std::to_string(i));
      } catch (...) {
        throw InputError("--devices: \"" + part + "\" is not a range like vd4-7 (at most 65536 devices)");
      }
    } else if (!part.empty()) {
      out.push_back(part);
    }
    pos = end + 1;
  }
  return out;
}

Json remote_shift(ipc::Client& client, const ShiftRequest& req, const std::function<void(const Json&)>& on_event) {
  Json p{{"to", req.to}, {"trigger", req.trigger}};
  if (!req.ramp.empty()) p["ramp"] = req.ramp;
  if (req.step_interval_ms >= 0) p["step_interval_ms"] = req.step_interval_ms;
  if (!req.inject_fault.empty()) p["inject_fault"] = req.inject_fault;
  for (;;) {
    try {
      auto done = client.stream("shift", p, [&](const Json& e) {
        on_event(e);
        return true;
      });
      if (!done) throw Error("shift: the daemon closed the stream before the shift ended", Exit::unreachable);
      return *done;
    } catch (const ipc::RpcError& e) {
      if (!(req.queue && e.name() == "ftp.ShiftInProgress")) rethrow_rpc(e);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int shift_exit_code(const Json& done) {
  std::string outcome = done.value("outcome", "");
  if (outcome == "committed") return 0;
  if (outcome == "rolled-back") return static_cast<int>(Exit::check_failed);
  return static_cast<int>(Exit::failure);
}

int execute_decisions(ipc::Client& client, std::istream& in, const ShiftRequest& defaults,
                      const std::function<void(const Json&)>& on_event,
                      const std::function<void(std::string_view)>& warn, const std::function<void(const Json&)>& on_done) {
  int worst = 0;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    doc::Decision d;
    try {
      d = doc::decision_from_json(json::parse_line(line));
    } catch (const std::exception& e) {
      warn("stdin:" + std::to_string(n) + ": " + e.what() + "; line skipped");
      worst = std::max(worst, static_cast<int>(Exit::usage));
      continue;
    }
    if (d.action != "shift") continue;
    if (d.not_before_ms > d.t_ms) {
      // A staggered decision (replicas that would shift together): wait out
      // its offset, counted from the decision, as ftp-serve --auto does.
      const auto wait_ms = std::min<std::int64_t>(d.not_before_ms - d.t_ms, 3600000);
      warn("stdin:" + std::to_string(n) + ": shift to " + d.to + " staggered: waiting " + std::to_string(wait_ms) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    }
    ShiftRequest r = defaults;
    r.to = d.to;
    r.trigger = "policy:" + d.policy;
    if (!d.ramp.empty()) r.ramp = d.ramp;  // the policy's own (urgent path), else the defaults'
    if (d.ramp_step_ms >= 0) r.step_interval_ms = static_cast<int>(std::min<std::int64_t>(d.ramp_step_ms, 3600000));
    // A fresh connection for each shift: between decisions (holds, often
    // minutes of them) the daemon closes an idle one (ftp.IdleTimeout).
    client.close();
    client.connect();
    try {
      Json done = remote_shift(client, r, on_event);
      on_done(done);
      worst = std::max(worst, shift_exit_code(done));
    } catch (const Error& e) {
      // A refused decision (a shift in progress, the same gear) does not stop the stream.
      if (e.exit() == Exit::unreachable) throw;
      warn("stdin:" + std::to_string(n) + ": shift to " + d.to + " refused: " + e.what());
      // Already in that gear (a policy repeating its decision) is no failure.
      if (std::string_view(e.what()).rfind("ftp.SameGear", 0) != 0) worst = std::max(worst, static_cast<int>(Exit::failure));
    }
  }
  return worst;
}

Json remote_drain(ipc::Client& client, const std::string& domain, const std::vector<std::string>& devices, bool force,
                  int timeout_ms, const std::function<void(const Json&)>& on_event) {
  Json p{{"force", force}, {"timeout_ms", timeout_ms}};
  if (!domain.empty()) p["domain"] = domain;
  if (!devices.empty()) p["devices"] = devices;
  try {
    auto done = client.stream("drain", p, [&](const Json& e) {
      on_event(e);
      return true;
    });
    if (!done) throw Error("drain: the daemon closed the stream before the drain ended", Exit::unreachable);
    return *done;
  } catch (const ipc::RpcError& e) {
    rethrow_rpc(e);
  }
}

std::vector<json::Json> shift_history(ipc::Client& client, const std::string& since) {
  // The journal's times are "YYYY-MM-DDTHH:MM:SS.mmmZ": `since` in that
  // form compares as text.
  std::string from;
  if (!since.empty()) {
    static const std::regex iso(R"(^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.(\d{1,3}))?Z$)");
    std::smatch m;
    if (!std::regex_match(since, m, iso))
      throw InputError("--since: expected an ISO 8601 UTC time such as 2026-12-02T04:00:00Z, got \"" + since + "\"");
    std::string frac = m[3].str();
    frac.resize(3, '0');
    from = m[1].str() + "." + frac + "Z";
  }
  std::vector<json::Json> out;
  const json::Json records = client.call("records");
  if (!records.is_array()) throw Error("records: the daemon did not answer an array");
  for (const auto& r : records) {
    if (!from.empty() && !(r.contains("time") && r["time"].is_string() && r["time"].get<std::string>() >= from)) continue;
    out.push_back(r);
  }
  return out;
}

}  // namespace ftp::serve
