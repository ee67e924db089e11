// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ipc/server.hpp"
#include "serve/service.hpp"

namespace ftp::serve {

/// JSON-RPC error codes of the control methods (man ftp-protocol(7)).
struct ControlErrorCode {
  const char* name;
  int code;
  const char* summary;  ///< as introspect lists it
};
inline constexpr ControlErrorCode kControlErrors[] = {
    {"ftp.NoSuchGear", -32010, "no gear of that name in the gear table (or the new table lacks the current gear)"},
    {"ftp.ShiftInProgress", -32011, "one shift at a time: another shift is running"},
    {"ftp.SameGear", -32012, "the service already runs that gear"},
    {"ftp.NotServing", -32013, "the daemon is draining (SIGTERM)"},
    {"ftp.LastDomain", -32014, "draining the last serving domain needs force"},
    {"ftp.NoSuchDomain", -32015, "no domain of that id, or none on those devices"},
    {"ftp.WarmupFailed", -32016, "a new domain failed its warm-up"},
    {"ftp.DrainTimeout", -32017, "a drain whose domain still had requests after timeout_ms"},
    {"ftp.InvalidGearTable", -32018, "reload could not read or validate the gear table"},
    {"ftp.ProbeFailed", -32019, "topology: a measurement, or a member's probe, failed"},
};
int control_error_code(const std::string& name);

/// What the control socket's methods may do beyond the service's own calls.
struct ControlSocketOptions {
  /// What reload reads when called without a path.
  std::string gear_table_path;
  /// reload reads a given path only below this directory (after symlinks);
  /// a relative path is taken from it. Empty: only gear_table_path.
  std::string config_dir;
  /// Accept shift's inject_fault (a test hook); refused otherwise.
  bool test_hooks = false;
};

/// The control socket of a running Service: status, gears, shift, drain,
/// records, watch, reload (plus introspect), on an ipc::Server. Long calls
/// (shift, drain, watch) run on worker threads joined by stop().
class ControlSocket {
 public:
  ControlSocket(Service& service, ipc::ServerOptions options, ControlSocketOptions control);
  ~ControlSocket();
  void start();
  void stop();
  const std::string& socket_path() const noexcept { return path_; }

 private:
  std::vector<ipc::Method> methods();
  void spawn(std::function<void()> fn);
  Service& svc_;
  std::string path_;
  ControlSocketOptions opt_;
  std::unique_ptr<ipc::Server> server_;
  std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  ///< set when its function returned
  };
  std::vector<Worker> workers_;
  bool stopping_ = false;
};

}  // namespace ftp::serve
