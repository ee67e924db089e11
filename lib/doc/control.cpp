// SPDX-License-Identifier: Apache-2.0
#include "doc/control.hpp"

#include <limits>

#include "core/error.hpp"
#include "doc/kinds.hpp"

namespace ftp::doc {

using json::Json;
using json::Node;

namespace {

Json pct(const Percentiles& p) { return Json{{"p50", p.p50}, {"p99", p.p99}}; }

Percentiles pct_from(const Node& n) {
  n.expect_object();
  Percentiles p;
  p.p50 = n.positive("p50", true);
  p.p99 = n.positive("p99", true);
  if (p.p99 < p.p50) n.at("p99").fail("must not be below p50");
  return p;
}

Percentiles pct_or_zero(const Node& parent, std::string_view key) {
  auto n = parent.find(key);
  return n ? pct_from(*n) : Percentiles{};
}

double ratio(const Node& n, std::string_view key) {
  if (!n.has(key)) return 0;
  double v = n.positive(key, true);
  if (v > 1) n.at(key).fail("must be a ratio in [0, 1], got " + Json(v).dump());
  return v;
}

double nonneg_or_zero(const Node& n, std::string_view key) { return n.has(key) ? n.positive(key, true) : 0; }


}  // namespace

Json to_json(const Observation& o) {
  Json devices = Json::array();
  for (const auto& d : o.devices) devices.push_back(Json{{"id", d.id}, {"utilization", d.utilization}});
  Json domains = Json::array();
  for (const auto& d : o.domains)
    domains.push_back(Json{{"id", d.id},
                           {"gear", d.gear},
                           {"state", std::string(to_string(d.state))},
                           {"devices", d.devices},
                           {"traffic_share", d.traffic_share},
                           {"running", d.running},
                           {"waiting", d.waiting}});
  Json j{{"kind", kind::observation},
              {"t_ms", o.t_ms},
              {"gear", o.gear},
              {"shifting", o.shifting},
              {"queue_depth", o.queue_depth},
              {"queue_depth_mean", o.queue_depth_mean},
              {"est_queue_time_ms", o.est_queue_time_ms},
              {"request_rate", o.request_rate},
              {"prompt_token_rate", o.prompt_token_rate},
              {"decode_token_rate", o.decode_token_rate},
              {"queued_prompt_tokens", o.queued_prompt_tokens},
              {"predicted_rate", o.predicted_rate},
              {"mean_prompt_tokens", o.mean_prompt_tokens},
              {"mean_output_tokens", o.mean_output_tokens},
              {"bubble_ratio", o.bubble_ratio},
              {"contention_index", o.contention_index},
              {"kv_watermark", o.kv_watermark},
              {"ttft_ms", pct(o.ttft_ms)},
              {"tpot_ms", pct(o.tpot_ms)},
              {"e2e_ms", pct(o.e2e_ms)},
              {"devices", devices},
              {"domains", domains}};
  if (!o.lost_devices.empty()) {
    Json lost = Json::array();
    for (const auto& d : o.lost_devices) lost.push_back(Json{{"id", d.id}, {"why", d.why}});
    j["lost_devices"] = lost;
  }
  if (!o.gpus.empty()) {
    Json gpus = Json::array();
    for (const auto& g : o.gpus) {
      Json x{{"id", g.id},
             {"uuid", g.uuid},
             {"utilization", g.utilization},
             {"memory_utilization", g.memory_utilization},
             {"memory_total", g.memory_total},
             {"memory_used", g.memory_used},
             {"other_memory", g.other_memory},
             {"other_compute", g.other_compute},
             {"other_processes", g.other_processes},
             {"ecc_uncorrected", g.ecc_uncorrected},
             {"available", g.available}};
      if (!g.unavailable_because.empty()) x["unavailable_because"] = g.unavailable_because;
      gpus.push_back(std::move(x));
    }
    j["gpus"] = gpus;
  }
  if (!o.gpu_signals_unavailable.empty()) j["gpu_signals_unavailable"] = o.gpu_signals_unavailable;
  return j;
}

Observation observation_from_json(const Json& j) {
  Node r(j, "");
  json::expect_kind(r, kind::observation);
  Observation o;
  o.t_ms = r.integer("t_ms");
  o.gear = r.str("gear");
  o.shifting = r.boolean_or("shifting", false);
  o.queue_depth = nonneg_or_zero(r, "queue_depth");
  o.queue_depth_mean = nonneg_or_zero(r, "queue_depth_mean");
  o.est_queue_time_ms = nonneg_or_zero(r, "est_queue_time_ms");
  o.request_rate = nonneg_or_zero(r, "request_rate");
  o.prompt_token_rate = nonneg_or_zero(r, "prompt_token_rate");
  o.decode_token_rate = nonneg_or_zero(r, "decode_token_rate");
  o.queued_prompt_tokens = nonneg_or_zero(r, "queued_prompt_tokens");
  o.predicted_rate = nonneg_or_zero(r, "predicted_rate");
  o.mean_prompt_tokens = nonneg_or_zero(r, "mean_prompt_tokens");
  o.mean_output_tokens = nonneg_or_zero(r, "mean_output_tokens");
  o.bubble_ratio = ratio(r, "bubble_ratio");
  o.contention_index = ratio(r, "contention_index");
  o.kv_watermark = ratio(r, "kv_watermark");
  o.ttft_ms = pct_or_zero(r, "ttft_ms");
  o.tpot_ms = pct_or_zero(r, "tpot_ms");
  o.e2e_ms = pct_or_zero(r, "e2e_ms");
  if (auto ds = r.find("devices"))
    for (const auto& n : ds->items()) o.devices.push_back(DeviceLoad{n.str("id"), ratio(n, "utilization")});
  if (auto ds = r.find("domains")) {
    for (const auto& n : ds->items()) {
      DomainView d;
      d.id = n.str("id");
      d.gear = n.str("gear");
      d.state = *domain_state_from(n.one_of("state", domain_state_names()));
      if (auto devs = n.find("devices"))
        for (const auto& dn : devs->items()) d.devices.push_back(dn.str());
      d.traffic_share = ratio(n, "traffic_share");
      d.running = n.has("running") ? n.positive_int("running", true) : 0;
      d.waiting = n.has("waiting") ? n.positive_int("waiting", true) : 0;
      o.domains.push_back(std::move(d));
    }
  }
  if (auto ls = r.find("lost_devices"))
    for (const auto& n : ls->items()) o.lost_devices.push_back(LostDevice{n.str("id"), n.has("why") ? n.str("why") : ""});
  if (auto gs = r.find("gpus"))
    for (const auto& n : gs->items()) {
      GpuLoad g;
      g.id = n.str("id");
      g.uuid = n.has("uuid") ? n.str("uuid") : "";
      g.utilization = ratio(n, "utilization");
      g.memory_utilization = ratio(n, "memory_utilization");
      g.memory_total = static_cast<std::uint64_t>(nonneg_or_zero(n, "memory_total"));
      g.memory_used = static_cast<std::uint64_t>(nonneg_or_zero(n, "memory_used"));
      g.other_memory = static_cast<std::uint64_t>(nonneg_or_zero(n, "other_memory"));
      g.other_compute = ratio(n, "other_compute");
      g.other_processes = n.has("other_processes") ? n.positive_int("other_processes", true) : 0;
      g.ecc_uncorrected = static_cast<std::uint64_t>(nonneg_or_zero(n, "ecc_uncorrected"));
      g.available = n.boolean_or("available", true);
      g.unavailable_because = n.has("unavailable_because") ? n.str("unavailable_because") : "";
      o.gpus.push_back(std::move(g));
    }
  if (r.has("gpu_signals_unavailable")) o.gpu_signals_unavailable = r.str("gpu_signals_unavailable");
  return o;
}

Json to_json(const Decision& d) {
  Json signals = Json::array();
  for (const auto& s : d.signals)
    signals.push_back(Json{{"name", s.name}, {"value", s.value}, {"threshold", s.threshold}, {"agrees", s.agrees}});
  Json o{{"kind", kind::decision}, {"t_ms", d.t_ms}, {"action", d.action}, {"from", d.from}};
  if (!d.to.empty()) o["to"] = d.to;
  o["policy"] = d.policy;
  o["reason"] = d.reason;
  o["signals"] = signals;
  if (d.not_before_ms) o["not_before_ms"] = d.not_before_ms;
  if (!d.ramp.empty()) o["ramp"] = d.ramp;
  if (d.ramp_step_ms >= 0) o["ramp_step_ms"] = d.ramp_step_ms;
  return o;
}

Decision decision_from_json(const Json& j) {
  Node r(j, "");
  json::expect_kind(r, kind::decision);
  Decision d;
  d.t_ms = r.integer("t_ms");
  d.action = r.one_of("action", {"hold", "shift"});
  d.from = r.str_or("from", "");
  d.to = r.str_or("to", "");
  if (d.action == "shift" && d.to.empty()) r.at("to");  // throws: a shift names its target
  if (d.action == "shift" && d.to == d.from) r.at("to").fail("a shift must change the gear, got \"" + d.to + "\" twice");
  d.policy = r.str("policy");
  d.reason = r.str_or("reason", "");
  if (auto ss = r.find("signals")) {
    for (const auto& n : ss->items()) {
      Signal s;
      s.name = n.str("name");
      s.value = n.number("value");
      s.threshold = n.number_or("threshold", 0);
      s.agrees = n.boolean_or("agrees", false);
      d.signals.push_back(std::move(s));
    }
  }
  d.not_before_ms = r.integer_or("not_before_ms", 0);
  if (auto ramp = r.find("ramp")) {
    ramp->expect_array();
    for (const auto& n : ramp->items()) {
      const double share = n.number();
      if (!(share > 0 && share <= 1) || (!d.ramp.empty() && share <= d.ramp.back()))
        n.fail("a ramp's shares increase within (0, 1], got " + json::dump(n.value(), json::Style::short_));
      d.ramp.push_back(share);
    }
    if (d.ramp.empty() || d.ramp.back() != 1.0) ramp->fail("a ramp ends at 1 (100 %)");
  }
  if (r.has("ramp_step_ms")) d.ramp_step_ms = r.positive_integer("ramp_step_ms", true);
  return d;
}

Json to_json(const ShiftEvent& e) {
  Json o{{"kind", kind::shift_event}, {"shift_id", e.shift_id}, {"t_ms", e.t_ms}, {"phase", std::string(to_string(e.phase))},
         {"from", e.from},            {"to", e.to},             {"trigger", e.trigger},
         {"traffic_share", e.traffic_share}, {"phase_ms", e.phase_ms}};
  if (e.outcome) o["outcome"] = std::string(to_string(*e.outcome));
  if (!e.message.empty()) o["message"] = e.message;
  if (e.before) o["before_e2e_ms"] = pct(*e.before);
  if (e.after) o["after_e2e_ms"] = pct(*e.after);
  if (e.weights_copied_bytes) o["weights_copied_bytes"] = *e.weights_copied_bytes;
  if (e.weights_copy_ms) o["weights_copy_ms"] = *e.weights_copy_ms;
  if (e.weights_released_bytes) o["weights_released_bytes"] = *e.weights_released_bytes;
  if (e.communicators_created) o["communicators_created"] = *e.communicators_created;
  if (e.communicator_ms) o["communicator_ms"] = *e.communicator_ms;
  if (e.warm_batch_sizes) o["warm_batch_sizes"] = *e.warm_batch_sizes;
  if (e.graphs_captured) o["graphs_captured"] = *e.graphs_captured;
  if (e.warmup_ms) o["warmup_ms"] = *e.warmup_ms;
  return o;
}

ShiftEvent shift_event_from_json(const Json& j) {
  Node r(j, "");
  json::expect_kind(r, kind::shift_event);
  ShiftEvent e;
  e.shift_id = r.str("shift_id");
  e.t_ms = r.integer("t_ms");
  e.phase = *shift_phase_from(r.one_of("phase", shift_phase_names()));
  e.from = r.str("from");
  e.to = r.str("to");
  e.trigger = r.str_or("trigger", "");
  e.traffic_share = ratio(r, "traffic_share");
  e.phase_ms = nonneg_or_zero(r, "phase_ms");
  if (e.phase == ShiftPhase::done)
    e.outcome = *shift_outcome_from(r.one_of("outcome", shift_outcome_names()));
  else if (r.has("outcome"))
    r.at("outcome").fail("only the \"done\" record carries an outcome, this is phase \"" +
                         std::string(to_string(e.phase)) + "\"");
  e.message = r.str_or("message", "");
  if (auto b = r.find("before_e2e_ms")) e.before = pct_from(*b);
  if (auto a = r.find("after_e2e_ms")) e.after = pct_from(*a);
  auto bytes = [&](const char* k) -> std::optional<std::uint64_t> {
    if (!r.has(k)) return std::nullopt;
    return static_cast<std::uint64_t>(r.positive_integer(k, true));
  };
  e.weights_copied_bytes = bytes("weights_copied_bytes");
  e.weights_released_bytes = bytes("weights_released_bytes");
  e.communicators_created = bytes("communicators_created");
  if (r.has("weights_copy_ms")) e.weights_copy_ms = nonneg_or_zero(r, "weights_copy_ms");
  if (r.has("communicator_ms")) e.communicator_ms = nonneg_or_zero(r, "communicator_ms");
  if (auto sizes = r.find("warm_batch_sizes")) {
    e.warm_batch_sizes.emplace();
    for (const auto& n : sizes->items()) {
      const std::int64_t b = n.integer();
      if (b < 1 || b > std::numeric_limits<int>::max())
        n.fail("a batch size must be between 1 and " + std::to_string(std::numeric_limits<int>::max()) + ", got " +
               std::to_string(b));
      e.warm_batch_sizes->push_back(static_cast<int>(b));
    }
  }
  e.graphs_captured = bytes("graphs_captured");
  if (r.has("warmup_ms")) e.warmup_ms = nonneg_or_zero(r, "warmup_ms");
  return e;
}

}  // namespace ftp::doc
