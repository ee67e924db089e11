// SPDX-License-Identifier: Apache-2.0
#include "serve/daemon.hpp"

#include <csignal>
#include <filesystem>

#include "ftp_config.h"
#include "serve/control.hpp"

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

}  // namespace

doc::GearTable gear_table_for_spec(const model::HParams& hp, const std::string& model_name, const GearSpec& g) {
  doc::GearTable t;
  t.model = doc::ModelShape{model_name, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_embd, 0};
  t.topology = "cpu-virtual";
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
      for (int k = 0; k < g.tp; ++k) s.devices.push_back("vd" + std::to_string(next++));
      rep.stages.push_back(std::move(s));
    }
    gear.replicas.push_back(std::move(rep));
  }
  t.gears.push_back(std::move(gear));
  doc::validate(t);
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

  model::Model model = model::load_model(o.model_path, o.tokenizer_path);
  std::string name = o.service.model_name.empty()
                         ? std::filesystem::path(o.model_path).stem().string()
                         : o.service.model_name;
  o.service.model_name = name;
  if (!o.gears_path.empty()) {
    o.service.gears = json::parse_file(o.gears_path, [](const json::Json& j) { return doc::gear_table_from_json(j); });
  } else {
    o.service.gears = gear_table_for_spec(model.hparams, name, parse_gear_spec(o.gear_spec));
  }
  Service svc(model, o.service);
  svc.start();
  log("service started: model=" + name + " gear=" + svc.current_gear());

  ipc::ServerOptions so;
  so.socket_path = o.socket_path;
  so.log = [&](ipc::LogLevel, std::string_view line) { log("control: " + std::string(line)); };
  ControlPlane control(svc, so, o.gears_path);
  control.start();
  log("control socket: " + control.socket_path());

  if (!o.http.log) o.http.log = [&](std::string_view line) { log("http: " + std::string(line)); };
  if (o.http.chat_template.empty()) o.http.chat_template = model.tokenizer.chat_template;
  HttpServer http(svc, o.http);
  http.start();
  log("http: listening on " + o.http.host + ":" + std::to_string(http.port()));
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
  // Stop taking requests and let every in-flight one finish; the HTTP server
  // keeps running until then so streams complete.
  svc.drain_and_stop();
  control.stop();
  http.stop();
  log("stopped");
  return 0;
}

}  // namespace ftp::serve
