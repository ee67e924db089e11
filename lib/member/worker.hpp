// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>

#include "comm/gloo.hpp"
#include "model/model.hpp"

namespace ftp::member {

/// What `ftp-serve --join` runs: a member process that hosts its
/// machine's devices and runs the ranks the leader places on them.
struct WorkerOptions {
  std::string leader;         ///< "HOST:PORT" of the leader's member channel
  std::string secret;         ///< load_secret of --secret-file
  std::string name;           ///< this machine's name in device names ("n1")
  int virtual_devices = 2;    ///< CPU virtual devices vd0..vd<N-1>
  comm::GlooOptions gloo;     ///< where this process's Gloo pairs bind, and their timeout
  int handshake_timeout_ms = 5000;
};

/// Joins the leader and serves until the channel ends: the protocol's
/// requests are "build" (make this process's ranks of a domain, meet its
/// group, then run each step plan the leader sends: engine::Placement),
/// "retire", "probe" (this machine's topology, measured) and "netprobe"
/// (its rank of an all-reduce between machines, gather_topology); anything
/// else is answered with an error and nothing is run.
/// Returns 0 when the leader closes the channel; throws ProtocolError when
/// the leader refuses it (wrong secret, version, name taken) or cannot be
/// authenticated, Error when it cannot be reached. `log` gets one line per event.
int run_worker(const WorkerOptions& options, const model::Model& model, const std::function<void(const std::string&)>& log);

}  // namespace ftp::member
