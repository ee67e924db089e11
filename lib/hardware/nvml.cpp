// SPDX-License-Identifier: Apache-2.0
#include "hardware/nvml.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>

namespace ftp::hardware::nvml {
namespace {

std::string error_text(const Api& api, int rc) {
  const char* s = api.error_string ? api.error_string(rc) : nullptr;
  return s ? std::string(s) : "NVML error " + std::to_string(rc);
}

template <class F>
bool load(void* lib, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  if (!out) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return out != nullptr;
}

}  // namespace

std::unique_ptr<GpuSignals> GpuSignals::open() {
  void* lib = dlopen("libnvml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    auto g = std::make_unique<GpuSignals>(Api{}, static_cast<unsigned int>(getpid()));
    g->unavailable_ = std::string("dlopen libnvml.so.1: ") + (e ? e : "not found") + " (no NVIDIA driver here)";
    return g;
  }
  Api a;
  std::string missing;
  load(lib, "nvmlInit_v2", a.init, missing);
  load(lib, "nvmlShutdown", a.shutdown, missing);
  load(lib, "nvmlErrorString", a.error_string, missing);
  load(lib, "nvmlDeviceGetCount_v2", a.device_count, missing);
  load(lib, "nvmlDeviceGetHandleByIndex_v2", a.handle_by_index, missing);
  load(lib, "nvmlDeviceGetUUID", a.uuid, missing);
  load(lib, "nvmlDeviceGetUtilizationRates", a.utilization, missing);
  load(lib, "nvmlDeviceGetMemoryInfo", a.memory, missing);
  // Optional: older drivers lack _v3, some GPUs process sampling or ECC.
  std::string optional;
  load(lib, "nvmlDeviceGetComputeRunningProcesses_v3", a.compute_processes, optional);
  load(lib, "nvmlDeviceGetProcessUtilization", a.process_utilization, optional);
  load(lib, "nvmlDeviceGetTotalEccErrors", a.total_ecc_errors, optional);
  if (!missing.empty()) {
    dlclose(lib);
    auto g = std::make_unique<GpuSignals>(Api{}, static_cast<unsigned int>(getpid()));
    g->unavailable_ = "libnvml.so.1 lacks " + missing;
    return g;
  }
  return std::make_unique<GpuSignals>(a, static_cast<unsigned int>(getpid()), lib);
}

GpuSignals::GpuSignals(const Api& api, unsigned int self_pid, void* library)
    : api_(api), self_pid_(self_pid), library_(library) {
  if (!api_.init) {
    unavailable_ = "NVML not loaded";
    return;
  }
  if (const int rc = api_.init(); rc != success) unavailable_ = "nvmlInit: " + error_text(api_, rc);
}

GpuSignals::~GpuSignals() {
  if (unavailable_.empty() && api_.shutdown) api_.shutdown();
  if (library_) dlclose(library_);
}

std::string GpuSignals::unavailable() const {
  std::lock_guard lk(mu_);
  return unavailable_;
}

std::vector<doc::GpuLoad> GpuSignals::sample(const std::map<std::string, std::string>& ids) {
  std::lock_guard lk(mu_);
  std::vector<doc::GpuLoad> out;
  if (!unavailable_.empty()) return out;
  unsigned int n = 0;
  if (api_.device_count(&n) != success) return out;
  for (unsigned int i = 0; i < n; ++i) {
    doc::GpuLoad g;
    g.id = "nvml" + std::to_string(i);
    Device dev = nullptr;
    bool lost = false;
    // Every call may be the one that finds the GPU gone.
    auto ok = [&](int rc) {
      if (rc == gpu_is_lost) lost = true;
      return rc == success;
    };
    if (!ok(api_.handle_by_index(i, &dev))) {
      g.available = false;
      g.unavailable_because = lost ? "GPU is lost" : "no NVML handle";
      out.push_back(std::move(g));
      continue;
    }
    char uuid[96] = {};
    if (ok(api_.uuid(dev, uuid, sizeof uuid))) {
      g.uuid = uuid;
      if (auto it = ids.find(g.uuid); it != ids.end()) g.id = it->second;
    }
    Utilization u{};
    if (ok(api_.utilization(dev, &u))) {
      g.utilization = std::min(1.0, u.gpu / 100.0);
      g.memory_utilization = std::min(1.0, u.memory / 100.0);
    }
    Memory m{};
    if (ok(api_.memory(dev, &m))) {
      g.memory_total = m.total;
      g.memory_used = m.used;
    }
    if (api_.compute_processes) {
      unsigned int count = 0;
      int rc = api_.compute_processes(dev, &count, nullptr);
      std::vector<ProcessInfo> procs;
      if (rc == insufficient_size && count > 0) {
        procs.resize(count + 8);  // room for processes that start in between
        count = static_cast<unsigned int>(procs.size());
        rc = api_.compute_processes(dev, &count, procs.data());
        procs.resize(rc == success ? count : 0);
      }
      ok(rc);
      for (const ProcessInfo& p : procs) {
        if (p.pid == self_pid_) continue;
        ++g.other_processes;
        if (p.used_gpu_memory != kValueNotAvailable) g.other_memory += p.used_gpu_memory;
      }
    }
    if (api_.process_utilization) {
      unsigned long long& since = last_seen_[i];
      unsigned int count = 0;
      int rc = api_.process_utilization(dev, nullptr, &count, since);
      std::vector<ProcessUtilizationSample> samples;
      if (rc == insufficient_size && count > 0) {
        samples.resize(count);
        rc = api_.process_utilization(dev, samples.data(), &count, since);
        samples.resize(rc == success ? count : 0);
      }
      ok(rc);
      // Each other process's mean SM share over its samples, summed.
      std::map<unsigned int, std::pair<double, int>> per_pid;
      for (const auto& s : samples) {
        since = std::max(since, s.time_stamp);
        if (s.pid == self_pid_) continue;
        auto& [sum, k] = per_pid[s.pid];
        sum += s.sm_util / 100.0;
        ++k;
      }
      double other = 0;
      for (const auto& [pid, v] : per_pid) other += v.first / v.second;
      g.other_compute = std::min(1.0, other);
    }
    if (api_.total_ecc_errors) {
      unsigned long long ecc = 0;
      if (ok(api_.total_ecc_errors(dev, 1, 0, &ecc))) g.ecc_uncorrected = ecc;
    }
    if (lost) {
      g.available = false;
      g.unavailable_because = "GPU is lost (NVML_ERROR_GPU_IS_LOST)";
    } else if (g.ecc_uncorrected > 0) {
      g.available = false;
      g.unavailable_because = std::to_string(g.ecc_uncorrected) + " uncorrected ECC errors";
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace ftp::hardware::nvml
