// SPDX-License-Identifier: Apache-2.0
#include "topology/probe.hpp"

#include <algorithm>
#include <numeric>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/measure.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "hardware/gpu.hpp"
#include "comm/inproc.hpp"
#include "comm/nccl.hpp"
#include "core/json.hpp"
#include "doc/cluster.hpp"

namespace ftp::topology {

namespace {

constexpr std::size_t kSmallAllReduceBytes = 4096;  // latency probe

void say(const ProbeOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

doc::AllReduce to_doc(const comm::AllReduceMeasurement& bw, double latency_us, const char* via) {
  doc::AllReduce a;
  a.ranks = bw.n_ranks;
  a.bytes = bw.bytes;
  a.time_us = bw.time_us;
  a.algbw_gb_s = bw.algbw_gb_s;
  a.busbw_gb_s = bw.busbw_gb_s;
  a.latency_us = latency_us;
  a.via = via;
  return a;
}

void add_cpu_devices(doc::Topology& t, const hardware::CpuInfo& cpu, const ProbeOptions& o) {
  if (o.virtual_devices <= 0) {
    doc::Device d;
    d.id = "cpu0";
    d.type = "cpu";
    d.name = cpu.model;
    d.node = "node0";
    d.memory_bytes = cpu.memory_bytes;
    d.compute_units = cpu.usable_cpus;
    d.numa_node = cpu.numa_nodes == 1 ? 0 : -1;
    say(o, "measuring cpu0 (" + std::to_string(d.compute_units) + " threads)");
    d.gemm_tflop_s = hardware::measure_cpu_gemm_tflops(d.compute_units, o.quick).value;
    d.gemm_dtype = "f32";
    d.memory_bandwidth_gb_s = hardware::measure_cpu_triad_gbs(d.compute_units, o.quick).value;
    d.perf_source = "measured";
    t.devices.push_back(d);
    t.islands.push_back(doc::Island{"island0", {d.id}, std::nullopt});
    return;
  }

  auto vds = hardware::split_cpu(o.virtual_devices, cpu.memory_bytes);
  doc::Island island{"island0", {}, std::nullopt};
  for (const auto& vd : vds) {
    doc::Device d;
    d.id = "vd" + std::to_string(vd->id());
    d.type = "virtual";
    d.name = cpu.model + " (virtual device, " + std::to_string(vd->threads()) + " thread" +
             (vd->threads() == 1 ? "" : "s") + (vd->oversubscribed() ? ", shared CPUs" : "") + ")";
    d.node = "node0";
    d.parent = "cpu0";
    d.memory_bytes = vd->memory_budget();
    d.compute_units = vd->threads();
    d.numa_node = cpu.numa_nodes == 1 ? 0 : -1;
    say(o, "measuring " + d.id + " (" + std::to_string(d.compute_units) + " threads)");
    // Each virtual device is measured alone with its thread share; see
    // hardware::measure_cpu_gemm_tflops for what that number means.
    d.gemm_tflop_s = hardware::measure_cpu_gemm_tflops(vd->threads(), o.quick).value;
    d.gemm_dtype = "f32";
    d.memory_bandwidth_gb_s = hardware::measure_cpu_triad_gbs(vd->threads(), o.quick).value;
    d.perf_source = "measured";
    island.devices.push_back(d.id);
    t.devices.push_back(d);
  }
  if (vds.size() > 1) {
    int n = static_cast<int>(vds.size());
    say(o, "measuring inproc all-reduce over " + std::to_string(n) + " virtual devices");
    std::size_t bytes = o.quick ? (4u << 20) : (32u << 20);
    auto bw = comm::measure_inproc_allreduce(n, bytes, o.quick);
    auto small = comm::measure_inproc_allreduce(n, kSmallAllReduceBytes, o.quick);
    island.allreduce = to_doc(bw, small.time_us, "inproc");
    // Every pair of virtual devices talks through shared memory: one fabric
    // at the measured bus bandwidth; latency from the small all-reduce.
    t.fabrics.push_back(doc::Fabric{"shm0", "shared-memory", island.devices, bw.busbw_gb_s, small.time_us});
  }
  t.islands.push_back(std::move(island));
}

void add_gpu_devices(doc::Topology& t, const ProbeOptions& o) {
  auto gpus = hardware::discover_gpus();
  if (gpus.empty()) {
    say(o, "no GPU: " + hardware::gpu_runtime_status());
    return;
  }
  std::vector<int> ordinals;
  for (const auto& g : gpus) ordinals.push_back(g.index);
  auto p2p = hardware::gpu_p2p_matrix(ordinals);
  for (const auto& g : gpus) {
    doc::Device d;
    d.id = "gpu" + std::to_string(g.index);
    d.type = g.is_mig ? "mig" : "gpu";
    d.name = g.name;
    d.node = "node0";
    d.memory_bytes = g.memory_bytes;
    d.compute_units = g.sm_count;
    d.uuid = g.uuid;
    say(o, "measuring " + d.id + " (" + g.name + ")");
    d.gemm_tflop_s = hardware::measure_gpu_gemm_tflops(g.index, o.quick).value;
    d.gemm_dtype = "bf16";
    d.memory_bandwidth_gb_s = hardware::measure_gpu_triad_gbs(g.index, o.quick).value;
    d.perf_source = "measured";
    t.devices.push_back(d);
  }
  // Islands: groups of GPUs with peer access to each other (MIG slices have none).
  std::vector<int> island(gpus.size(), -1);
  int next = 0;
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    if (island[i] >= 0) continue;
    island[i] = next;
    for (std::size_t j = i + 1; j < gpus.size(); ++j)
      if (island[j] < 0 && !p2p.empty() && p2p[i][j] && p2p[j][i]) island[j] = next;
    ++next;
  }
  for (int k = 0; k < next; ++k) {
    doc::Island is{"island" + std::to_string(t.islands.size()), {}, std::nullopt};
    std::vector<int> devs;
    for (std::size_t i = 0; i < gpus.size(); ++i)
      if (island[i] == k) {
        is.devices.push_back("gpu" + std::to_string(gpus[i].index));
        devs.push_back(gpus[i].index);
      }
    if (devs.size() > 1 && comm::nccl_available()) {
      say(o, "measuring NCCL all-reduce over " + std::to_string(devs.size()) + " GPUs");
      auto bw = comm::measure_nccl_allreduce(devs, o.quick ? (64u << 20) : (256u << 20), o.quick);
      auto small = comm::measure_nccl_allreduce(devs, kSmallAllReduceBytes, o.quick);
      is.allreduce = to_doc(bw, small.time_us, "nccl");
      // Without NVML the link kind is not visible; peer access at more than
      // 50 GB/s of bus bandwidth is taken as NVLink, slower as PCIe.
      t.fabrics.push_back(doc::Fabric{"p2p" + std::to_string(k), bw.busbw_gb_s > 50 ? "nvlink" : "pcie",
                                      is.devices, bw.busbw_gb_s, small.time_us});
    }
    t.islands.push_back(std::move(is));
  }
}

}  // namespace

doc::Topology probe_local(const ProbeOptions& o) {
  if (o.virtual_devices < 0) throw InputError("--virtual-devices: must not be negative, got " + std::to_string(o.virtual_devices));
  auto cpu = hardware::discover_cpu();
  doc::Topology t;
  t.source = "probe";
  t.name = cpu.hostname;
  t.nodes.push_back(doc::Host{"node0", cpu.hostname, cpu.model, cpu.usable_cpus, cpu.numa_nodes, cpu.memory_bytes});
  add_cpu_devices(t, cpu, o);
  if (o.gpus) add_gpu_devices(t, o);
  doc::validate(t);
  return t;
}

doc::Topology topology_from_cluster_file(const std::string& path) {
  return json::parse_file(path, [](const json::Json& j) { return doc::topology_from_cluster_spec(j); });
}

}  // namespace ftp::topology
