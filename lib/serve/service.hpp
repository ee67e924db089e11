// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/control.hpp"
#include "doc/gear_table.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "hardware/nvml.hpp"
#include "control/router.hpp"
#include "control/clock.hpp"
#include "engine/domain.hpp"
#include "member/leader.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "doc/topology.hpp"
#include "serve/admission.hpp"
#include "serve/device_pool.hpp"
#include "serve/domain_runner.hpp"
#include "serve/domain_set.hpp"
#include "serve/generate.hpp"
#include "serve/journal.hpp"
#include "serve/output_processor.hpp"
#include "serve/request.hpp"
#include "serve/rerun.hpp"
#include "serve/shifter.hpp"
#include "serve/telemetry.hpp"
#include "serve/weight_residency.hpp"

namespace ftp::serve {

/// What the daemon serves and how.
struct ServiceConfig {
  std::string model_name;              ///< id in /v1/models
  doc::GearTable gears;                ///< the gear table (a one-gear table for --gear)
  std::string start_gear;              ///< default: gears[0]
  /// KV pages per domain; 0 (the default): the gear's kv_cache_cap of the
  /// free memory of each of its devices (CPU virtual devices; GPUs: what
  /// is free less the weights not resident yet, shared among all the gear's
  /// ranks on one GPU), at most what max_running requests of the full
  /// context need (Service::kv_blocks_for).
  int kv_blocks = 0;
  int block_tokens = 16;
  /// The KV pages' element type (ftp-serve --kv-cache-dtype): automatic is
  /// 16 bits in the model's compute type (engine::resolve_kv_dtype).
  engine::KvDtype kv_dtype = engine::KvDtype::automatic;
  int max_batched_tokens = 256;
  int max_running = 64;
  /// The shift journal's directory (Journal); empty: no journal, the
  /// records live in memory only.
  std::string state_dir;
  /// Admission control: the waiting queue's bounds (service and per domain).
  AdmissionLimits admission;
  int max_prompt_tokens = 0;           ///< 0: the model's context - 1
  int max_tokens_limit = 2048;         ///< largest max_tokens a request may ask
  std::vector<double> ramp = {0.1, 0.5, 1.0};
  int step_interval_ms = 1000;         ///< wait at each ramp step before its check
  double rollback_p99_factor = 1.5;    ///< a ramp check fails when P99 E2E > factor x baseline
  int drain_timeout_ms = 600000;
  /// A request whose domain fails (its engine: a member lost under it)
  /// before it streamed anything runs again on another domain; this is how
  /// long it may wait for one (a shift, ftp-serve --auto) before it ends
  /// with the error of its domain (ftp-serve --rerun-wait-ms).
  int rerun_wait_ms = 30000;
  int slow_start_steps = 20;           ///< a new domain's batch cap is 70 % for this many steps
  /// Router rules: a request with priority > 0, or a prompt of at least this
  /// many tokens (0: off), goes to the serving domain of the largest TP degree.
  int route_long_prompt_tokens = 0;
  /// The real engine's backend: "cpu" (virtual devices) or "cuda". A
  /// gear's devices bind through the service's DevicePool: with cpu, CPU
  /// virtual devices vd<N>; with cuda, GPUs gpu<N> (CUDA ordinal N) and
  /// vd<N> as ranks sharing gpu0. Any other name is refused.
  std::string backend = "cpu";
  /// CPU virtual devices vd0..vd<N-1> to make; 0: as many as the gear
  /// table's highest vd<N> needs.
  int virtual_devices = 0;
  /// Each CPU virtual device's memory budget, bytes (ftp-serve
  /// --virtual-device-memory); 0: the host's memory split evenly.
  std::uint64_t virtual_device_memory = 0;
  /// Device-memory mode (ftp-serve --device-memory; issue 17): each CPU
  /// virtual device holds a private copy of exactly the union of its weight
  /// shards over the gear table (engine::WeightStore::copy_to_device), made
  /// once at start and reserved on its budget, as a GPU would hold them;
  /// domains take views of those copies. The table's ranks are nested
  /// first (plan::nest_ranks) so that a device's TP-2t shard lies inside
  /// its TP-t shard. Off: every domain views the mapped file. Only with the
  /// cpu backend and the real engine, without members. A release-mode gear's
  /// devices free their copies when they leave it and are copied again when
  /// a shift reserves them (WeightResidency).
  bool device_memory = false;
  /// With an engine_factory: the devices its gears may name (the simulated
  /// engine's topology); empty: whatever the gear table names.
  std::optional<doc::Topology> topology;
  /// The control plane's time (request stamps, shift phases, observations;
  /// ARCHITECTURE.md rule 4); null: control::SystemClock.
  std::shared_ptr<const control::Clock> clock;
  /// Builds each domain's engine instead of the real one (engine::Executor
  /// over weights loaded once by the service): e.g. the simulated engine
  /// (ftp-serve --engine sim). Gets the gear's replica the domain runs and
  /// the domain's config. Set: the service loads no weights and creates no
  /// CPU virtual devices, and the model needs only hparams and tokenizer.
  std::function<std::unique_ptr<engine::Engine>(const doc::Replica&, const engine::DomainConfig&)> engine_factory;
  /// Told of every step of every domain (DomainRunner::StepObserver); null: none.
  DomainRunner::StepObserver step_observer;
  /// Members (issue 16, ftp-multi-node(7)): the leader's end of the member
  /// channel, or null (one process). Devices of members bind as "n1/vd0";
  /// a gear with any of them runs its domains across processes.
  std::shared_ptr<member::Leader> members;
  std::string machine_name = "n0";     ///< this process's name in device names
  comm::GlooOptions gloo;              ///< where this process's Gloo pairs bind, their timeout
  /// Extra checks of a reloaded gear table (e.g. the daemon's virtual
  /// devices); throws InputError. Null: none beyond the model's shapes.
  std::function<void(const doc::GearTable&)> reload_check;
};

class DomainRunner;

/// The daemon's core, a facade over ARCHITECTURE.md's parts: the device
/// pool (DevicePool), the domains (DomainSet), the router (Router), the
/// shifter (Shifter), the output processor and the telemetry (Telemetry).
/// It validates and admits requests, builds and warms domains over the
/// resident weights, and answers status. Thread-safe.
class Service {
 public:
  /// `model` must outlive the service.
  Service(const model::Model& model, ServiceConfig config);
  ~Service();

