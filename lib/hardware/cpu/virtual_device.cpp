// SPDX-License-Identifier: Apache-2.0
#include "hardware/cpu/virtual_device.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>

#include "hardware/cpu/cpu_info.hpp"

namespace ftp::hardware {

VirtualDevice::VirtualDevice(int id, int threads, std::vector<int> cpus, std::uint64_t memory_budget_bytes,
                             bool oversubscribed)
    : id_(id), threads_(threads), cpus_(std::move(cpus)), oversubscribed_(oversubscribed), budget_(memory_budget_bytes) {
  if (threads_ < 1) throw InputError("virtual device " + std::to_string(id) + ": threads must be >= 1");
}

std::uint64_t VirtualDevice::memory_used() const {
  std::lock_guard lock(mu_);
  return used_;
}

std::uint64_t VirtualDevice::memory_peak() const {
  std::lock_guard lock(mu_);
  return peak_;
}

std::uint64_t VirtualDevice::memory_available() const {
  std::lock_guard lock(mu_);
  return budget_ - used_;
}

void VirtualDevice::reserve(std::uint64_t bytes, const std::string& what) {
  std::lock_guard lock(mu_);
  if (bytes > budget_ - used_) {
    throw OutOfDeviceMemory(name() + ": " + what + " of " + std::to_string(bytes) + " bytes does not fit: " +
                            std::to_string(used_) + " of " + std::to_string(budget_) + " bytes in use");
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
}

void VirtualDevice::release(std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (bytes > used_) {
    throw Error(name() + ": release of " + std::to_string(bytes) + " bytes exceeds the " + std::to_string(used_) +
                " bytes in use");
  }
  used_ -= bytes;
}

std::uint64_t VirtualDevice::memory_weights() const {
  std::lock_guard lock(mu_);
  return weights_;
}

void VirtualDevice::reserve_weights(std::uint64_t bytes, const std::string& what) {
  reserve(bytes, what);
  std::lock_guard lock(mu_);
  weights_ += bytes;
}

void VirtualDevice::release_weights(std::uint64_t bytes) {
  {
    std::lock_guard lock(mu_);
    if (bytes > weights_)
      throw Error(name() + ": release of " + std::to_string(bytes) + " weight bytes exceeds the " +
                  std::to_string(weights_) + " held");
    weights_ -= bytes;
  }
  release(bytes);
}

bool lower_current_thread_priority(int delta) {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (now == -1 && errno != 0) return false;
  return setpriority(PRIO_PROCESS, tid, std::min(19, now + delta)) == 0;
}

bool VirtualDevice::bind_current_thread() const {
  if (cpus_.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus_)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

std::vector<std::unique_ptr<VirtualDevice>> split_cpu(int n, std::uint64_t total_memory_bytes,
                                                      const std::vector<int>& cpu_ids) {
  if (n < 1) throw InputError("virtual devices: count must be >= 1, got " + std::to_string(n));
  if (cpu_ids.empty()) throw InputError("virtual devices: no CPU to split");
  const int ncpu = static_cast<int>(cpu_ids.size());
  const std::uint64_t memory_each = total_memory_bytes / static_cast<std::uint64_t>(n);
  std::vector<std::unique_ptr<VirtualDevice>> devices;
  devices.reserve(n);
  for (int i = 0; i < n; ++i) {
    std::vector<int> cpus;
    if (n <= ncpu) {
      // Block i is [ncpu*i/n, ncpu*(i+1)/n): sizes differ by at most one.
      for (int k = ncpu * i / n; k < ncpu * (i + 1) / n; ++k) cpus.push_back(cpu_ids[k]);
    } else {
      cpus.push_back(cpu_ids[i % ncpu]);
    }
    const int threads = static_cast<int>(cpus.size());
    devices.push_back(std::make_unique<VirtualDevice>(i, threads, std::move(cpus), memory_each, n > ncpu));
  }
  return devices;
}

std::vector<std::unique_ptr<VirtualDevice>> split_cpu(int n, std::uint64_t total_memory_bytes) {
  return split_cpu(n, total_memory_bytes, usable_cpu_ids());
}

}  // namespace ftp::hardware
