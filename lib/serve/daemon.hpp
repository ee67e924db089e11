// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "doc/gear_table.hpp"
#include "model/model.hpp"
#include "serve/generate.hpp"
#include "serve/http.hpp"
#include "serve/service.hpp"

namespace ftp::serve {

/// Everything `ftp-serve` needs to run as a daemon.
struct DaemonOptions {
  std::string model_path;
  std::string tokenizer_path;
  std::string gears_path;          ///< a ftp.gear-table/v1 file; empty: one gear from gear_spec
  std::string gear_spec = "tp=1,pp=1,dp=1";
  std::string socket_path;         ///< control socket; empty: ipc::default_socket_path()
  HttpOptions http;
  ServiceConfig service;           ///< gears and model_name are filled in by run_daemon
  std::function<void(std::string_view)> log;  ///< one line per event
  /// Called once serving (HTTP port, socket path known), e.g. for tests.
  std::function<void(int http_port, const std::string& socket_path)> on_ready;
};

/// A one-gear table for a --gear layout: gear "tp<T>-pp<P>-dp<D>" on CPU
/// virtual devices vd0, vd1, ... (replica by replica, stage by stage).
doc::GearTable gear_table_for_spec(const model::HParams& hp, const std::string& model_name, const GearSpec& g);

/// Loads the model and gear table, starts the service, the control socket
/// and the HTTP API, tells systemd it is ready (Type=notify), then waits
/// for signals: SIGTERM or SIGINT stop accepting, drain every domain (a
/// shift in progress finishes first) and return 0; SIGHUP reloads the gear
/// table. Blocks SIGTERM/SIGINT/SIGHUP in the calling thread before any
/// thread starts, so call it from main. Throws ftp::Error on a start failure.
int run_daemon(DaemonOptions options);

}  // namespace ftp::serve
