// SPDX-License-Identifier: Apache-2.0
#include "serve/weight_residency.hpp"

#include <algorithm>
#include <chrono>
#include <map>

namespace ftp::serve {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Each distinct device of `g`, in order.
std::vector<std::string> distinct_devices(const doc::Gear& g) {
  std::vector<std::string> out;
  for (const auto& d : g.devices())
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

}  // namespace

WeightResidency::WeightResidency(engine::WeightStore& store, engine::Backend* backend, const DevicePool& pool,
                                 ShardsOf shards_of)
    : store_(store), backend_(backend), pool_(pool), shards_of_(std::move(shards_of)) {}

bool WeightResidency::gpus() const { return backend_ && pool_.kind() == DevicePool::Kind::cuda; }

std::uint64_t WeightResidency::release(const doc::Gear& from, const std::vector<std::string>& in_use) {
  if (from.weight_mode != "release") return 0;
  auto leaving = [&](const std::string& d) { return std::find(in_use.begin(), in_use.end(), d) == in_use.end(); };
  std::uint64_t bytes = 0;
  if (gpus()) {
    // A GPU leaves when none of its pool devices (vd<N> shares of gpu0 included) stays in use.
    std::set<int> kept, gone;
    for (const auto& d : in_use)
      if (d.find('/') == std::string::npos) kept.insert(pool_.bind(d).gpu);
    for (const auto& d : distinct_devices(from))
      if (leaving(d) && d.find('/') == std::string::npos)
        if (const int g = pool_.bind(d).gpu; g >= 0 && !kept.count(g)) gone.insert(g);
    std::lock_guard lk(mu_);
    for (int g : gone) {
      bytes += backend_->release_device(store_, g);
      released_gpus_.insert(g);
    }
    return bytes;
  }
  if (store_.device_memory()) {
    for (const auto& d : distinct_devices(from))
      if (leaving(d))
        if (hardware::VirtualDevice* vd = pool_.bind(d).virtual_device) bytes += store_.release_device(*vd);
    return bytes;
  }
  // The mapped file: its pages under the views of the leaving ranks.
  for (const auto& rep : from.replicas)
    for (const auto& st : rep.stages)
      for (std::size_t r = 0; r < st.devices.size(); ++r)
        if (leaving(st.devices[r]))
          bytes += store_.release_rank(st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), static_cast<int>(r));
  return bytes;
}

std::future<WeightCopy> WeightResidency::restore(const doc::Gear& to) {
  const auto t0 = std::chrono::steady_clock::now();
  auto ready = [](WeightCopy c) {
    std::promise<WeightCopy> p;
    p.set_value(c);
    return p.get_future();
  };
  if (gpus()) {
    std::map<int, std::vector<engine::RankShard>> want;
    {
      std::lock_guard lk(mu_);
      for (const auto& d : distinct_devices(to)) {
        if (d.find('/') != std::string::npos) continue;  // a member's device: its own process uploads
        const DeviceBinding b = pool_.bind(d);
        if (b.gpu >= 0 && released_gpus_.count(b.gpu) && !want.count(b.gpu)) want[b.gpu] = shards_of_(b, to);
      }
      for (const auto& [g, sh] : want) released_gpus_.erase(g);
    }
    if (want.empty()) return ready({});
    return std::async(std::launch::async, [this, want, t0] {
      WeightCopy c;
      c.freed_before = true;
      for (const auto& [g, held] : backend_->make_resident(store_, want)) c.bytes += held;
      c.ms = ms_since(t0);
      return c;
    });
  }
  if (store_.device_memory()) {
    std::vector<std::pair<hardware::VirtualDevice*, std::vector<engine::RankShard>>> want;
    for (const auto& d : distinct_devices(to)) {
      const DeviceBinding b = pool_.bind(d);
      if (b.virtual_device && store_.released(*b.virtual_device)) want.emplace_back(b.virtual_device, shards_of_(b, to));
    }
    if (want.empty()) return ready({});
    return std::async(std::launch::async, [this, want, t0] {
      WeightCopy c;
      c.freed_before = true;
      for (const auto& [vd, sh] : want) c.bytes += store_.copy_to_device(*vd, sh);
      c.ms = ms_since(t0);
      return c;
    });
  }
  if (to.weight_mode != "release") return ready({});
  // The mapped file: MADV_WILLNEED starts the kernel's read-ahead and returns.
  WeightCopy c;
  for (const auto& rep : to.replicas)
    for (const auto& st : rep.stages)
      for (std::size_t r = 0; r < st.devices.size(); ++r)
        c.bytes += store_.prefetch_rank(st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), static_cast<int>(r));
  c.ms = ms_since(t0);
  return ready(c);
}

}  // namespace ftp::serve
