// SPDX-License-Identifier: Apache-2.0
#include "member/spanning.hpp"

#include <algorithm>
#include <future>
#include <thread>
#include <type_traits>

#include "core/error.hpp"
#include "engine/executor.hpp"
#include "engine/step_plan.hpp"

namespace ftp::member {

std::string member_of(const std::string& device) {
  const auto s = device.find('/');
  return s == std::string::npos ? std::string() : device.substr(0, s);
}

std::string local_name(const std::string& device) {
  const auto s = device.find('/');
  return s == std::string::npos ? device : device.substr(s + 1);
}

bool spans_members(const SpanningDomain& d, const std::string& leader_name) {
  for (const auto& st : d.stages)
    for (const auto& dev : st.devices) {
      const std::string m = member_of(dev);
      if (!m.empty() && m != leader_name) return true;
    }
  return false;
}

namespace {

/// The leader's Executor of a spanning domain, and the members to retire
/// when it goes.
class SpanningEngine final : public engine::Engine {
 public:
  SpanningEngine(Leader& l, std::vector<std::string> members, std::string id, std::shared_ptr<engine::Placement> p,
                 std::unique_ptr<engine::Executor> e)
      : leader_(l), members_(std::move(members)), id_(std::move(id)), placement_(std::move(p)), exec_(std::move(e)) {
    for (const auto& m : members_) epochs_.push_back(leader_.epoch(m));
  }
  ~SpanningEngine() override {
    exec_.reset();
    for (const auto& m : members_) leader_.tell(m, json::Json{{"type", "retire"}, {"domain", id_}});
    placement_->group->abort();
  }
  const model::HParams& hparams() const override { return exec_->hparams(); }
  int block_tokens() const override { return exec_->block_tokens(); }
  std::uint64_t kv_bytes() const override { return exec_->kv_bytes(); }
  std::vector<std::vector<float>> forward(const std::vector<engine::SeqChunk>& c, int mb) override {
    return naming_the_member([&] { return exec_->forward(c, mb); });
  }
  void recycle(std::vector<std::vector<float>>&& l) override { exec_->recycle(std::move(l)); }
  std::vector<int> forward_choose(const std::vector<engine::SeqChunk>& c, int mb,
                                  const std::vector<engine::TokenChoice>& ch) override {
    return naming_the_member([&] { return exec_->forward_choose(c, mb, ch); });
  }
  const std::vector<double>& stage_busy_s() const override { return exec_->stage_busy_s(); }
  void set_background() override { exec_->set_background(); }
  /// The executor's failure, or a member gone since the build (its ranks
  /// and the domain's group are gone with it, even if it has come back).
  std::string failure() const override {
    for (std::size_t i = 0; i < members_.size(); ++i)
      if (leader_.epoch(members_[i]) != epochs_[i]) return "member " + members_[i] + " was lost";
    return exec_->failure();
  }

