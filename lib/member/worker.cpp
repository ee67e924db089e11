// SPDX-License-Identifier: Apache-2.0
#include "member/worker.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "core/error.hpp"
#include "engine/executor.hpp"
#include "engine/step_plan.hpp"
#include "engine/weight_store.hpp"
#include "member/channel.hpp"
#include "member/gather.hpp"
#include "member/spanning.hpp"
#include "topology/probe.hpp"

namespace ftp::member {
namespace {

/// The leader's rendezvous store, over the member channel: set is a
/// message, get asks until the key is there (the leader answers at once).
class ChannelStore final : public comm::RendezvousStore {
 public:
  explicit ChannelStore(Channel& c) : c_(c) {}
  void set(const std::string& key, const std::vector<char>& value) override {
    c_.send(json::Json{{"type", "store_set"}, {"key", key}, {"value", to_hex(value)}});
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::uint64_t id;
      {
        std::lock_guard lk(mu_);
        id = next_++;
        pending_[id] = std::nullopt;
      }
      c_.send(json::Json{{"type", "store_get"}, {"id", id}, {"key", key}});
      std::unique_lock lk(mu_);
      cv_.wait_until(lk, deadline, [&] { return pending_[id].has_value() || closed_; });
      auto v = pending_[id];
      pending_.erase(id);
      if (closed_) throw Error("rendezvous: the leader's channel closed");
      if (v && v->first) return v->second;
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error("rendezvous: key \"" + key + "\" not set within " + std::to_string(timeout.count()) + " ms");
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  /// A store_value from the leader.
  void answer(const json::Json& m) {
    std::lock_guard lk(mu_);
    const std::uint64_t id = m.at("re").get<std::uint64_t>();
    if (!pending_.count(id)) return;
    const bool found = m.value("found", false);
    pending_[id] = std::make_pair(found, found ? from_hex(m.at("value").get<std::string>()) : std::vector<char>{});
    cv_.notify_all();
  }
  void close() {
    std::lock_guard lk(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  Channel& c_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::optional<std::pair<bool, std::vector<char>>>> pending_;
  std::uint64_t next_ = 1;
  bool closed_ = false;
};

/// This process's ranks of one domain and the thread that runs its steps.
struct HostedDomain {
  std::shared_ptr<engine::Placement> placement;
  std::unique_ptr<engine::Executor> exec;
  std::thread steps;
  std::atomic<bool> ended{false};
  ~HostedDomain() {
    if (placement && placement->group) placement->group->abort();
    if (steps.joinable()) steps.join();
  }
};

/// The wait of an idle domain for its next plan: a day; retire or the
/// leader's death ends it sooner.
constexpr std::chrono::milliseconds kIdlePlanWait = std::chrono::hours(24);

}  // namespace

int run_worker(const WorkerOptions& o, const model::Model& model, const std::function<void(const std::string&)>& log) {
  if (o.name.empty() || o.name.find('/') != std::string::npos)
    throw InputError("--name \"" + o.name + "\": a machine name without '/'");
  Channel ch(Channel::connect_to(o.leader));
  json::Json devices = json::Json::array();
  for (int i = 0; i < o.virtual_devices; ++i) devices.push_back("vd" + std::to_string(i));
  join_leader(ch, o.secret, json::Json{{"name", o.name}, {"devices", devices}}, o.handshake_timeout_ms);
  log("joined " + o.leader + " as " + o.name + " with " + std::to_string(o.virtual_devices) + " devices");

  auto cpu = hardware::discover_cpu();
  std::map<std::string, std::unique_ptr<hardware::VirtualDevice>> vdevs;
  for (auto& v : hardware::split_cpu(o.virtual_devices, cpu.memory_bytes))
    vdevs["vd" + std::to_string(v->id())] = std::move(v);
  const engine::WeightStore weights(model);
  const model::HParams& hp = weights.hparams();
  ChannelStore store(ch);
  std::mutex dom_mu;
  std::map<std::string, std::shared_ptr<HostedDomain>> domains;
  std::vector<std::thread> builders;

  auto reply = [&](const json::Json& req, bool ok, const std::string& error, json::Json extra = json::Json::object()) {
    json::Json r{{"type", "reply"}, {"re", req.at("id")}, {"ok", ok}};
    if (!ok) r["error"] = error;
    for (auto& [k, v] : extra.items()) r[k] = v;
    try {
      ch.send(r);
    } catch (...) {
    }
  };
  auto retire = [&](const std::string& id) {
    std::shared_ptr<HostedDomain> d;
    {
      std::lock_guard lk(dom_mu);
      auto it = domains.find(id);
      if (it == domains.end()) return;
      d = it->second;
      domains.erase(it);
    }
    d->placement->group->abort();
    if (d->steps.joinable()) d->steps.join();
    d->exec.reset();
    log("domain " + id + " retired");
  };
  auto build = [&](json::Json req) {
    const std::string id = req.at("domain").get<std::string>();
    try {
      if (req.at("n_layer").get<int>() != hp.n_layer || req.at("n_embd").get<int>() != hp.n_embd ||
          req.at("n_vocab").get<int>() != hp.n_vocab)
        throw InputError("the leader's model (" + std::to_string(req.at("n_layer").get<int>()) + " layers, n_embd " +
                         std::to_string(req.at("n_embd").get<int>()) + ") is not this member's (" +
                         std::to_string(hp.n_layer) + " layers, n_embd " + std::to_string(hp.n_embd) + ")");
      retire(id);  // a domain of that id still here (its leader rebuilt it): its group is gone
      auto d = std::make_shared<HostedDomain>();
      auto p = std::make_shared<engine::Placement>();
      p->self = req.at("group_rank").get<int>();
      const int size = req.at("group_size").get<int>();
      const std::string prefix = req.at("group").get<std::string>();
      std::vector<engine::StageLayout> layouts;
      for (const auto& own : req.at("owners")) p->owner.push_back(own.get<std::vector<int>>());
      std::size_t s = 0;
      for (const auto& st : req.at("stages")) {
        const auto names = st.at("devices").get<std::vector<std::string>>();
        engine::StageLayout sl{st.at("first_layer").get<int>(), st.at("n_layers").get<int>(),
                               static_cast<int>(names.size()), {}};
        if (st.contains("kv_dtype"))
          sl.kv_dtype = engine::kv_dtype_from_string(st.at("kv_dtype").get<std::string>(), "build: kv_dtype");
        if (s >= p->owner.size() || p->owner[s].size() != names.size())
          throw InputError("stage " + std::to_string(s) + ": owners and devices disagree");
        for (std::size_t r = 0; r < names.size(); ++r) {
          hardware::VirtualDevice* v = nullptr;
          if (p->owner[s][r] == p->self) {
            if (member_of(names[r]) != o.name) throw InputError("device " + names[r] + " is not this member's (" + o.name + ")");
            auto it = vdevs.find(local_name(names[r]));
            if (it == vdevs.end()) throw InputError("device " + names[r] + ": this member has vd0..vd" +
                                                    std::to_string(o.virtual_devices - 1));
            v = it->second.get();
          }
          sl.devices.push_back(v);
        }
        layouts.push_back(sl);
        ++s;
      }
      p->group = std::make_shared<comm::GlooGroup>(store, prefix + "/group", p->self, size, o.gloo);
      const comm::GlooOptions g = o.gloo;
      std::vector<int> tps;
      for (const auto& l : layouts) tps.push_back(l.tp);
      p->stage_comm = [&store, prefix, g, tps](int st, const std::vector<int>& local) {
        return std::make_shared<comm::GlooCommunicator>(store, prefix + "/stage" + std::to_string(st),
                                                        tps[static_cast<std::size_t>(st)], local, g);
      };
      d->placement = p;
      d->exec = std::make_unique<engine::Executor>(weights, layouts, req.at("kv_blocks").get<int>(),
                                                   req.at("block_tokens").get<int>(), nullptr,
                                                   req.at("max_rows").get<int>(), p);
      d->steps = std::thread([d = d.get(), id, &log] {  // ~HostedDomain joins it
        try {
          for (;;) {
            engine::StepPlan plan = d->placement->recv_plan(kIdlePlanWait);
            if (plan.kind == engine::StepPlan::Kind::stop) break;
            d->exec->run_plan(plan);
          }
        } catch (const std::exception& e) {
          if (!d->placement->group->aborted()) log("domain " + id + ": steps ended: " + e.what());
        }
        d->ended = true;
      });
      {
        std::lock_guard lk(dom_mu);
        domains[id] = d;
      }
      log("domain " + id + " built: group rank " + std::to_string(p->self) + " of " + std::to_string(size));
      reply(req, true, "");
    } catch (const std::exception& e) {
      log("domain " + id + ": build failed: " + e.what());
      reply(req, false, e.what());
    }
  };

  int rc = 0;
  try {
    for (;;) {
      json::Json m = ch.recv();
      const std::string type = m["type"].get<std::string>();
      if (type == "store_value") {
        store.answer(m);
      } else if (type == "build") {
        builders.emplace_back(build, m);
      } else if (type == "probe") {
        // This machine's devices, measured (ftp-probe's probe_local), for
        // the leader's gathered topology.
        builders.emplace_back([&, m] {
          try {
            topology::ProbeOptions po;
            po.virtual_devices = o.virtual_devices;
            po.quick = m.value("quick", true);
            po.gpus = false;
            reply(m, true, "", json::Json{{"topology", doc::to_json(topology::probe_local(po))}});
          } catch (const std::exception& e) {
            reply(m, false, std::string("probe: ") + e.what());
          }
        });
      } else if (type == "netprobe") {
        // Its rank of the all-reduce between machines (gather_topology).
        builders.emplace_back([&, m] {
          try {
            const NetworkProbe np = network_probe_from_json(m);
            const std::string group = m.at("group").get<std::string>();
            if (group.rfind("netprobe/", 0) != 0) throw InputError("netprobe: group \"" + group + "\" is not a netprobe group");
            comm::GlooGroup g(store, group, m.at("rank").get<int>(), m.at("size").get<int>(), o.gloo);
            run_network_probe(g, np);
            reply(m, true, "");
          } catch (const std::exception& e) {
            reply(m, false, std::string("netprobe: ") + e.what());
          }
        });
      } else if (type == "retire") {
        const std::string id = m.value("domain", std::string());
        builders.emplace_back([&, id] { retire(id); });
      } else if (m.contains("id")) {
        reply(m, false, "ftp.UnknownRequest: \"" + type + "\" is not a step or phase of " + kProtocol);
      } else {
        log("ignored a message of type \"" + type + "\"");
      }
    }
  } catch (const std::exception& e) {
    log(std::string("channel to the leader ended: ") + e.what());
  }
  store.close();
  for (auto& t : builders) t.join();
  std::vector<std::string> ids;
  {
    std::lock_guard lk(dom_mu);
    for (auto& [id, d] : domains) ids.push_back(id);
  }
  for (const auto& id : ids) retire(id);
  return rc;
}

}  // namespace ftp::member