  /// Checks that the gear table fits (check_table_fits), copies the
  /// devices' weights in device-memory mode, then builds and starts the
  /// domains of the start gear.
  void start();
  /// The start-up check: every device holds what the table puts on it
  /// (plan::device_memory: its weight shards' union over the gears, one
  /// request of the full context at each gear's kv_cache_cap, activations);
  /// an InputError
  /// names the device, the bytes needed and the bytes free otherwise.
  void check_table_fits() const;
  /// Stops routing new requests (submit answers 503), lets every in-flight
  /// request finish, stops the domains. Requests still running after
  /// drain_timeout_ms end with an error event. Idempotent.
  void drain_and_stop();
  /// Started, not stopping, and at least one domain serving (a forced drain
  /// of the last one leaves the service alive but not ready).
  bool ready() const { return ready_.load() && serving_domains() > 0; }
  /// Domains serving whose engine has not failed.
  int serving_domains() const { return domains_.serving(); }
  /// The same, not counting the domains named in `ids`.
  int serving_domains_except(const std::vector<std::string>& ids) const { return domains_.serving(ids); }
  bool accepting() const noexcept { return accepting_.load(); }

  const model::Tokenizer& tokenizer() const noexcept { return *tok_; }
  const ServiceConfig& config() const noexcept { return cfg_; }
  int context_length() const noexcept;

  /// Tokenises, validates, admits and routes a request to one serving
  /// domain, where it stays until it finishes. Throws RequestError on bad
  /// input, Refused past the waiting queue's bounds (Admission), while
  /// draining or with no serving domain; each refusal is counted by reason.
  void submit(CompletionRequest request);
  /// Refuses, before any encoding, a prompt text of `bytes` bytes that must
  /// take more tokens than the prompt limit whatever its text
  /// (Tokenizer::max_token_bytes): a 12 MB prompt costs no tokenizer time.
  /// Throws RequestError (Refusal::context_exceeded, param "prompt").
  void check_prompt_bytes(std::size_t bytes) const;
  /// The longest prompt a request may have, in tokens (--max-prompt-tokens,
  /// at most the context - 1).
  int max_prompt_tokens() const noexcept;
  /// Cancels an accepted request whose client has gone: it finishes with
  /// reason "cancelled" at its domain's next step, and its KV pages return.
  /// An unknown or finished id is ignored.
  void cancel(const std::string& request_id);

