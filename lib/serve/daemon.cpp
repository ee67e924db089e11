// SPDX-License-Identifier: Apache-2.0
#include "serve/daemon.hpp"
#include "serve/journal.hpp"

#include <cstdlib>

#include <chrono>
#include <csignal>
#include <optional>
#include <atomic>
#include <filesystem>
#include <thread>

#include "ftp_config.h"
#include "control/policy.hpp"
#include "member/channel.hpp"
#include "member/leader.hpp"
#include "serve/control_socket.hpp"
#include "sim/serving.hpp"

#if FTP_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace ftp::serve {

namespace {

void notify_systemd([[maybe_unused]] const std::string& state) {
#if FTP_HAVE_SYSTEMD
  sd_notify(0, state.c_str());
#endif
}

/// The control socket's options: reload below --config-dir, else the gear
/// table's directory; the test hooks as asked.
ControlSocketOptions control_options(const DaemonOptions& o) {
  ControlSocketOptions c;
  c.gear_table_path = o.gears_path;
  c.config_dir = o.config_dir;
  if (c.config_dir.empty() && !o.gears_path.empty())
    c.config_dir = std::filesystem::absolute(o.gears_path).parent_path().string();
  c.test_hooks = o.test_hooks;
  return c;
}

}  // namespace

doc::GearTable gear_table_for_spec(const model::HParams& hp, const std::string& model_name, const GearSpec& g,
                                   const std::vector<std::string>& devices, const std::string& topology) {
  if (!devices.empty() && static_cast<int>(devices.size()) < g.tp * g.pp * g.dp)
    throw InputError("--gear tp=" + std::to_string(g.tp) + ",pp=" + std::to_string(g.pp) + ",dp=" + std::to_string(g.dp) +
                     " needs " + std::to_string(g.tp * g.pp * g.dp) + " devices, the topology has " +
                     std::to_string(devices.size()));
  doc::GearTable t;
  t.model = doc::ModelShape{model_name, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_embd, 0};
  t.topology = topology.empty() ? "cpu-virtual" : topology;
  doc::Gear gear;
  gear.name = "tp" + std::to_string(g.tp) + "-pp" + std::to_string(g.pp) + "-dp" + std::to_string(g.dp);
  gear.tp = g.tp;
  gear.pp = g.pp;
  gear.dp = g.dp;
  gear.micro_batches = g.pp;
  int next = 0;
  for (int r = 0; r < g.dp; ++r) {
    doc::Replica rep;
    for (const auto& st : even_stages(hp.n_layer, g.tp, g.pp)) {
      doc::Stage s;
      s.first_layer = st.first_layer;
      s.n_layers = st.n_layers;
      for (int k = 0; k < g.tp; ++k, ++next)
        s.devices.push_back(devices.empty() ? "vd" + std::to_string(next) : devices[static_cast<std::size_t>(next)]);
      rep.stages.push_back(std::move(s));
    }
    gear.replicas.push_back(std::move(rep));
  }
  t.gears.push_back(std::move(gear));
  doc::validate(t);
  return t;
}

doc::Topology virtual_topology(int n) {
  doc::Topology t;
  t.source = "probe";
  t.name = "cpu-virtual-" + std::to_string(n);
  t.nodes.push_back(doc::Host{"node0", "localhost", "", 0, 0, 0});
  doc::Island island{"island0", {}, std::nullopt};
  for (int i = 0; i < n; ++i) {
    doc::Device d;
    d.id = "vd" + std::to_string(i);
    d.type = "virtual";
    d.node = "node0";
    d.parent = "cpu0";
    d.memory_bytes = 1;  // not accounted here: domains size their KV pools themselves
    d.perf_source = "estimated";
    island.devices.push_back(d.id);
    t.devices.push_back(std::move(d));
  }
  t.islands.push_back(std::move(island));
  return t;
}

