// SPDX-License-Identifier: Apache-2.0
#include "engine/group_ids.hpp"

#include "core/error.hpp"

namespace ftp::engine {

int GroupIds::acquire(const std::string& name) {
  auto [it, fresh] = ids_.try_emplace(name, 0);
  if (!fresh) {
    ++refs_[static_cast<std::size_t>(it->second)];
    return it->second;
  }
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = bound();
    refs_.push_back(0);
    names_.push_back(nullptr);
  }
  it->second = id;
  refs_[static_cast<std::size_t>(id)] = 1;
  names_[static_cast<std::size_t>(id)] = &it->first;
  return id;
}

void GroupIds::release(int id) {
  if (id < 0 || id >= bound() || refs_[static_cast<std::size_t>(id)] == 0)
    throw Error("request groups: release of group id " + std::to_string(id) + ", which no sequence holds");
  if (--refs_[static_cast<std::size_t>(id)] > 0) return;
  const std::string* name = names_[static_cast<std::size_t>(id)];
  names_[static_cast<std::size_t>(id)] = nullptr;
  ids_.erase(ids_.find(*name));  // by iterator: `name` is that element's own key
  free_.push_back(id);
}

}  // namespace ftp::engine
