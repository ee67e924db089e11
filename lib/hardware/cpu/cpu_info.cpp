// SPDX-License-Identifier: Apache-2.0
#include "hardware/cpu/cpu_info.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.hpp"

namespace ftp::hardware {
namespace {

std::string trim(std::string s) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

/// Value of "<key> ... : value" lines, e.g. "MemTotal:  1234 kB" -> 1234*1024.
std::uint64_t meminfo_kb_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto pos = line.find(key + ":");
    if (pos == std::string::npos) continue;
    std::istringstream rest(line.substr(pos + key.size() + 1));
    std::uint64_t kb = 0;
    if (rest >> kb) return kb * 1024;
  }
  return 0;
}

}  // namespace

std::vector<int> usable_cpu_ids() {
  std::vector<int> ids;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) ids.push_back(i);
  }
  if (ids.empty()) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < std::max(1L, n); ++i) ids.push_back(static_cast<int>(i));
  }
  return ids;
}

CpuInfo discover_cpu() {
  CpuInfo info;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  info.usable_cpu_ids = usable_cpu_ids();
  info.usable_cpus = static_cast<int>(info.usable_cpu_ids.size());
  info.logical_cpus = online > 0 ? static_cast<int>(online) : info.usable_cpus;
  if (info.logical_cpus < 1) throw BackendError("cpu: no online CPU found (sysconf and sched_getaffinity)");

  // /proc/cpuinfo: one block per logical CPU. x86 gives "physical id" and
  // "core id"; other architectures may not, then cores = logical CPUs.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::pair<int, int>> cores;
  std::set<int> packages;
  int physical_id = 0;
  bool have_core_ids = false;
  while (std::getline(cpuinfo, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon));
    std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && info.model.empty()) {
      info.model = value;
    } else if (key == "physical id") {
      physical_id = std::atoi(value.c_str());
      packages.insert(physical_id);
    } else if (key == "core id") {
      cores.emplace(physical_id, std::atoi(value.c_str()));
      have_core_ids = true;
    }
  }
  if (info.model.empty()) info.model = "unknown";
  info.sockets = packages.empty() ? 1 : static_cast<int>(packages.size());
  info.physical_cores = have_core_ids ? static_cast<int>(cores.size()) : info.logical_cpus;

  info.memory_bytes = meminfo_kb_field("/proc/meminfo", "MemTotal");
  info.available_bytes = meminfo_kb_field("/proc/meminfo", "MemAvailable");
  if (info.memory_bytes == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) info.memory_bytes = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  }
  if (info.available_bytes == 0) info.available_bytes = info.memory_bytes;

  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<int, std::uint64_t>> nodes;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/node", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    // Node meminfo lines read "Node 0 MemTotal:  1234 kB".
    nodes.emplace_back(std::atoi(name.c_str() + 4), meminfo_kb_field(entry.path() / "meminfo", "MemTotal"));
  }
  std::sort(nodes.begin(), nodes.end());
  for (const auto& n : nodes) info.numa_memory_bytes.push_back(n.second);
  if (info.numa_memory_bytes.empty()) info.numa_memory_bytes.push_back(info.memory_bytes);
  info.numa_nodes = static_cast<int>(info.numa_memory_bytes.size());

  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.hostname = host;
  return info;
}

}  // namespace ftp::hardware
