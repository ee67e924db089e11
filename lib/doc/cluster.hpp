// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "core/json.hpp"
#include "doc/topology.hpp"

namespace ftp::doc {

/// Turns a cluster spec (ftp.cluster/v1, man ftp-cluster(5)) into a topology:
/// a described cluster that ftp-probe cannot see (remote nodes, MIG slices,
/// datasheet numbers). Devices get ids "<node>.<device>[<i>]", MIG slices
/// "<gpu>.<slice>"; fabrics join their devices all-to-all; islands are the
/// groups joined by island fabrics (NVLink, NVSwitch, PCIe, shared memory),
/// each with an estimated all-reduce (ring: busbw = slowest link bandwidth).
/// Errors name the JSON path: "nodes[1].devices[0].memory_gib: must be positive, got -8".
Topology topology_from_cluster_spec(const json::Json& spec);

/// Estimated ring all-reduce over n devices whose slowest link has the given
/// bandwidth (GB/s) and latency (us), for a message of `bytes`.
AllReduce estimate_ring_allreduce(int n, double link_gb_s, double link_latency_us, std::uint64_t bytes);

}  // namespace ftp::doc
