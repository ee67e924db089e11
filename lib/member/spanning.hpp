// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hardware/cpu/virtual_device.hpp"
#include "comm/gloo.hpp"
#include "core/json.hpp"
#include "engine/engine.hpp"
#include "engine/kv_cache.hpp"
#include "engine/rank_backend.hpp"
#include "engine/weight_store.hpp"
#include "member/leader.hpp"

namespace ftp::member {

/// A domain whose ranks may live in other processes: its stages with the
/// devices of their ranks by full name ("n1/vd0": device vd0 of member n1;
/// a name without a member, or with the leader's, is the leader's own).
struct SpanningStage {
  int first_layer = 0, n_layers = 0;
  std::vector<std::string> devices;  ///< one per tensor-parallel rank
};
struct SpanningDomain {
  std::string id;
  std::vector<SpanningStage> stages;
  int kv_blocks = 0, block_tokens = 16, max_rows = 256;
  /// Every rank's KV page type, on every member (the build message carries it).
  engine::KvDtype kv_dtype = engine::KvDtype::automatic;
};

/// "n1" of "n1/vd0"; "" for "vd0".
std::string member_of(const std::string& device);
/// "vd0" of "n1/vd0".
std::string local_name(const std::string& device);
/// True when some rank of `d` is on a device of another member than `leader_name`.
bool spans_members(const SpanningDomain& d, const std::string& leader_name);

/// Builds the leader's engine of a spanning domain: asks each member that
/// holds ranks of it to build its ranks ("build"), connects the domain's
/// Gloo group (the leader is rank 0) and the leader's own ranks. The engine
/// sends each step's plan to the members; destroying it retires their
/// ranks. `local_device` binds the leader's own device names. Throws Error
/// naming the member or device at fault (the members built so far retire).
std::unique_ptr<engine::Engine> build_spanning_engine(Leader& leader, const std::string& leader_name,
                                                      const engine::WeightStore& weights, const SpanningDomain& d,
                                                      const std::function<hardware::VirtualDevice*(const std::string&)>& local_device,
                                                      engine::Backend* backend, const comm::GlooOptions& gloo,
                                                      int build_timeout_ms = 60000);

}  // namespace ftp::member
