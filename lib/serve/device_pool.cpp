// SPDX-License-Identifier: Apache-2.0
#include "serve/device_pool.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/gpu.hpp"
#include "core/error.hpp"

namespace ftp::serve {

namespace {

/// N of "vd<N>", or -1.
int vd_index(const std::string& d) {
  if (d.size() > 2 && d.size() < 9 && d.compare(0, 2, "vd") == 0 && d.find_first_not_of("0123456789", 2) == std::string::npos)
    return std::stoi(d.substr(2));
  return -1;
}

doc::Device device(std::string id, std::string type, std::string parent) {
  doc::Device d;
  d.id = std::move(id);
  d.type = std::move(type);
  d.parent = std::move(parent);
  d.node = "node0";
  return d;
}

}  // namespace

const char* to_string(DevicePool::Kind k) noexcept {
  switch (k) {
    case DevicePool::Kind::cpu: return "cpu";
    case DevicePool::Kind::cuda: return "cuda";
    case DevicePool::Kind::named: return "named";
  }
  return "";
}

DevicePool::DevicePool(Kind kind, const doc::GearTable& table, int n_vd, const doc::Topology* topology,
                       std::uint64_t vd_memory, const std::vector<hardware::GpuInfo>* gpus)
    : kind_(kind) {
  if (kind == Kind::named) {
    if (topology && !topology->devices.empty()) {
      devices_ = topology->devices;
    } else {
      std::set<std::string> seen;
      for (const auto& g : table.gears)
        for (const auto& d : g.devices())
          if (seen.insert(d).second) devices_.push_back(device(d, "named", ""));
    }
    return;
  }
  if (n_vd <= 0)
    for (const auto& g : table.gears)
      for (const auto& d : g.devices()) n_vd = std::max(n_vd, vd_index(d) + 1);
  if (kind == Kind::cuda) {
    for (const auto& gi : gpus ? *gpus : hardware::discover_gpus()) {
      doc::Device d = device("gpu" + std::to_string(gi.index), "gpu", "");
      d.name = gi.name;
      d.uuid = gi.uuid;
      d.memory_bytes = gi.memory_bytes;
      gpus_[d.id] = gi.index;
      devices_.push_back(std::move(d));
    }
    // Virtual devices are ranks that share gpu0 (a TP gear on one GPU).
    if (n_vd > 0 && gpus_.count("gpu0"))
      for (int i = 0; i < n_vd; ++i) {
        devices_.push_back(device("vd" + std::to_string(i), "virtual", "gpu0"));
        gpus_["vd" + std::to_string(i)] = 0;
      }
    return;
  }
  if (n_vd > 0) {
    auto cpu = hardware::discover_cpu();
    const std::uint64_t total = vd_memory > 0 ? vd_memory * static_cast<std::uint64_t>(n_vd) : cpu.memory_bytes;
    for (auto& v : hardware::split_cpu(n_vd, total)) {
      doc::Device d = device("vd" + std::to_string(v->id()), "virtual", "cpu0");
      d.memory_bytes = v->memory_budget();
      d.compute_units = v->threads();
      devices_.push_back(d);
      vdevs_[d.id] = std::move(v);
    }
  }
}

void DevicePool::set_machine_name(std::string name) {
  std::lock_guard lk(mu_);
  machine_ = std::move(name);
}

void DevicePool::member_joined(const std::string& member, const std::vector<std::string>& devices) {
  std::lock_guard lk(mu_);
  members_[member] = devices;
  for (const auto& d : devices) lost_.erase(d);
}

void DevicePool::member_lost(const std::string& member, const std::string& why) {
  std::lock_guard lk(mu_);
  auto it = members_.find(member);
  if (it == members_.end()) return;
  for (const auto& d : it->second) lost_[d] = "member " + member + " lost: " + why;
}

std::string DevicePool::canonical(const std::string& name) const {
  // "cuda:N" is the CUDA runtime's spelling of gpuN.
  if (kind_ == Kind::cuda && name.size() > 5 && name.compare(0, 5, "cuda:") == 0 &&
      name.find_first_not_of("0123456789", 5) == std::string::npos)
    return "gpu" + name.substr(5);
  const auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string l = lower(name);
  if (l.compare(0, 4, "gpu-") != 0 && l.compare(0, 4, "mig-") != 0) return name;
  for (const auto& d : devices_)
    if (!d.uuid.empty() && lower(d.uuid) == l) return d.id;
  return name;
}

int DevicePool::canonicalize(doc::GearTable& table) const {
  int changed = 0;
  for (auto& g : table.gears)
    for (auto& rep : g.replicas)
      for (auto& st : rep.stages)
        for (auto& d : st.devices)
          if (std::string c = canonical(d); c != d) {
            d = std::move(c);
            ++changed;
          }
  return changed;
}

DeviceBinding DevicePool::bind(const std::string& given) const {
  const std::string full = canonical(given);
  std::string name = full;
  const auto slash = full.find('/');
  bool members = false;
  if (slash != std::string::npos && kind_ != Kind::named) {
    std::lock_guard lk(mu_);
    members = !machine_.empty();
  }
  if (members) {
    const std::string member = full.substr(0, slash);
    std::lock_guard lk(mu_);
    if (member != machine_) {
      auto it = members_.find(member);
      if (it == members_.end())
        throw InputError("device \"" + full + "\": member " + member + " has not joined (this machine is " +
                         machine_ + ")");
      if (std::find(it->second.begin(), it->second.end(), full) == it->second.end())
        throw InputError("device \"" + full + "\": member " + member + " has " + std::to_string(it->second.size()) +
                         " devices, not this one");
      DeviceBinding b;
      b.name = full;
      b.member = member;
      return b;
    }
    name = full.substr(slash + 1);
  }
  DeviceBinding b;
  b.name = name;
  if (kind_ == Kind::named) {
    if (std::none_of(devices_.begin(), devices_.end(), [&](const auto& d) { return d.id == name; }))
      throw InputError("device \"" + name + "\" is not in the topology");
    return b;
  }
  if (auto it = vdevs_.find(name); it != vdevs_.end()) {
    b.virtual_device = it->second.get();
    return b;
  }
  if (auto it = gpus_.find(name); it != gpus_.end()) {
    b.gpu = it->second;
    return b;
  }
  std::string have;
  for (const auto& d : devices_) have += (have.empty() ? "" : ", ") + d.id + (d.uuid.empty() ? "" : " = " + d.uuid);
  const std::string l = name.substr(0, 4);
  const bool uuid = l == "GPU-" || l == "gpu-" || l == "MIG-" || l == "mig-";
  throw InputError("device \"" + name + "\"" + (uuid ? " (a GPU UUID)" : "") + " is not one of this service's " + to_string(kind_) + " devices (" +
                   (have.empty() ? std::string("none") : have) + ")" +
                   (kind_ == Kind::cpu && name.compare(0, 3, "gpu") == 0 ? "; GPUs need --backend cuda" : "") +
                   (kind_ == Kind::cpu && vd_index(name) >= 0 ? "; --virtual-devices N offers more" : ""));
}

void DevicePool::check(const doc::GearTable& table) const {
  std::string machine;
  {
    std::lock_guard lk(mu_);
    machine = machine_;
  }
  for (const auto& g : table.gears)
    for (const auto& d : g.devices()) try {
        const auto slash = d.find('/');
        if (slash != std::string::npos && !machine.empty() && d.compare(0, slash, machine) != 0) continue;
        bind(d);
      } catch (const InputError& e) {
        throw InputError("gear " + g.name + ": " + e.what());
      }
}

void DevicePool::lease(const std::string& domain, const std::vector<std::string>& devices) {
  std::lock_guard lk(mu_);
  for (const auto& d : devices)
    if (auto it = lost_.find(d); it != lost_.end())
      throw InputError("device " + d + " is lost (" + it->second + ")");
  leases_[domain] = devices;
}

void DevicePool::release(const std::string& domain) {
  std::lock_guard lk(mu_);
  leases_.erase(domain);
}

void DevicePool::mark_lost(const std::string& device, const std::string& why) {
  std::lock_guard lk(mu_);
  lost_[device] = why;
}

std::map<std::string, std::string> DevicePool::lost() const {
  std::lock_guard lk(mu_);
  return lost_;
}

json::Json DevicePool::status() const {
  json::Json out = json::Json::array();
  std::lock_guard lk(mu_);
  for (const auto& d : devices_) {
    json::Json held = json::Json::array();
    for (const auto& [dom, devs] : leases_)
      if (std::find(devs.begin(), devs.end(), d.id) != devs.end()) held.push_back(dom);
    auto lost = lost_.find(d.id);
    json::Json j{{"id", d.id},
                 {"type", d.type},
                 {"state", lost != lost_.end() ? "lost" : held.empty() ? "free" : "leased"},
                 {"held_by", held}};
    if (!d.parent.empty()) j["parent"] = d.parent;
    if (lost != lost_.end()) j["lost_because"] = lost->second;
    if (auto v = vdevs_.find(d.id); v != vdevs_.end()) {
      j["threads"] = v->second->threads();
      j["cpus"] = v->second->cpus();
      j["memory_used"] = v->second->memory_used();
      j["memory_weights"] = v->second->memory_weights();
      j["memory_budget"] = v->second->memory_budget();
    }
    out.push_back(std::move(j));
  }
  for (const auto& [member, devs] : members_)
    for (const auto& d : devs) {
      json::Json held = json::Json::array();
      for (const auto& [dom, ds] : leases_)
        if (std::find(ds.begin(), ds.end(), d) != ds.end()) held.push_back(dom);
      auto lost = lost_.find(d);
      json::Json j{{"id", d},
                   {"type", "virtual"},
                   {"member", member},
                   {"state", lost != lost_.end() ? "lost" : held.empty() ? "free" : "leased"},
                   {"held_by", held}};
      if (lost != lost_.end()) j["lost_because"] = lost->second;
      out.push_back(std::move(j));
    }
  return out;
}

}  // namespace ftp::serve