  /// Progress of a shift, one event per phase step.
  using ShiftProgress = Shifter::Progress;
  using ShiftOptions = serve::ShiftOptions;
  /// Runs a whole shift on the calling thread (Shifter::shift).
  doc::ShiftEvent shift(const ShiftOptions& options, const ShiftProgress& progress);

  /// Drains one domain and retires it (Shifter::drain_domain).
  int drain_domain(const std::string& domain_id, bool force, int timeout_ms,
                   const std::function<void(const json::Json&)>& progress);
  /// Domain ids that hold any of the given devices.
  std::vector<std::string> domains_on_devices(const std::vector<std::string>& devices) const {
    return domains_.on_devices(devices);
  }

  /// Reloads the gear table; the current gear must still be in it, and its
  /// devices must bind in the device pool. In device-memory mode its ranks
  /// are nested and every device's shards must lie in the copy made at
  /// start (an InputError naming the device and what it lacks otherwise).
  void reload(doc::GearTable table);

  json::Json status() const;
  json::Json gears_json() const;
  /// This machine's devices measured (topology::probe_local: the service's
  /// virtual devices, or its GPUs with the cuda backend), its node named
  /// machine_name; with members, gathered with theirs and the measured link
  /// between machines (member::gather_topology). Takes seconds; not on an
  /// event loop. Throws Error naming a member that fails.
  doc::Topology gathered_topology(bool quick) const;
  /// The gear table in force (a copy: reload may replace it) and how many
  /// times it was replaced.
  doc::GearTable gear_table() const;
  std::uint64_t gear_table_generation() const noexcept { return table_generation_.load(); }
  json::Json records() const { return shifter_->records(); }
  /// The shifts the journal found open at start (a crash mid-shift), now
  /// recorded as interrupted.
  const std::vector<std::string>& interrupted_shifts() const noexcept { return interrupted_; }
  /// The observation of ARCHITECTURE.md from live data (Telemetry::observe).
  doc::Observation observe() const;
  /// Prometheus text exposition of the live numbers.
  std::string prometheus() const;

  std::string current_gear() const { return domains_.gear(); }
  /// What the start gear's warm-up ran (start()).
  const WarmUpFacts& start_warm_up() const noexcept { return start_warm_; }
  const DevicePool& device_pool() const noexcept { return *pool_; }

