// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace ftp::engine {

/// The request groups (GenerationRequest::group) of a domain's live
/// sequences as small ids, so that the scheduler's per-step fairness
/// passes count and compare ints instead of hashing strings: two live
/// sequences have the same id exactly when they have the same group. An
/// id is held once per sequence and reused once no sequence holds it, so
/// ids stay below the most groups ever live at once. Not thread-safe.
class GroupIds {
 public:
  /// The id of `name`, held once more (a new one when no sequence holds it).
  int acquire(const std::string& name);
  /// One holder less; the id is free for another name at none.
  void release(int id);
  /// Every id given out is below this.
  int bound() const noexcept { return static_cast<int>(refs_.size()); }
  /// Names with a holder.
  std::size_t live() const noexcept { return ids_.size(); }

 private:
  std::unordered_map<std::string, int> ids_;
  std::vector<const std::string*> names_;  // per id: its key in ids_, or null when free
  std::vector<int> refs_;                  // per id: holders
  std::vector<int> free_;                  // ids without a holder
};

}  // namespace ftp::engine
