// SPDX-License-Identifier: Apache-2.0
#include "serve/control_socket.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>

#include "doc/gear_table.hpp"

namespace ftp::serve {

using json::Json;

int control_error_code(const std::string& name) {
  for (const auto& e : kControlErrors)
    if (name == e.name) return e.code;
  return -32000;
}

ControlSocket::ControlSocket(Service& service, ipc::ServerOptions options, ControlSocketOptions control)
    : svc_(service), path_(options.socket_path.empty() ? ipc::default_socket_path() : options.socket_path),
      opt_(std::move(control)) {
  options.socket_path = path_;
  for (const auto& e : kControlErrors) options.method_errors.push_back({e.code, e.name, e.summary});
  server_ = std::make_unique<ipc::Server>(std::move(options), methods());
}

ControlSocket::~ControlSocket() { stop(); }

void ControlSocket::start() { server_->start(); }

void ControlSocket::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  server_->stop();  // cancels streams: watch loops end, shift/drain answers are dropped
  std::vector<Worker> w;
  {
    std::lock_guard lk(mu_);
    w.swap(workers_);
  }
  for (auto& t : w)
    if (t.thread.joinable()) t.thread.join();
}

void ControlSocket::spawn(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  // Join the workers that have ended, so that a long-lived daemon does not
  // keep a thread per stream it ever served.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  workers_.push_back(Worker{std::thread([fn = std::move(fn), done] {
                              fn();
                              done->store(true);
                            }),
                            done});
}

namespace {

void answer_error(ipc::Call& c, const std::exception& e) {
  if (auto* ce = dynamic_cast<const ControlError*>(&e)) {
    c.error(control_error_code(ce->name()), ce->name(), ce->what());
  } else if (dynamic_cast<const InputError*>(&e)) {
    c.error(ipc::Errc::invalid_params, e.what());
  } else {
    c.error(ipc::Errc::internal, e.what());
  }
}

/// Reads the integer parameter `name` into `out` (left as it is when
/// absent). Answers invalid_params and returns false when it is outside
/// [lo, hi]: the protocol's type check lets any integral number through,
/// and an int would wrap.
bool int_param(ipc::Call& c, const char* name, std::int64_t lo, std::int64_t hi, int& out) {
  const Json& p = c.params();
  if (!p.contains(name)) return true;
  const Json& v = p[name];
  const double d = v.is_number() ? v.get<double>() : 0.0;
  if (!v.is_number() || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
    c.error(ipc::Errc::invalid_params, std::string(name) + ": must be an integer from " + std::to_string(lo) + " to " +
                                           std::to_string(hi) + ", got " + v.dump(),
            Json{{"param", name}});
    return false;
  }
  out = static_cast<int>(d);
  return true;
}

constexpr std::int64_t kDayMs = 86'400'000;

/// `given` (relative: to `dir`) as a real path below `dir`, symlinks
/// resolved; nullopt when it is not below it. The same answer whether the
/// file exists or not, until it is below.
std::optional<std::string> config_file(const std::string& dir, const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (ec) return std::nullopt;
  const fs::path p = fs::path(given).is_absolute() ? fs::path(given) : root / given;
  const fs::path real = fs::weakly_canonical(p, ec);
  if (ec) return std::nullopt;
  const fs::path rel = real.lexically_relative(root);
  if (rel.empty() || rel == "." || *rel.begin() == "..") return std::nullopt;
  return real.string();
}

/// A parse failure in words that quote no byte of the file: where it is and
/// which kind (a syntax error, a number past a double, a limit).
std::string parse_failure(const json::ParseError& e) {
  if (!e.limit().empty()) return "byte " + std::to_string(e.byte()) + ": over the JSON limit " + e.limit();
  const std::string what = e.what();
  // parse's syntax errors read "<source>:<line>:<column>: malformed JSON: ...".
  const auto m = what.find(": malformed JSON");
  const auto colon = what.rfind(':', m == std::string::npos ? 0 : m - 1);
  if (m != std::string::npos && colon != std::string::npos) {
    const auto line_start = what.rfind(':', colon - 1);
    if (line_start != std::string::npos)
      return "line " + what.substr(line_start + 1, colon - line_start - 1) + ", column " +
             what.substr(colon + 1, m - colon - 1) + ": malformed JSON";
  }
  return "not a JSON document (a number past a double, or malformed)";
}

}  // namespace