 private:
  /// The fields of generation (n, min_tokens, logprobs, stop_token_ids,
  /// penalties) against this model and config; RequestError naming the field.
  void check_generation_fields(const CompletionRequest& r) const;
  /// The gear table's model shapes against the loaded model; InputError.
  void check_model(const doc::GearTable& table) const;
  /// One CPU virtual device's part of a gear table: its name there, the
  /// shards its ranks serve over every gear.
  struct DeviceShards {
    std::string name;
    std::vector<engine::RankShard> shards;
  };
  /// Each of this process's CPU virtual devices that `table` uses (device-memory mode).
  std::map<hardware::VirtualDevice*, DeviceShards> device_shards(const doc::GearTable& table) const;
  /// Device-memory mode, at start: copies each device's shard union onto it.
  /// Every CUDA ordinal's shards over the resident gears of `table`.
  std::map<int, std::vector<engine::RankShard>> gpu_shards(const doc::GearTable& table) const;
  void copy_weights_to_devices();
  /// Every stage of `table` that runs in this process, as the specs of its
  /// ranks (devices and GPUs bound), for the communicator pool.
  std::vector<std::vector<engine::RankSpec>> stage_groups(const doc::GearTable& table) const;
  /// Makes the communicators of every stage of the table in force ahead
  /// (engine::Backend::prepare_communicators): at start and after a reload.
  void prepare_communicators();
  /// WeightResidency's ShardsOf: what device `b` holds once its released
  /// weights come back for a shift to `gear`.
  std::vector<engine::RankShard> shards_of(const DeviceBinding& b, const doc::Gear& gear) const;
  std::optional<doc::Gear> find_gear(const std::string& name) const;
  /// Builds and warms the domains of `gear` (the shifter's Build); what the
  /// warm-up ran goes to `warm`.
  DomainList build_domains(const doc::Gear& gear, bool slow_start, WarmUpFacts& warm);
  /// KV pages of a domain of `gear` on these stages (ServiceConfig::kv_blocks);
  /// `gpu_room` from gpu_kv_room, or empty: the CPU virtual devices count.
  int kv_blocks_for(const doc::Gear& gear, const doc::Replica& rep, const std::vector<engine::StageLayout>& stages,
                    const std::vector<std::uint64_t>& gpu_room) const;
  /// A device backend's KV room (engine::Backend::kv_room_bytes) for every
  /// rank of the gear's domains at once, so that replicas on one GPU share
  /// it evenly; per domain, per rank (stage by stage). Empty rows where the
  /// backend keeps no device memory (CPU) or --kv-blocks is given.
  std::vector<std::vector<std::uint64_t>> gpu_kv_room(const std::vector<engine::DomainConfig>& domains) const;
  /// The domain that takes a request: Router::pick over the domains that may.
  std::shared_ptr<DomainRunner> route(const CompletionRequest& r, int prompt_len);
  /// submit's work (submit counts what it throws).
  void admit_and_route(CompletionRequest& r);
  /// An admitted request across its runs (admit_and_route, rerun).
  struct Placed;
  /// The engine request of one run of `p`, for the domain `*where` names.
  engine::GenerationRequest engine_request(const std::shared_ptr<Placed>& p, const std::shared_ptr<DomainRunner*>& where);
  /// Takes over `p` after its run on `from` failed with `e` before it
  /// streamed anything: true (the error is not delivered) when `from`'s
  /// engine has failed and the service runs it again elsewhere (Reruns).
  bool rerun(const std::shared_ptr<Placed>& p, DomainRunner& from, const engine::GenerationEvent& e);
  /// Places `p`, given back unstarted by draining domain `from`, on a
  /// serving domain (through the reruns' queue, under the same wait).
  void place_withdrawn(const std::shared_ptr<Placed>& p, const std::string& from);
  /// Submits a run of `p` to a serving domain; false when none takes it.
  bool place_again(const std::shared_ptr<Placed>& p);
  /// Ends `p` with `error` on each of its choices (a rerun given up).
  void fail_placed(const std::shared_ptr<Placed>& p, const std::string& error);
  /// Retry-After of a refusal: the median E2E of the last 30 s, whole
  /// seconds, 1..60.
  int retry_after_s() const;
  std::vector<DomainSample> samples() const;
  std::int64_t now_us() const;  ///< the service's clock since it was made, us
  std::int64_t now_ms() const;

  const model::Model& model_;
  ServiceConfig cfg_;                                      // cfg_.gears under table_mu_
  std::shared_ptr<const model::Tokenizer> tok_;           // the model's (model::tokenizer_of)
  EndOfGeneration eog_;                                    // computed once: it scans the vocabulary
  // The pool before the store: the store's device copies go back to the
  // pool's virtual devices as it is destroyed.
  std::unique_ptr<DevicePool> pool_;
  /// NVML's GPU signals on a CUDA service (null on others).
  std::unique_ptr<hardware::nvml::GpuSignals> gpu_signals_;
  /// One NVML sample of the pool's GPUs into `gpus`, or why not into
  /// `why`; a GPU NVML says is lost or has ECC errors is marked lost.
  void sample_gpus(std::vector<doc::GpuLoad>& gpus, std::string& why) const;
  std::unique_ptr<engine::WeightStore> store_;            // null with an engine_factory
  std::unique_ptr<WeightResidency> weights_;              // release weight mode over store_; null without it
  engine::Backend* backend_ = nullptr;                    // the real engine's (cfg_.backend)
  std::int64_t t0_us_ = 0;                                 // cfg_.clock at construction
  DomainSet domains_;
  Telemetry telemetry_;
  Admission admission_;
  std::unique_ptr<OutputProcessor> output_;
  std::unique_ptr<Shifter> shifter_;
  std::unique_ptr<Journal> journal_;                      // null without state_dir
  std::vector<std::string> interrupted_;
  WarmUpFacts start_warm_;                                // set by start()
  mutable std::mutex route_mu_;                            // router_
  control::Router router_;
  mutable std::mutex table_mu_;                            // cfg_.gears
  /// Told of members' joins and losses while the service lives.
  struct MemberHook {
    std::mutex mu;
    Service* service = nullptr;
  };
  std::shared_ptr<MemberHook> member_hook_;
  void on_member(const member::MemberInfo& m);
  std::atomic<bool> ready_{false}, accepting_{false}, stopped_{false};
  std::atomic<std::uint64_t> table_generation_{0};
  /// Last: its thread calls into the service until it is gone.
  std::unique_ptr<Reruns> reruns_;
};

}  // namespace ftp::serve
