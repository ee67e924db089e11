// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hardware/cpu/virtual_device.hpp"
#include "hardware/gpu.hpp"
#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"

namespace ftp::serve {

/// What a gear's device name stands for on this service.
struct DeviceBinding {
  std::string name;                         ///< as the gear table names it ("vd2", "gpu1")
  hardware::VirtualDevice* virtual_device = nullptr;  ///< a CPU virtual device, or null
  int gpu = -1;                             ///< CUDA ordinal for a GPU (or a share of one), or -1
  std::string member;                       ///< a device of member process `member` ("n1" of "n1/vd0"), or ""
};

/// The devices this service may run domains on, and who holds them
/// (ARCHITECTURE.md's resource pool). Devices come from a topology, and a
/// gear binds through it: a name the topology lacks is an error naming
/// it, never a default device.
/// - "cpu" (the real engine on CPU virtual devices): vd0..vd<N-1>, the CPU
///   and its memory split evenly among them.
/// - "cuda": the GPUs of discover_gpus() as gpu0..gpu<G-1>, plus vd0..vd<N-1>
///   as shares of gpu0 (several ranks on one GPU, as the gpu suite runs).
///   A gear may name a GPU by ordinal ("gpu1", "cuda:1") or by UUID
///   ("GPU-8f3c...", a MIG slice's "MIG-..."): canonical() turns each into
///   the pool's id ("gpu1"), so leases, the memory plan and the shard
///   unions see one device under one name.
/// - "named" (an engine factory's devices, e.g. the simulated engine's):
///   the given topology's devices, or the gear table's own names when there
///   is none; nothing is bound to hardware.
/// Leases say which domain holds a device; a lost device (taken away, its
/// member gone) is refused to new domains. Thread-safe.
class DevicePool {
 public:
  enum class Kind { cpu, cuda, named };

  /// `virtual_devices`: how many vdN to make; 0: as many as the highest
  /// vdN of `table` needs. `topology`: for Kind::named only (may be empty).
  /// `virtual_device_memory`: each CPU virtual device's budget, bytes; 0:
  /// the host's memory split evenly among them.
  /// `gpus`: Kind::cuda's GPUs instead of discover_gpus() (tests on a
  /// machine without one; null: discover).
  DevicePool(Kind kind, const doc::GearTable& table, int virtual_devices, const doc::Topology* topology = nullptr,
             std::uint64_t virtual_device_memory = 0, const std::vector<hardware::GpuInfo>* gpus = nullptr);

  Kind kind() const noexcept { return kind_; }
  /// The devices, as a topology document's devices (ids, types, parents).
  const std::vector<doc::Device>& devices() const noexcept { return devices_; }

  /// Binds `name` (canonical() first); throws InputError naming it and
  /// what the pool has.
  DeviceBinding bind(const std::string& name) const;
  /// The pool's id of `name`: a GPU's ordinal spelling ("cuda:1") or UUID
  /// (case-insensitive, as nvidia-smi -L prints it) becomes "gpu1", a
  /// topology device's uuid its id; any other name is returned as it is
  /// (bind() then says whether the pool has it).
  std::string canonical(const std::string& name) const;
  /// Rewrites every device name of `table` to canonical(); returns how
  /// many it changed. The service calls it before check(), at start and
  /// on reload.
  int canonicalize(doc::GearTable& table) const;
  /// Binds every device of every gear of `table` (at start and on reload);
  /// throws InputError naming the gear and the device. A member's device
  /// ("n1/vd0") is checked when a gear using it is built: members join later.
  void check(const doc::GearTable& table) const;

  /// `domain` holds `devices` from now on (several domains may share a
  /// device: a shadow warms beside the domain it replaces). Throws
  /// InputError when one of them is lost.
  void lease(const std::string& domain, const std::vector<std::string>& devices);
  /// `domain` holds nothing any more.
  void release(const std::string& domain);
  /// Marks a device lost (`why`): no new domain leases it.
  void mark_lost(const std::string& device, const std::string& why);
  /// Lost devices and why.
  std::map<std::string, std::string> lost() const;

  /// Members (issue 16): this process's machine name; its own devices
  /// bind as "NAME/vd0" as well as "vd0".
  void set_machine_name(std::string name);
  /// Member `member` joined (or came back) with `devices` (full names,
  /// "n1/vd0"): they bind from now on and are no longer lost.
  void member_joined(const std::string& member, const std::vector<std::string>& devices);
  /// Member `member` is gone: its devices are lost (`why`).
  void member_lost(const std::string& member, const std::string& why);

  /// The devices with their leases, for `status`: id, type, parent, state
  /// ("free" | "leased" | "lost"), held_by, and for CPU virtual devices
  /// threads, cpus, memory_used, memory_weights (of memory_used, the
  /// weights copied there: ftp-serve --device-memory) and memory_budget.
  json::Json status() const;

 private:
  Kind kind_;
  std::vector<doc::Device> devices_;
  std::map<std::string, std::unique_ptr<hardware::VirtualDevice>> vdevs_;  // CPU virtual devices by name
  std::map<std::string, int> gpus_;                                       // device name -> CUDA ordinal
  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::string>> leases_;  // domain -> devices
  std::map<std::string, std::string> lost_;                 // device -> why
  std::string machine_;                                     // this process's machine name
  std::map<std::string, std::vector<std::string>> members_; // member -> its devices (full names)
};

/// "cpu" | "cuda" | "named".
const char* to_string(DevicePool::Kind k) noexcept;

}  // namespace ftp::serve
