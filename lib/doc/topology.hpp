// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.hpp"

namespace ftp::doc {

/// One node (machine) of a topology.
struct Host {
  std::string id;                 ///< "node0"
  std::string hostname;           ///< as reported, or from the cluster spec
  std::string cpu_model;          ///< may be empty for a described node
  int cpu_cores = 0;              ///< usable logical CPUs; 0 when unknown
  int numa_nodes = 0;             ///< 0 when unknown
  std::uint64_t memory_bytes = 0; ///< host memory; 0 when unknown
};

/// One device: a GPU, a MIG slice, a whole CPU or a CPU virtual device.
struct Device {
  std::string id;                     ///< unique in the topology: "cpu0", "vd2", "gpu1", "n1.gpu3"
  std::string type;                   ///< "cpu" | "virtual" | "gpu" | "mig"
  std::string name;                   ///< model name ("NVIDIA A100-SXM4-80GB")
  std::string node;                   ///< id of its node
  std::string parent;                 ///< for "mig" and "virtual": the physical device; else empty
  std::uint64_t memory_bytes = 0;     ///< memory usable by this device, bytes
  int compute_units = 0;              ///< CPU threads or GPU SMs; 0 when unknown
  double gemm_tflop_s = 0;            ///< dense GEMM throughput, TFLOP/s (1e12 FLOP/s)
  std::string gemm_dtype;             ///< dtype of gemm_tflop_s: "f32", "bf16", ...
  double memory_bandwidth_gb_s = 0;   ///< STREAM-like triad bandwidth, GB/s (1e9 B/s)
  std::string perf_source;            ///< "measured" | "datasheet" | "estimated"
  int numa_node = -1;                 ///< -1 when unknown or not applicable
  std::string uuid;                   ///< GPU UUID when known
};

/// A point-to-point link between two devices.
struct Link {
  std::string a, b;                   ///< device ids
  std::string type;                   ///< "nvlink" | "nvswitch" | "pcie" | "shared-memory" | "infiniband" | "ethernet" | "roce"
  double bandwidth_gb_s = 0;          ///< one direction, GB/s
  double latency_us = 0;              ///< one-way, microseconds
};

/// A group of devices joined all-to-all by one interconnect (an NVSwitch
/// domain, a node's shared memory, a cluster network): every pair of its
/// devices can talk at `bandwidth_gb_s`. Keeps big clusters small on disk.
struct Fabric {
  std::string id;
  std::string type;                   ///< as Link::type
  std::vector<std::string> devices;
  double bandwidth_gb_s = 0;          ///< per device, one direction, GB/s
  double latency_us = 0;
};

/// All-reduce measured (or estimated) over a group of devices, with the
/// nccl-tests definitions: algbw = bytes / time, busbw = algbw x 2(n-1)/n.
struct AllReduce {
  int ranks = 0;
  std::uint64_t bytes = 0;            ///< message size of the bandwidth measurement
  double time_us = 0;                 ///< time of one all-reduce of `bytes`
  double algbw_gb_s = 0;
  double busbw_gb_s = 0;
  double latency_us = 0;              ///< time of one small (4 KiB) all-reduce; 0 when not measured
  std::string via;                    ///< "inproc" | "nccl" | "estimated"
};

/// Devices joined by fast links; tensor parallelism stays inside one.
struct Island {
  std::string id;
  std::vector<std::string> devices;
  std::optional<AllReduce> allreduce;
};

/// ftp.topology/v1: what ftp-probe found or a cluster spec described.
struct Topology {
  std::string source;                 ///< "probe" | "cluster-spec"
  std::string name;                   ///< cluster name; hostname for a probe
  std::vector<Host> nodes;
  std::vector<Device> devices;
  std::vector<Link> links;
  std::vector<Fabric> fabrics;
  std::vector<Island> islands;

  const Device* find_device(const std::string& id) const;
  /// The fastest connection between two devices, from links and fabrics;
  /// nullopt when they are not connected.
  std::optional<Link> link_between(const std::string& a, const std::string& b) const;
  /// Island index of a device, or -1.
  int island_of(const std::string& device_id) const;
};

/// busbw from algbw for an all-reduce over n ranks (nccl-tests): algbw x 2(n-1)/n.
double allreduce_busbw(double algbw_gb_s, int n_ranks);

json::Json to_json(const Topology& t);
/// Parses and validates a ftp.topology/v1 document (kind, unique ids, known
/// device references, non-negative measurements); errors name the JSON path.
Topology topology_from_json(const json::Json& j);

/// Checks the cross-references of a topology: unique node and device ids,
/// devices on known nodes, links and islands naming known devices, each device
/// in at most one island. Throws InputError naming the path.
void validate(const Topology& t);

}  // namespace ftp::doc
