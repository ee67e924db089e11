// SPDX-License-Identifier: Apache-2.0
#include "core/number.hpp"
#include "serve/shifter.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>

namespace ftp::serve {

using json::Json;
using doc::DomainState;
using doc::ShiftOutcome;
using doc::ShiftPhase;


void check_ramp(const std::vector<double>& shares, const std::string& what) {
  auto list = [&] {
    std::string t;
    for (double v : shares) t += (t.empty() ? "" : ",") + number_text(v);
    return t;
  };
  if (shares.empty()) throw InputError(what + ": no shares; a ramp ends at 1.0 (100 %)");
  for (std::size_t i = 0; i < shares.size(); ++i) {
    if (!(shares[i] > 0 && shares[i] <= 1))
      throw InputError(what + ": share " + number_text(shares[i]) + " is not in (0, 1]");
    if (i > 0 && shares[i] <= shares[i - 1]) throw InputError(what + ": shares must increase, got " + list());
  }
  if (shares.back() != 1.0) throw InputError(what + ": the last share must be 1.0 (100 %), got " + list());
}

Shifter::Shifter(DomainSet& domains, Telemetry& telemetry, DevicePool& pool, WeightResidency* weights,
                 const control::Clock& clock, std::function<std::int64_t()> now_ms, Build build, FindGear find_gear,
                 ShifterConfig config, std::function<void(const std::string&)> on_retired)
    : domains_(domains), telemetry_(telemetry), pool_(pool), weights_(weights), clock_(clock), now_ms_(std::move(now_ms)),
      build_(std::move(build)), find_gear_(std::move(find_gear)), cfg_(std::move(config)),
      on_retired_(std::move(on_retired)) {
  check_ramp(cfg_.ramp, "ramp");
}

void Shifter::set_weights(const DomainList& doms, double share) {
  for (auto& d : doms) d->set_weight(doms.empty() ? 0 : share / static_cast<double>(doms.size()));
}

bool Shifter::wait_drained(const DomainList& doms, int timeout_ms) {
  // A wait on the domains' threads, which run in real time.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (auto& d : doms)
    if (!d->wait_idle(deadline)) return false;
  return true;
}

void Shifter::retire(const DomainList& doms) {
  domains_.retire(doms);
  for (const auto& d : doms) {
    pool_.release(d->id());
    if (on_retired_) on_retired_(d->id());
  }
}

void Shifter::reap_drained() {
  DomainList idle;
  for (auto& d : domains_.in_state(DomainState::draining))
    if (d->inflight() == 0) idle.push_back(d);
  retire(idle);
  std::vector<std::string> gears;
  for (const auto& d : idle)
    if (std::find(gears.begin(), gears.end(), d->gear()) == gears.end()) gears.push_back(d->gear());
  for (const auto& g : gears) release_weights_leaving(g);
}

std::uint64_t Shifter::release_weights_leaving(const std::string& gear) {
  const std::optional<doc::Gear> from = find_gear_(gear);
  if (!from || !weights_) return 0;
  // The devices of the domains that remain keep their weights.
  return weights_->release(*from, domains_.devices_in_use());
}

void Shifter::outside_shift(const std::function<void()>& fn) {
  std::unique_lock sl(op_mu_, std::try_to_lock);
  if (!sl.owns_lock())
    throw ControlError("ftp.ShiftInProgress", "a shift is in progress; reload the gear table after it");
  fn();
}

void Shifter::set_journal(Journal* journal) {
  std::lock_guard lk(records_mu_);
  journal_ = journal;
  if (journal_) next_shift_ = std::max(next_shift_, journal_->last_shift_number());
}

Json Shifter::records() const {
  if (journal_) return journal_->records();
  Json out = Json::array();
  std::lock_guard lk(records_mu_);
  for (const auto& r : records_) out.push_back(doc::to_json(r));
  return out;
}

doc::ShiftEvent Shifter::shift(const ShiftOptions& o, const Progress& progress, bool accepting) {
  std::unique_lock sl(op_mu_, std::try_to_lock);
  if (!sl.owns_lock()) throw ControlError("ftp.ShiftInProgress", "a shift is in progress; one shift at a time");
  reap_drained();
  const std::optional<doc::Gear> target = find_gear_(o.to);
  if (!target) throw ControlError("ftp.NoSuchGear", "no gear \"" + o.to + "\" in the gear table", Exit::usage);
  if (!accepting) throw ControlError("ftp.NotServing", "the service is draining");
  const std::string from = domains_.gear();
  if (from == o.to && domains_.serving() > 0)
    throw ControlError("ftp.SameGear", "already in gear \"" + o.to + "\"", Exit::usage);
  const std::vector<double> ramp = o.ramp.empty() ? cfg_.ramp : o.ramp;
  check_ramp(ramp, "ramp");
  const int step_ms = o.step_interval_ms >= 0 ? o.step_interval_ms : cfg_.step_interval_ms;

  shifting_ = true;
  struct Reset {
    std::atomic<bool>& f;
    ~Reset() { f = false; }
  } reset{shifting_};

  // Release weight mode: what the target's devices freed starts coming back
  // now (or the mapped pages are prefetched), on a thread of its own, so
  // that the copy overlaps the reservation instead of the first steps.
  std::future<WeightCopy> coming;
  if (weights_) {
    try {
      coming = weights_->restore(*target);
    } catch (...) {
      std::promise<WeightCopy> failed;
      failed.set_exception(std::current_exception());
      coming = failed.get_future();
    }
  }

  doc::ShiftEvent ev;
  {
    std::lock_guard lk(records_mu_);
    ev.shift_id = "shift-" + std::to_string(++next_shift_);
  }
  ev.from = from;
  ev.to = o.to;
  ev.trigger = o.trigger;
  const std::int64_t t_start = now_ms_();
  const doc::Percentiles before = telemetry_.e2e_since(t_start - 60000);
  std::int64_t phase_us = clock_.now_us();
  auto emit = [&](ShiftPhase phase, double share, const std::string& msg) {
    ev.t_ms = now_ms_();
    ev.phase = phase;
    ev.traffic_share = share;
    const std::int64_t t_us = clock_.now_us();
    ev.phase_ms = static_cast<double>(t_us - phase_us) / 1000.0;
    ev.message = msg;
    phase_us = t_us;
    telemetry_.shift_event(ev);
    if (journal_) {
      try {
        journal_->append(ev);
      } catch (const std::exception&) {
        // A full disk must not stop a shift; the records in memory remain.
      }
    }
    if (progress) progress(ev);
  };

  DomainList fresh;
  auto finish = [&](ShiftOutcome outcome, const std::string& msg) {
    ev.outcome = outcome;
    ev.before = before;
    ev.after = telemetry_.e2e_since(t_start);
    emit(ShiftPhase::done, outcome == ShiftOutcome::committed ? 1.0 : 0.0, msg);
    {
      std::lock_guard lk(records_mu_);
      records_.push_back(ev);
    }
    return ev;
  };

  const DomainList old = domains_.in_state(DomainState::serving);
  const std::vector<std::string> devs = target->devices();
  std::string devlist;
  for (const auto& d : devs) devlist += (devlist.empty() ? "" : ",") + d;
  // The reserve phase ends when the weights are there.
  std::string reserve_msg = "devices " + devlist;
  if (coming.valid()) {
    WeightCopy copy;
    try {
      copy = coming.get();
    } catch (const std::exception& e) {
      const std::string why = std::string("reserve: weights: ") + e.what();
      emit(ShiftPhase::reserve, 0, why);
      return finish(ShiftOutcome::failed, why);
    }
    if (copy.freed_before) {
      reserve_msg += "; weights copied back: " + std::to_string(copy.bytes) + " bytes in " + number_text(copy.ms) + " ms";
      ev.weights_copied_bytes = copy.bytes;
      ev.weights_copy_ms = copy.ms;
    } else if (target->weight_mode == "release") {
      reserve_msg += "; weights prefetched: " + std::to_string(copy.bytes) + " bytes";
    }
  }
  emit(ShiftPhase::reserve, 0, reserve_msg);
  ev.weights_copied_bytes.reset();
  ev.weights_copy_ms.reset();

  auto rollback = [&](const std::string& why) {
    // Traffic returns to the old domains; the shadow drains and retires.
    set_weights(old, 1.0);
    set_weights(fresh, 0.0);
    // Draining keeps its CPU priority (issue 20: at nice +10 a drain under
    // full load took 45 s); drain_timeout_ms is its deadline.
    for (auto& d : fresh) {
      d->set_state(DomainState::draining);
      d->withdraw_unstarted();  // the old domains take what has not started
    }
    emit(ShiftPhase::rollback, 0, why);
    // A shadow that cannot drain in time stays draining and retires at the
    // next shift or drain (reap_drained).
    if (wait_drained(fresh, cfg_.drain_timeout_ms)) retire(fresh);
    return finish(ShiftOutcome::rolled_back, why);
  };

  const std::uint64_t copied_before = weights_ ? weights_->copied_bytes() : 0;
  const engine::CommunicatorStats comm_before = comm_stats_ ? comm_stats_() : engine::CommunicatorStats{};
  WarmUpFacts warmed;
  try {
    fresh = build_(*target, true, warmed);
  } catch (const std::exception& e) {
    for (auto& d : fresh) d->stop();
    fresh.clear();
    return finish(ShiftOutcome::failed, std::string("warm-up: ") + e.what());
  }
  domains_.add(fresh);
  std::string warm_msg = std::to_string(fresh.size()) + " domain(s) built and warmed";
  // Device-memory mode: the domains view the devices' copies; what they copied is measured, not assumed.
  if (weights_ && weights_->device_memory())
    warm_msg += "; weights copied: " + std::to_string(weights_->copied_bytes() - copied_before) + " bytes";
  if (comm_stats_) {
    // Pooled ahead (Service::start, reload): 0 and 0 ms; measured, not assumed.
    const engine::CommunicatorStats now = comm_stats_();
    ev.communicators_created = now.created - comm_before.created;
    ev.communicator_ms = now.create_ms - comm_before.create_ms;
    warm_msg += "; communicators created: " + std::to_string(*ev.communicators_created) + " in " +
                number_text(*ev.communicator_ms) + " ms";
  }
  // The dummy requests each new domain ran before it serves: its decode
  // batch sizes (their CUDA graphs captured there, not at first use).
  ev.warm_batch_sizes = warmed.batch_sizes;
  ev.graphs_captured = warmed.graphs_captured;
  ev.warmup_ms = warmed.ms;
  std::string sizes;
  for (int b : warmed.batch_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
  warm_msg += "; warm-up at batch sizes " + (sizes.empty() ? std::string("(none)") : sizes) + " in " +
              number_text(warmed.ms) + " ms, graphs captured: " + std::to_string(warmed.graphs_captured);
  emit(ShiftPhase::warm, 0, warm_msg);
  ev.communicators_created.reset();
  ev.communicator_ms.reset();
  ev.warm_batch_sizes.reset();
  ev.graphs_captured.reset();
  ev.warmup_ms.reset();

  const bool fault = o.inject_fault == "check";
  for (double share : ramp) {
    const std::int64_t step_start = now_ms_();
    set_weights(fresh, share);
    set_weights(old, 1.0 - share);
    if (share >= 1.0) {
      emit(ShiftPhase::ramp, share, "100 % of new requests on the new domains");
      break;
    }
    if (step_ms > 0) clock_.sleep_for_ms(step_ms);
    // The check: no failed request on the new domains, and their P99 E2E
    // within rollback_p99_factor of the pre-shift baseline.
    std::uint64_t errs = 0;
    double p99 = 0;
    std::size_t samples = 0;
    for (auto& d : fresh) {
      errs += d->errors.load();
      p99 = std::max(p99, d->e2e.percentile(99, step_start));
      samples += d->e2e.count(step_start);
    }
    std::string why;
    if (fault)
      why = "fault injected: check failed";
    else if (errs > 0)
      why = std::to_string(errs) + " request(s) failed on the new domains";
    else if (samples >= 20 && before.p99 > 0 && p99 > cfg_.rollback_p99_factor * before.p99)
      why = "P99 E2E " + number_text(p99) + " ms > " + number_text(cfg_.rollback_p99_factor) + " x baseline " + number_text(before.p99) + " ms";
    if (!why.empty()) return rollback(why);
    emit(ShiftPhase::ramp, share, "check passed (" + std::to_string(samples) + " samples, P99 " + number_text(p99) + " ms)");
  }

  for (auto& d : old) {
    d->set_state(DomainState::draining);
    d->set_weight(0);  // at its priority, under drain_timeout_ms (see the rollback's)
  }
  for (auto& d : fresh) d->set_state(DomainState::serving);
  // The old domains finish only what they have begun; what waits there
  // goes to the new ones (issue 20: a drain under full load ends within
  // the time of the longest request in flight, not of the whole queue).
  for (auto& d : old) d->withdraw_unstarted();
  domains_.set_gear(target->name);
  const bool drained = wait_drained(old, cfg_.drain_timeout_ms);
  emit(ShiftPhase::drain, 1.0,
       drained ? "old domains drained"
               : "drain timed out after " + std::to_string(cfg_.drain_timeout_ms) +
                     " ms; the old domains finish their requests in the background and retire at the next shift or "
                     "drain");
  std::string retire_msg;
  if (drained) {
    retire(old);
    retire_msg = std::to_string(old.size()) + " old domain(s) retired, devices released";
    // Release weight mode: devices that leave drop their weights.
    if (std::uint64_t bytes = release_weights_leaving(from); bytes > 0) {
      retire_msg += "; weights released: " + std::to_string(bytes) + " bytes";
      ev.weights_released_bytes = bytes;
    }
  } else {
    retire_msg = std::to_string(old.size()) + " old domain(s) still draining; none retired yet";
  }
  emit(ShiftPhase::retire, 1.0, retire_msg);
  ev.weights_released_bytes.reset();
  return finish(ShiftOutcome::committed, "shifted " + from + " -> " + target->name);
}

int Shifter::drain_domain(const std::string& id, bool force, int timeout_ms,
                          const std::function<void(const Json&)>& progress) {
  std::lock_guard sl(op_mu_);  // not during a shift
  reap_drained();
  std::shared_ptr<DomainRunner> dom = domains_.find(id);
  if (!dom) throw ControlError("ftp.NoSuchDomain", "no domain \"" + id + "\"", Exit::usage);
  DomainList others;
  for (auto& d : domains_.in_state(DomainState::serving))
    if (d != dom) others.push_back(d);
  if (others.empty() && !force)
    throw ControlError("ftp.LastDomain", "domain " + id + " is the last serving domain; use force to drain it anyway");
  dom->set_state(DomainState::draining);
  dom->set_weight(0);
  set_weights(others, 1.0);
  if (!others.empty()) dom->withdraw_unstarted();  // the others take what has not started
  const int waited = dom->inflight();
  if (progress) progress(Json{{"domain", id}, {"state", "draining"}, {"inflight", waited}});
  if (!wait_drained({dom}, timeout_ms))
    throw ControlError("ftp.DrainTimeout",
                       "domain " + id + " still has " + std::to_string(dom->inflight()) + " request(s) after " +
                           std::to_string(timeout_ms) + " ms",
                       Exit::timeout);
  retire({dom});
  if (progress) progress(Json{{"domain", id}, {"state", "retired"}, {"devices", dom->devices()}});
  return waited;
}

void Shifter::drain_all() {
  // Wait for a shift in progress to end, then let every domain finish its work.
  std::lock_guard sl(op_mu_);
  const DomainList doms = domains_.all();
  for (auto& d : doms) d->set_state(DomainState::draining);
  if (!wait_drained(doms, cfg_.drain_timeout_ms)) {
    // Out of time: the requests still running end with an error event (none
    // is dropped without one; the HTTP log names each), then the domains stop.
    const std::string why = "the service is stopping and the drain timeout of " +
                            std::to_string(cfg_.drain_timeout_ms) + " ms has passed";
    for (auto& d : doms) d->abort_all(why);
  }
  retire(doms);
}

}  // namespace ftp::serve
