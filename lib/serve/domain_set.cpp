// SPDX-License-Identifier: Apache-2.0
#include "serve/domain_set.hpp"

#include <algorithm>

namespace ftp::serve {

std::string DomainSet::next_id() {
  std::lock_guard lk(mu_);
  return "d" + std::to_string(next_++);
}

void DomainSet::add(const DomainList& doms) {
  std::lock_guard lk(mu_);
  domains_.insert(domains_.end(), doms.begin(), doms.end());
}

void DomainSet::retire(const DomainList& doms) {
  for (auto& d : doms) {
    d->stop();  // returns once its requests are done
    d->set_state(doc::DomainState::retired);
  }
  std::lock_guard lk(mu_);
  domains_.erase(std::remove_if(domains_.begin(), domains_.end(),
                                [&](const auto& d) { return std::find(doms.begin(), doms.end(), d) != doms.end(); }),
                 domains_.end());
}

DomainList DomainSet::all() const {
  std::lock_guard lk(mu_);
  return domains_;
}

DomainList DomainSet::in_state(doc::DomainState s) const {
  DomainList out;
  std::lock_guard lk(mu_);
  for (const auto& d : domains_)
    if (d->state() == s) out.push_back(d);
  return out;
}

int DomainSet::serving(const std::vector<std::string>& except) const {
  std::lock_guard lk(mu_);
  return static_cast<int>(std::count_if(domains_.begin(), domains_.end(), [&](const auto& d) {
    return d->serving() && std::find(except.begin(), except.end(), d->id()) == except.end();
  }));
}

std::vector<std::string> DomainSet::on_devices(const std::vector<std::string>& devices) const {
  std::vector<std::string> out;
  std::lock_guard lk(mu_);
  for (const auto& d : domains_)
    for (const auto& dev : d->devices())
      if (std::find(devices.begin(), devices.end(), dev) != devices.end()) {
        out.push_back(d->id());
        break;
      }
  return out;
}

std::shared_ptr<DomainRunner> DomainSet::find(const std::string& id) const {
  std::lock_guard lk(mu_);
  for (const auto& d : domains_)
    if (d->id() == id) return d;
  return nullptr;
}

std::vector<std::string> DomainSet::devices_in_use() const {
  std::vector<std::string> out;
  std::lock_guard lk(mu_);
  for (const auto& d : domains_) out.insert(out.end(), d->devices().begin(), d->devices().end());
  return out;
}

std::string DomainSet::gear() const {
  std::lock_guard lk(mu_);
  return gear_;
}

void DomainSet::set_gear(std::string gear) {
  std::lock_guard lk(mu_);
  gear_ = std::move(gear);
}

}  // namespace ftp::serve