std::vector<ipc::Method> ControlSocket::methods() {
  std::vector<ipc::Method> m;
  m.push_back({"status", "The current gear, its domains (state, devices, traffic share, load) and counters.", {},
               "ftp.status/v1", false, [this](ipc::Call& c) { c.reply(svc_.status()); }});
  m.push_back({"gears", "The gear table in force, with \"current\" naming the current gear.", {},
               "ftp.gear-table/v1 plus current", false, [this](ipc::Call& c) { c.reply(svc_.gears_json()); }});
  m.push_back({"records", "The closing record of every shift so far.", {}, "array of ftp.shift-event/v1 (phase done)",
               false, [this](ipc::Call& c) { c.reply(svc_.records()); }});
  m.push_back({"topology",
               "This machine's devices measured and, with members, each member's, gathered into one topology with "
               "one island per machine and the measured link between machines (fabric network0).",
               {{"quick", "boolean", false, "short measurements (default true)"}},
               "ftp.topology/v1", false, [this](ipc::Call& c) {
                 const Json& p = c.params();
                 if (p.contains("quick") && !p["quick"].is_boolean()) {
                   c.error(ipc::Errc::invalid_params, "quick: must be a boolean", Json{{"param", "quick"}});
                   return;
                 }
                 const bool quick = p.value("quick", true);
                 // Measured off the event loop, which must never block.
                 auto call = c.share();
                 spawn([this, call, quick] {
                   try {
                     call->reply(doc::to_json(svc_.gathered_topology(quick)));
                   } catch (const std::exception& e) {
                     call->error(control_error_code("ftp.ProbeFailed"), "ftp.ProbeFailed", e.what());
                   }
                 });
               }});
  m.push_back(
      {"shift",
       "Shift to a gear: reserve, warm a shadow domain, ramp traffic with checks, drain and retire the old domains; "
       "roll back on a failed check. Streams one ftp.shift-event/v1 per phase step.",
       {{"to", "string", true, "target gear"},
        {"ramp", "array", false, "traffic shares of the ramp, ending at 1.0 (default [0.1, 0.5, 1.0])"},
        {"step_interval_ms", "integer", false, "wait at each ramp step before its check"},
        {"trigger", "string", false, "what asked for the shift (default \"manual\")"},
        {"inject_fault", "string", false, "fault injection for tests: \"check\" fails the first ramp check"}},
       "the closing ftp.shift-event/v1 (phase done, outcome committed|rolled-back|failed)",
       true,
       [this](ipc::Call& c) {
         Service::ShiftOptions o;
         const Json& p = c.params();
         o.to = p.at("to").get<std::string>();
         try {
           if (p.contains("ramp")) o.ramp = p["ramp"].get<std::vector<double>>();
         } catch (const std::exception& e) {
           c.error(ipc::Errc::invalid_params, std::string("ramp: ") + e.what(), Json{{"param", "ramp"}});
           return;
         }
         if (!int_param(c, "step_interval_ms", 0, kDayMs, o.step_interval_ms)) return;
         o.trigger = p.value("trigger", std::string("manual"));
         o.inject_fault = p.value("inject_fault", std::string());
         if (!o.inject_fault.empty() && (!opt_.test_hooks || o.inject_fault != "check")) {
           c.error(ipc::Errc::invalid_params,
                   !opt_.test_hooks ? "inject_fault: a test hook, refused unless ftp-serve runs with --enable-test-hooks"
                                    : "inject_fault: must be \"check\"",
                   Json{{"param", "inject_fault"}});
           return;
         }
         try {
           if (!o.ramp.empty()) check_ramp(o.ramp, "ramp");
         } catch (const InputError& e) {
           c.error(ipc::Errc::invalid_params, e.what(), Json{{"param", "ramp"}});
           return;
         }
         auto call = c.share();
         spawn([this, call, o] {
           try {
             auto done = svc_.shift(o, [&](const doc::ShiftEvent& e) { call->notify(doc::to_json(e)); });
             call->end(doc::to_json(done));
           } catch (const std::exception& e) {
             answer_error(*call, e);
           }
         });
       }});
  m.push_back({"drain",
               "Stop new work on a domain (or the domains on some devices), wait for its in-flight requests, retire "
               "it and release its devices. The last serving domain needs force.",
               {{"domain", "string", false, "domain id"},
                {"devices", "array", false, "device ids: drain every domain holding any of them"},
                {"force", "boolean", false, "allow draining the last serving domain"},
                {"timeout_ms", "integer", false, "give up after this long (default 600000)"}},
               "{\"drained\": [domain ids], \"waited\": requests}",
               true,
               [this](ipc::Call& c) {
                 const Json& p = c.params();
                 std::vector<std::string> ids;
                 if (p.contains("domain")) ids.push_back(p["domain"].get<std::string>());
                 std::vector<std::string> devices;
                 if (p.contains("devices")) {
                   for (std::size_t i = 0; i < p["devices"].size(); ++i) {
                     if (!p["devices"][i].is_string()) {
                       c.error(ipc::Errc::invalid_params, "devices[" + std::to_string(i) +
                                                              "]: expected a device id string, got " +
                                                              p["devices"][i].type_name(),
                               Json{{"param", "devices"}});
                       return;
                     }
                     devices.push_back(p["devices"][i].get<std::string>());
                   }
                   auto more = svc_.domains_on_devices(devices);
                   for (auto& id : more)
                     if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(std::move(id));
                 }
                 if (ids.empty()) {
                   std::string named;
                   for (const auto& d : devices) named += (named.empty() ? "" : ",") + d;
                   c.error(control_error_code("ftp.NoSuchDomain"), "ftp.NoSuchDomain",
                           devices.empty() ? std::string("no domain given")
                                           : "no domain holds any of the devices " + named);
                   return;
                 }
                 bool force = p.value("force", false);
                 int timeout = 600000;
                 // ftp-drain's --timeout goes to 2000000 s.
                 if (!int_param(c, "timeout_ms", 0, 2'000'000'000, timeout)) return;
                 // All or nothing: refuse before draining any domain when
                 // none would be left serving.
                 if (!force && svc_.serving_domains_except(ids) == 0) {
                   c.error(control_error_code("ftp.LastDomain"), "ftp.LastDomain",
                           "draining " + std::to_string(ids.size()) +
                               " domain(s) would leave no serving domain; use force to drain them anyway");
                   return;
                 }
                 auto call = c.share();
                 spawn([this, call, ids, force, timeout] {
                   try {
                     int waited = 0;
                     for (const auto& id : ids)
                       waited += svc_.drain_domain(id, force, timeout, [&](const Json& j) { call->notify(j); });
                     call->end(Json{{"drained", ids}, {"waited", waited}});
                   } catch (const std::exception& e) {
                     answer_error(*call, e);
                   }
                 });
               }});
  m.push_back({"watch", "Stream ftp.observation/v1 documents at an interval until the client goes.",
               {{"interval_ms", "integer", false, "between observations (default 1000, at least 50)"},
                {"count", "integer", false, "stop after this many (default: never)"}},
               "{\"end\": true} after count observations",
               true,
               [this](ipc::Call& c) {
                 int interval = 1000, count = 0;
                 if (!int_param(c, "interval_ms", 50, kDayMs, interval)) return;
                 if (!int_param(c, "count", 0, std::numeric_limits<int>::max(), count)) return;
                 auto call = c.share();
                 spawn([this, call, interval, count] {
                   for (int i = 0; count <= 0 || i < count; ++i) {
                     if (!call->notify(doc::to_json(svc_.observe()))) return;
                     if (count > 0 && i + 1 == count) break;
                     for (int w = 0; w < interval && !call->cancelled(); w += 10)
                       std::this_thread::sleep_for(std::chrono::milliseconds(10));
                   }
                   call->end();
                 });
               }});
  m.push_back({"reload", "Reload the gear table (from path, or the file the daemon started with).",
               {{"path", "string", false, "a ftp.gear-table/v1 file"}},
               "{\"gears\": [names], \"current\": gear}",
               false,
               [this](ipc::Call& c) {
                 auto bad = [&c](const std::string& why) {
                   c.error(control_error_code("ftp.InvalidGearTable"), "ftp.InvalidGearTable", why,
                           Json{{"param", "path"}});
                 };
                 std::string path = opt_.gear_table_path;
                 if (c.params().contains("path")) {
                   // Only a file of the config directory: reload must not read, and
                   // quote back, any file the daemon (root) may read.
                   const std::string given = c.params()["path"].get<std::string>();
                   if (opt_.config_dir.empty() && given != opt_.gear_table_path) {
                     bad("path: reload reads only the daemon's gear table here (ftp-serve --config-dir DIR allows "
                         "others)");
                     return;
                   }
                   if (given != opt_.gear_table_path) {
                     const auto resolved = config_file(opt_.config_dir, given);
                     if (!resolved) {
                       bad("path: outside the config directory " + opt_.config_dir + " (ftp-serve --config-dir)");
                       return;
                     }
                     path = *resolved;
                   }
                 }
                 if (path.empty()) {
                   c.error(control_error_code("ftp.InvalidGearTable"), "ftp.InvalidGearTable",
                           "the daemon runs a --gear layout, not a gear table file: give path");
                   return;
                 }
                 // A regular file of sane size only: a FIFO, /dev/zero or "-"
                 // (stdin) would block or fill the daemon.
                 std::error_code ec;
                 const auto st = std::filesystem::status(path, ec);
                 const bool regular = !ec && std::filesystem::is_regular_file(st);
                 const auto size = regular ? std::filesystem::file_size(path, ec) : 0;
                 if (!regular || ec || size > (64u << 20)) {
                   c.error(control_error_code("ftp.InvalidGearTable"), "ftp.InvalidGearTable",
                           path + ": " + (!regular ? "not a regular file" : "over 64 MiB, not a gear table"),
                           Json{{"param", "path"}});
                   return;
                 }
                 // Read and applied off the event loop, which must never block.
                 auto call = c.share();
                 spawn([this, call, path] {
                   try {
                     auto table = json::parse_file(path, [](const Json& j) { return doc::gear_table_from_json(j); });
                     svc_.reload(table);
                     Json names = Json::array();
                     for (const auto& g : table.gears) names.push_back(g.name);
                     call->reply(Json{{"gears", names}, {"current", svc_.current_gear()}});
                   } catch (const ControlError& e) {
                     call->error(control_error_code(e.name()), e.name(), path + ": " + e.what());
                   } catch (const json::ParseError& e) {
                     // Never a byte of the file: nlohmann quotes what it read last.
                     call->error(control_error_code("ftp.InvalidGearTable"), "ftp.InvalidGearTable",
                                 path + ": " + parse_failure(e));
                   } catch (const std::exception& e) {
                     // parse_file's errors name the file already; the service's do not.
                     std::string what = e.what();
                     if (what.rfind(path + ":", 0) != 0) what = path + ": " + what;
                     call->error(control_error_code("ftp.InvalidGearTable"), "ftp.InvalidGearTable", what);
                   }
                 });
               }});
  return m;
}

}  // namespace ftp::serve