 private:
  /// A member that dies closes its channel about when its Gloo sockets
  /// close: a step that failed waits this long to learn which one it was.
  static constexpr int kLostWaitMs = 2000;
  /// Runs a step; when it fails and a member of the domain is gone, the
  /// error names the member first (the request's error event says who).
  template <class F>
  std::invoke_result_t<F> naming_the_member(F&& step) {
    try {
      return step();
    } catch (const std::exception& e) {
      // Once: the steps after a failed one fail at once (the engine has failed).
      if (!lost_asked_) lost_ = leader_.wait_lost(members_, epochs_, kLostWaitMs);
      lost_asked_ = true;
      if (lost_.empty()) throw;
      throw Error(lost_ + ": " + e.what());
    }
  }
  bool lost_asked_ = false;  // the domain's thread only (steps)
  std::string lost_;
  Leader& leader_;
  std::vector<std::string> members_;
  std::vector<std::uint64_t> epochs_;  // of each member at the build
  std::string id_;
  std::shared_ptr<engine::Placement> placement_;
  std::unique_ptr<engine::Executor> exec_;
};

}  // namespace

std::unique_ptr<engine::Engine> build_spanning_engine(Leader& leader, const std::string& leader_name,
                                                      const engine::WeightStore& weights, const SpanningDomain& d,
                                                      const std::function<hardware::VirtualDevice*(const std::string&)>& local_device,
                                                      engine::Backend* backend, const comm::GlooOptions& gloo,
                                                      int build_timeout_ms) {
  // Group ranks: the leader 0, then the members in order of appearance.
  std::vector<std::string> members;
  auto rank_of = [&](const std::string& dev) -> int {
    const std::string m = member_of(dev);
    if (m.empty() || m == leader_name) return 0;
    auto it = std::find(members.begin(), members.end(), m);
    if (it == members.end()) {
      members.push_back(m);
      return static_cast<int>(members.size());
    }
    return static_cast<int>(it - members.begin()) + 1;
  };
  auto placement = std::make_shared<engine::Placement>();
  json::Json stages = json::Json::array(), owners = json::Json::array();
  std::vector<engine::StageLayout> layouts;
  for (const auto& st : d.stages) {
    std::vector<int> own;
    engine::StageLayout sl{st.first_layer, st.n_layers, static_cast<int>(st.devices.size()), {}};
    sl.kv_dtype = d.kv_dtype;
    for (const auto& dev : st.devices) {
      own.push_back(rank_of(dev));
      sl.devices.push_back(own.back() == 0 ? local_device(local_name(dev)) : nullptr);
    }
    if (std::find(sl.devices.begin(), sl.devices.end(), nullptr) != sl.devices.end() &&
        std::all_of(own.begin(), own.end(), [](int o) { return o == 0; }))
      sl.devices.clear();
    placement->owner.push_back(own);
    owners.push_back(own);
    layouts.push_back(sl);
    stages.push_back(json::Json{{"first_layer", st.first_layer},
                                {"n_layers", st.n_layers},
                                {"devices", st.devices},
                                {"kv_dtype", std::string(engine::to_string(d.kv_dtype))}});
  }
  const int size = static_cast<int>(members.size()) + 1;
  const std::string prefix = "domain/" + d.id + "/" + random_nonce().substr(0, 12);
  const model::HParams& hp = weights.hparams();
  // Every member builds its ranks while the leader builds its own: they
  // meet in the group's and the stages' rendezvous.
  std::vector<std::future<json::Json>> replies;
  for (int k = 1; k < size; ++k) {
    json::Json req{{"type", "build"},    {"domain", d.id},        {"group", prefix},
                   {"group_rank", k},    {"group_size", size},    {"owners", owners},
                   {"stages", stages},   {"kv_blocks", d.kv_blocks}, {"block_tokens", d.block_tokens},
                   {"max_rows", d.max_rows}, {"n_layer", hp.n_layer}, {"n_embd", hp.n_embd}, {"n_vocab", hp.n_vocab}};
    const std::string name = members[static_cast<std::size_t>(k - 1)];
    replies.push_back(std::async(std::launch::async, [&leader, name, req, build_timeout_ms] {
      return leader.request(name, req, build_timeout_ms);
    }));
  }
  auto retire_all = [&] {
    for (const auto& m : members) leader.tell(m, json::Json{{"type", "retire"}, {"domain", d.id}});
  };
  std::unique_ptr<engine::Executor> exec;
  std::string failed;
  try {
    comm::GlooOptions g = gloo;
    placement->self = 0;
    placement->group = std::make_shared<comm::GlooGroup>(leader.store(), prefix + "/group", 0, size, g);
    std::vector<int> tps;
    for (const auto& l : layouts) tps.push_back(l.tp);
    placement->stage_comm = [&leader, prefix, g, tps](int s, const std::vector<int>& local) {
      return std::make_shared<comm::GlooCommunicator>(leader.store(), prefix + "/stage" + std::to_string(s),
                                                      tps[static_cast<std::size_t>(s)], local, g);
    };
    exec = std::make_unique<engine::Executor>(weights, layouts, d.kv_blocks, d.block_tokens, backend, d.max_rows,
                                              placement);
  } catch (const std::exception& e) {
    failed = std::string("domain ") + d.id + ": the leader's part: " + e.what();
    if (placement->group) placement->group->abort();
  }
  for (auto& r : replies) {
    try {
      r.get();
    } catch (const std::exception& e) {
      if (failed.empty()) failed = std::string("domain ") + d.id + ": " + e.what();
    }
  }
  if (!failed.empty()) {
    exec.reset();
    retire_all();
    throw Error(failed);
  }
  return std::make_unique<SpanningEngine>(leader, members, d.id, placement, std::move(exec));
}

}  // namespace ftp::member
