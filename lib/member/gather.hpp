// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <string>

#include "comm/gloo.hpp"
#include "doc/topology.hpp"
#include "core/json.hpp"

namespace ftp::member {

class Leader;

/// One all-reduce measurement between machines: every process of the
/// service (the leader and each member, one rank each) runs the same
/// sequence on one Gloo group, so that the leader's timings are the
/// group's. Sizes as ftp-probe's islands: a 4 KiB all-reduce for latency,
/// `bytes` for bus bandwidth (nccl-tests' definitions, doc::AllReduce).
struct NetworkProbe {
  std::size_t bytes = 4u << 20;
  int iterations = 10;          ///< of `bytes`, after one warm-up
  int latency_iterations = 50;  ///< of 4 KiB, after one warm-up
};
json::Json to_json(const NetworkProbe& p);
/// Reads {"bytes", "iterations", "latency_iterations"}, each within sane
/// bounds (a member never runs an unbounded measurement); errors name the field.
NetworkProbe network_probe_from_json(const json::Json& j);

/// Runs `p` on `group` (every rank calls it). Returns the AllReduce as this
/// rank timed it (via "gloo").
doc::AllReduce run_network_probe(comm::GlooGroup& group, const NetworkProbe& p);

/// A member's own probe with its names made the service's: devices, their
/// parents, links, fabrics and islands get "NAME/" in front ("n1/vd0", as
/// the device pool names them), its node becomes NAME.
doc::Topology member_topology(const doc::Topology& probe, const std::string& name);

/// What gather_topology asks of each member and how long it waits.
struct GatherOptions {
  bool quick = true;            ///< the members' probes in quick mode
  NetworkProbe network;
  int timeout_ms = 120000;      ///< for each member's probe and for the measurement
  comm::GlooOptions gloo;       ///< the leader's rank of the measurement group (its timeout: each operation's)
};

/// One ftp.topology/v1 for the whole service (issue 16): the leader's own
/// probe `local` as it is, each live member's probe (the protocol's "probe"
/// request) renamed by member_topology -- one node and island per machine --
/// and, with at least one member, a fabric "network0" of type "ethernet"
/// over every device, whose bandwidth and latency are those of an
/// all-reduce across the machines (the "netprobe" request: one Gloo rank
/// per process, measured by the leader). The planner keeps tensor
/// parallelism inside an island and so puts pipeline boundaries between
/// machines. Throws Error naming a member that fails or is late.
doc::Topology gather_topology(Leader& leader, doc::Topology local, const GatherOptions& options);

}  // namespace ftp::member