int run_daemon(DaemonOptions o) {
  // Signals go to sigwait below, never to a handler in another thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };

  sim::check_engine_name(o.engine);
  const bool simulated = o.engine == "sim";
  plan::ModelShape shape;
  model::Model model = simulated ? sim::load_sim_model(o.model_path, o.tokenizer_path, shape)
                                 : model::load_model(o.model_path, o.tokenizer_path);
  doc::Topology topo;
  if (simulated) {
    if (!o.topology_path.empty())
      topo = sim::read_topology(o.topology_path);
    else if (o.topology)
      topo = *o.topology;
    else
      throw InputError("--engine sim: no device speeds; give --topology FILE (ftp.topology/v1 or ftp.cluster/v1)");
  }
  std::vector<std::string> topo_devices;
  for (const auto& d : topo.devices)
    if (d.type != "cpu" || topo.devices.size() == 1) topo_devices.push_back(d.id);
  std::string name = o.service.model_name.empty()
                         ? std::filesystem::path(o.model_path).stem().string()
                         : o.service.model_name;
  o.service.model_name = name;
  if (!o.gears_path.empty()) {
    o.service.gears = json::parse_file(o.gears_path, [](const json::Json& j) { return doc::gear_table_from_json(j); });
  } else {
    o.service.gears = gear_table_for_spec(model.hparams, name, parse_gear_spec(o.gear_spec), topo_devices,
                                          simulated ? topo.name : "");
  }
  if (simulated) {
    try {
      doc::validate_against(o.service.gears, topo);
    } catch (const InputError& e) {
      throw InputError((o.gears_path.empty() ? std::string("--gear") : o.gears_path) + ": " + e.what());
    }
    plan::Calibration cal;
    if (!o.calibration_path.empty()) cal = sim::read_calibration(o.calibration_path);
    o.service.engine_factory = sim::engine_factory(shape, model, topo, cal, sim::Pacing::wait_real_time);
    o.service.topology = topo;
    log("engine: simulated (" + model.format + ") on topology " + topo.name +
        (o.calibration_path.empty() ? "" : ", calibration " + o.calibration_path));
  }
  o.service.virtual_devices = o.virtual_devices;
  if (!o.members_listen.empty()) {
    if (simulated) throw InputError("--members-listen: members run the real engine only");
    if (o.secret_file.empty()) throw InputError("--members-listen: needs --secret-file");
    if (o.service.backend != "cpu")
      throw InputError("--members-listen: members run CPU ranks only (--backend " + o.service.backend +
                       "; GPUs across processes are not built yet)");
    const std::string secret = member::load_secret(o.secret_file);
    o.service.members = std::make_shared<member::Leader>(o.members_listen, secret,
                                                         [olog = o.log](const std::string& l) {
                                                           if (olog) olog(l);
                                                         });
    o.service.gloo.hostname = o.service.members->host();
    log("member channel on " + o.service.members->address() + " (" + member::kProtocol + "), this machine is " +
        o.service.machine_name);
    if (o.wait_members > 0 && !o.service.members->wait_for_members(o.wait_members, o.members_wait_ms))
      throw Error("--wait-members " + std::to_string(o.wait_members) + ": " +
                  std::to_string(o.service.members->members().size()) + " members joined within " +
                  std::to_string(o.members_wait_ms) + " ms");
  }
  // Members' devices are checked when a gear using them is built.
  if (o.virtual_devices > 0 && !o.service.members) {
    try {
      doc::validate_against(o.service.gears, virtual_topology(o.virtual_devices));
    } catch (const InputError& e) {
      throw InputError((o.gears_path.empty() ? std::string("--gear") : o.gears_path) + ": " + e.what());
    }
  }
  // --auto: the policy and its config first, so that a table it cannot run
  // on stops the daemon before it serves, with the file named.
  control::PolicyConfig pc;
  std::shared_ptr<const doc::GearTable> table;
  std::shared_ptr<control::Policy> policy;
  if (o.auto_loop) {
    if (!o.policy_path.empty())
      pc = json::parse_file(o.policy_path, [](const json::Json& j) { return control::policy_config_from_json(j); });
    // The policy reads the table it is made with: keep it alive beside it.
    table = std::make_shared<const doc::GearTable>(o.service.gears);
    try {
      policy = std::shared_ptr<control::Policy>(control::make_policy(o.policy_name, *table, pc));
    } catch (const std::exception& e) {
      json::rethrow_with_source(o.gears_path.empty() ? std::string("--gear") : o.gears_path, e);
    }
  }
  {
    // The topology a reloaded table is checked against, as the first was:
    // the simulated engine's, or the CPU virtual devices.
    std::optional<doc::Topology> vt;
    if (simulated) vt = topo;
    if (o.virtual_devices > 0 && !o.service.members) vt = virtual_topology(o.virtual_devices);
    // A reloaded table must fit the virtual devices and, with --auto, be
    // one the policy can run on: else the reload is refused and the
    // daemon goes on with the table it has.
    if (vt || o.auto_loop)
      o.service.reload_check = [vt, auto_loop = o.auto_loop, name = o.policy_name, pc](const doc::GearTable& t) {
        if (vt) doc::validate_against(t, *vt);
        if (auto_loop) control::make_policy(name, t, pc);
      };
  }
  // The shift journal: --state-dir, else systemd's, else /var/lib/flextp.
  o.service.state_dir = o.state_dir;
  if (o.service.state_dir.empty()) {
    const char* sd = std::getenv("STATE_DIRECTORY");
    std::string dir = sd && *sd ? std::string(sd).substr(0, std::string(sd).find(':')) : "/var/lib/flextp";
    try {
      Journal probe(dir);
      o.service.state_dir = dir;
    } catch (const InputError& e) {
      log(std::string("warning: no shift journal, records kept in memory only: ") + e.what());
    }
  }
  // The table's errors (its model shapes against the loaded model) name it.
  std::optional<Service> svc_slot;
  try {
    svc_slot.emplace(model, o.service);
  } catch (const InputError& e) {
    json::rethrow_with_source(o.gears_path.empty() ? std::string("--gear") : o.gears_path, e);
  }
  Service& svc = *svc_slot;
  svc.start();
  log("service started: model=" + name + " gear=" + svc.current_gear());
  if (!o.service.state_dir.empty()) log("shift journal: " + o.service.state_dir + "/shifts.jsonl");
  for (const auto& id : svc.interrupted_shifts())
    log("shift journal: " + id + " was interrupted (the daemon stopped during it); recorded as interrupted");

  ipc::ServerOptions so;
  so.socket_path = o.socket_path;
  so.log = [&](ipc::LogLevel, std::string_view line) { log("control: " + std::string(line)); };
  ControlSocket control(svc, so, control_options(o));
  control.start();
  log("control socket: " + control.socket_path());

  if (!o.http.log) o.http.log = [&](std::string_view line) { log("http: " + std::string(line)); };
  if (o.http.chat_template.empty()) o.http.chat_template = model.tokenizer.chat_template;
  if (!o.http_front) throw Error("ftp-serve: no HTTP front to serve with (DaemonOptions::http_front)");
  std::unique_ptr<HttpFront> http_front = o.http_front(svc, o.http);
  HttpFront& http = *http_front;
  log("http: listening on " + o.http.host + ":" + std::to_string(http.port()));
  // The control loop in-process: the same policy code as `ftp-plan decide`,
  // fed live observations; the shifts it decides run on this thread.
  std::atomic<bool> stop_loop{false};
  std::thread loop;
  if (o.auto_loop) {
    std::uint64_t table_seen = svc.gear_table_generation();
    log("auto: policy " + o.policy_name + ", an observation every " + std::to_string(o.observe_interval_ms) + " ms");
    loop = std::thread([&, table, policy, table_seen, pc]() mutable {
      std::optional<doc::Decision> pending;
      while (!stop_loop) {
        for (int w = 0; w < o.observe_interval_ms && !stop_loop; w += 10)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (stop_loop) break;
        try {
          if (const auto gen = svc.gear_table_generation(); gen != table_seen) {
            // A reloaded table (reload_check made a policy on it already):
            // the policy starts over on it (its windows and dwell with it),
            // and a decision for the old one is dropped. Seen either way:
            // were it to fail here, the old policy goes on, logged once.
            table_seen = gen;
            auto next_table = std::make_shared<const doc::GearTable>(svc.gear_table());
            policy = std::shared_ptr<control::Policy>(control::make_policy(o.policy_name, *next_table, pc));
            table = std::move(next_table);  // after the policy that read the old one has gone
            pending.reset();
            log("auto: gear table reloaded; the policy starts over on it");
          }
          doc::Observation obs = svc.observe();
          doc::Decision d = policy->observe(obs);
          if (d.action == "shift") {
            log("auto: decision shift " + d.from + " -> " + d.to + ": " + d.reason);
            pending = d;
          }
          if (pending && obs.t_ms >= pending->not_before_ms && !obs.shifting) {
            Service::ShiftOptions so;
            so.to = pending->to;
            so.trigger = "policy:" + pending->policy;
            so.ramp = pending->ramp;  // the policy's own (urgent path), else the daemon's
            so.step_interval_ms = static_cast<int>(std::min<std::int64_t>(pending->ramp_step_ms, 3600000));
            pending.reset();
            auto done = svc.shift(so, [&](const doc::ShiftEvent& e) {
              log("auto: shift " + e.shift_id + " " + std::string(doc::to_string(e.phase)) + " " + e.message);
            });
            log("auto: shift " + done.shift_id + " " +
                (done.outcome ? std::string(doc::to_string(*done.outcome)) : std::string("-")));
          }
        } catch (const std::exception& e) {
          log(std::string("auto: ") + e.what());
        }
      }
    });
  }
  notify_systemd("READY=1\nSTATUS=serving gear " + svc.current_gear());
  if (o.on_ready) o.on_ready(http.port(), control.socket_path());

  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGHUP) {
      if (o.gears_path.empty()) {
        log("SIGHUP: no gear table file to reload (started with --gear)");
        continue;
      }
      notify_systemd("RELOADING=1");
      try {
        svc.reload(json::parse_file(o.gears_path, [](const json::Json& j) { return doc::gear_table_from_json(j); }));
        log("SIGHUP: gear table reloaded from " + o.gears_path);
      } catch (const std::exception& e) {
        log(std::string("SIGHUP: reload refused, the old table stays: ") + e.what());
      }
      notify_systemd("READY=1");
      continue;
    }
    log(std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT") + ": draining, then exiting");
    notify_systemd("STOPPING=1");
    break;
  }
  stop_loop = true;
  if (loop.joinable()) loop.join();
  // Stop taking requests and let every in-flight one finish; the HTTP server
  // keeps running until then so streams complete.
  svc.drain_and_stop();
  control.stop();
  http.stop(500);  // answers are done (drained): what is left gets half a second to flush
  log("stopped");
  return 0;
}

}  // namespace ftp::serve
