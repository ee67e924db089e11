// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
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
  /// The control socket's reload reads a given path only below it; empty:
  /// the directory of gears_path (none without one).
  std::string config_dir;
  /// The shift journal's directory (--state-dir); empty: $STATE_DIRECTORY
  /// (systemd's StateDirectory=, its first entry), else /var/lib/flextp.
  /// A given one that cannot be written stops the daemon; the default
  /// falls back to records in memory, with a warning.
  std::string state_dir;
  /// Test hooks on the control socket (shift's inject_fault); off: refused.
  bool test_hooks = false;
  /// CPU virtual devices vd0..vd<N-1> the gears may use; 0: whatever the table names.
  int virtual_devices = 0;
  /// The engine behind the domains: "real" (the model's math on the CPU) or
  /// "sim" (sim::SimulatedEngine: the cost model's time on the topology's
  /// devices, waited out in real time; model_path may be a model-shape JSON).
  std::string engine = "real";
  std::string topology_path;              ///< sim: ftp.topology/v1 or ftp.cluster/v1
  std::optional<doc::Topology> topology;  ///< sim without topology_path (e.g. probed by ftp-serve)
  std::string calibration_path;           ///< sim: ftp.sim-calibration/v1; empty: the planner's constants
  HttpOptions http;
  /// Makes the HTTP front (ftp-serve: api::openai::make_front); required.
  HttpFrontFactory http_front;
  ServiceConfig service;           ///< gears and model_name are filled in by run_daemon
  std::function<void(std::string_view)> log;  ///< one line per event
  /// The control loop in-process (ftp-serve --auto): every observe_interval_ms
  /// an observation goes to the policy; its shift decisions are executed.
  bool auto_loop = false;
  std::string policy_path;               ///< ftp.policy/v1; empty: the defaults
  std::string policy_name = "gear-shifter";
  int observe_interval_ms = 1000;
  /// Members (ftp-multi-node(7)): the member channel's "HOST:PORT" (empty:
  /// one process), the shared secret's file, and how many members to wait
  /// for (up to members_wait_ms) before the start gear is built.
  std::string members_listen;
  std::string secret_file;
  int wait_members = 0;
  int members_wait_ms = 120000;
  /// Called once serving (HTTP port, socket path known), e.g. for tests.
  std::function<void(int http_port, const std::string& socket_path)> on_ready;
};

/// A one-gear table for a --gear layout: gear "tp<T>-pp<P>-dp<D>" on
/// `devices` in order (replica by replica, stage by stage; empty: CPU
/// virtual devices vd0, vd1, ...), named for `topology` (empty: the CPU
/// virtual devices, "cpu-virtual"). Throws InputError when there are too few.
doc::GearTable gear_table_for_spec(const model::HParams& hp, const std::string& model_name, const GearSpec& g,
                                   const std::vector<std::string>& devices = {}, const std::string& topology = "");

/// A topology of `n` CPU virtual devices vd0..vd<n-1> in one island (what
/// --virtual-devices offers), to check a gear table against.
doc::Topology virtual_topology(int n);

/// Loads the model and gear table, starts the service, the control socket
/// and the HTTP API, tells systemd it is ready (Type=notify), then waits
/// for signals: SIGTERM or SIGINT stop accepting, drain every domain (a
/// shift in progress finishes first) and return 0; SIGHUP reloads the gear
/// table. Blocks SIGTERM/SIGINT/SIGHUP in the calling thread before any
/// thread starts, so call it from main. Throws ftp::Error on a start failure.
int run_daemon(DaemonOptions options);

}  // namespace ftp::serve
