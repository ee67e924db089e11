// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "control/clock.hpp"
#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/control.hpp"
#include "doc/gear_table.hpp"
#include "engine/rank_backend.hpp"
#include "serve/device_pool.hpp"
#include "serve/domain_set.hpp"
#include "serve/journal.hpp"
#include "serve/telemetry.hpp"
#include "serve/weight_residency.hpp"

namespace ftp::serve {

/// A refused control operation, with its ftp.* error name (ftp.NoSuchGear,
/// ftp.ShiftInProgress, ftp.LastDomain, ftp.NoSuchDomain, ...).
class ControlError : public Error {
 public:
  ControlError(std::string name, std::string message, Exit exit = Exit::failure)
      : Error(std::move(message), exit), name_(std::move(name)) {}
  const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
};

/// Checks a shift's ramp (new domains' traffic shares): each in (0, 1],
/// increasing, the last 1.0. Throws InputError starting with `what`.
void check_ramp(const std::vector<double>& shares, const std::string& what);

/// One shift's request.
struct ShiftOptions {
  std::string to;
  std::string trigger = "manual";
  std::vector<double> ramp;          ///< empty: the shifter's
  int step_interval_ms = -1;         ///< < 0: the shifter's
  /// Fault injection for tests: "check" fails the first ramp check.
  std::string inject_fault;
};

/// What warming a gear's new domains ran (Service::build_domains,
/// engine::Domain::warm_up), for the shift record's warm phase.
struct WarmUpFacts {
  std::vector<int> batch_sizes;       ///< decode batch sizes run, over all the domains, ascending
  std::uint64_t graphs_captured = 0;  ///< CUDA graphs captured during the warm-ups (0 on CPU)
  double ms = 0;                      ///< wall time of the domains' warm-ups, ms
};

/// The shifter's fixed settings (ServiceConfig's).
struct ShifterConfig {
  std::vector<double> ramp = {0.1, 0.5, 1.0};
  int step_interval_ms = 1000;         ///< wait at each ramp step before its check, on the clock
  double rollback_p99_factor = 1.5;    ///< a ramp check fails when P99 E2E > factor x baseline
  int drain_timeout_ms = 600000;
};

/// Runs the control operations that change which domains serve
/// (ARCHITECTURE.md's shift): reserve -> warm a shadow -> ramp its traffic
/// with checks -> drain the old domains -> retire them, rolling back on a
/// failed check (an error on the new domains, or their P99 E2E over
/// rollback_p99_factor x the pre-shift baseline); ftp-drain's drain of one
/// domain; the drain of all at shutdown. One operation at a time. The ramp
/// waits on the injected clock, so shift tests run in virtual time; drains
/// wait on the domains' threads (real time, bounded by a timeout).
class Shifter {
 public:
  /// Builds and warms the domains of a gear (slow start for shadows); says
  /// what the warm-up ran in `warm`.
  using Build = std::function<DomainList(const doc::Gear& gear, bool slow_start, WarmUpFacts& warm)>;
  /// The gear table's gear of that name, or nothing (the table may be reloaded).
  using FindGear = std::function<std::optional<doc::Gear>(const std::string& name)>;
  using Progress = std::function<void(const doc::ShiftEvent&)>;

  /// All must outlive the shifter. `weights` may be null (an engine
  /// factory's domains keep no weights of the service). `on_retired` is
  /// told of each retired domain's id (the router forgets it).
  Shifter(DomainSet& domains, Telemetry& telemetry, DevicePool& pool, WeightResidency* weights,
          const control::Clock& clock, std::function<std::int64_t()> now_ms, Build build, FindGear find_gear,
          ShifterConfig config, std::function<void(const std::string&)> on_retired);

  /// Runs a whole shift on the calling thread and returns its closing
  /// record. `accepting`: the service takes requests (else ftp.NotServing).
  /// Throws ControlError when refused before it starts: ftp.NoSuchGear,
  /// ftp.SameGear, ftp.ShiftInProgress, ftp.NotServing.
  doc::ShiftEvent shift(const ShiftOptions& options, const Progress& progress, bool accepting);
  /// Drains one domain (no new requests; in-flight ones finish) and retires
  /// it. Refuses the last serving domain unless `force`. Returns the number
  /// of requests it waited for.
  int drain_domain(const std::string& domain_id, bool force, int timeout_ms,
                   const std::function<void(const json::Json&)>& progress);
  /// Shutdown: waits for a shift in progress, drains every domain (those
  /// still running requests after drain_timeout_ms end them with an error
  /// event) and retires them.
  void drain_all();
  /// The reload of a gear table may not overlap a shift: runs `fn` when no
  /// shift runs, else throws ftp.ShiftInProgress.
  void outside_shift(const std::function<void()>& fn);

  bool shifting() const noexcept { return shifting_.load(); }
  /// Closing records of every shift so far: the journal's (earlier runs
  /// included) when there is one, else this run's.
  json::Json records() const;
  /// Appends every shift event to `journal` (null: none; it must outlive
  /// the shifter); shift ids continue after the journal's last.
  void set_journal(Journal* journal);
  /// What the engine backend's communicator pool has made so far
  /// (engine::Backend::communicator_stats): the warm phase records what
  /// building its domains added. Null: not recorded.
  void set_communicator_stats(std::function<engine::CommunicatorStats()> stats) { comm_stats_ = std::move(stats); }

 private:
  void set_weights(const DomainList& doms, double share);
  bool wait_drained(const DomainList& doms, int timeout_ms);
  void retire(const DomainList& doms);
  /// Retires draining domains left idle by a drain that timed out (under op_mu_).
  void reap_drained();
  /// Release weight mode: the weights of `gear`'s devices that no domain
  /// uses any more are freed (WeightResidency::release); returns the bytes
  /// (0 for resident).
  std::uint64_t release_weights_leaving(const std::string& gear);

  DomainSet& domains_;
  Telemetry& telemetry_;
  DevicePool& pool_;
  WeightResidency* weights_;
  const control::Clock& clock_;
  std::function<std::int64_t()> now_ms_;
  Build build_;
  FindGear find_gear_;
  ShifterConfig cfg_;
  std::function<void(const std::string&)> on_retired_;
  std::mutex op_mu_;  // one shift or drain at a time
  std::atomic<bool> shifting_{false};
  mutable std::mutex records_mu_;
  std::vector<doc::ShiftEvent> records_;
  std::uint64_t next_shift_ = 0;
  Journal* journal_ = nullptr;
  std::function<engine::CommunicatorStats()> comm_stats_;
};

}  // namespace ftp::serve
