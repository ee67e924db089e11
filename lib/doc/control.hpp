// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "doc/states.hpp"

namespace ftp::doc {

/// P50 and P99 of one latency, milliseconds.
struct Percentiles {
  double p50 = 0;
  double p99 = 0;
};

/// A domain as an observation sees it.
struct DomainView {
  std::string id;
  std::string gear;
  DomainState state = DomainState::warming;
  std::vector<std::string> devices;
  double traffic_share = 0;           ///< router weight, 0..1
  int running = 0;                    ///< requests in the running batch
  int waiting = 0;                    ///< requests queued
};

/// Utilisation of one device over the last interval.
struct DeviceLoad {
  std::string id;
  double utilization = 0;             ///< 0..1, share of time busy with our work
};

/// One GPU as NVML sees it at an observation (the whole GPU, every
/// process on it): what the contention index and lost-device handling
/// read on a CUDA service.
struct GpuLoad {
  std::string id;                     ///< the device pool's id ("gpu0"); "nvml<N>" for a GPU the pool does not use
  std::string uuid;                   ///< "GPU-..."
  double utilization = 0;             ///< 0..1, share of the last sample period a kernel ran (any process)
  double memory_utilization = 0;      ///< 0..1, share of it the memory was read or written
  std::uint64_t memory_total = 0;     ///< bytes
  std::uint64_t memory_used = 0;      ///< bytes, by every process and the driver
  std::uint64_t other_memory = 0;     ///< bytes held by other processes' compute contexts
  double other_compute = 0;           ///< 0..1, SM share of other processes since the last sample
  int other_processes = 0;            ///< other processes with a compute context on it
  std::uint64_t ecc_uncorrected = 0;  ///< volatile uncorrected ECC errors (since the driver loaded)
  bool available = true;              ///< false: lost or ECC errors; the service marks it lost
  std::string unavailable_because;    ///< why not available ("GPU is lost", "3 uncorrected ECC errors")
};

/// A device the service has lost (a member gone, a GPU taken away).
struct LostDevice {
  std::string id;                     ///< "n2/vd0"
  std::string why;                    ///< "member n2 lost (...)"
};

/// ftp.observation/v1: one timestamped sample of the running system.
struct Observation {
  std::int64_t t_ms = 0;              ///< clock time (wall or virtual), ms
  std::string gear;                   ///< current gear
  bool shifting = false;              ///< a shift is in progress
  double queue_depth = 0;             ///< requests waiting now
  double queue_depth_mean = 0;        ///< sliding mean over the observer window (30 s)
  double est_queue_time_ms = 0;       ///< mean service time x queue length, ms
  double request_rate = 0;            ///< arrivals, requests/s
  /// Load in tokens, next to request_rate: prompt tokens of the arrivals
  /// (the prefill asked for), tokens/s; 0 where not measured.
  double prompt_token_rate = 0;
  /// Tokens generated (decode served), tokens/s; 0 where not measured.
  double decode_token_rate = 0;
  /// Prompt tokens of the requests waiting (the queue's token backlog); 0 where not measured.
  double queued_prompt_tokens = 0;
  double predicted_rate = 0;          ///< predictor's forecast, requests/s
  double mean_prompt_tokens = 0;
  double mean_output_tokens = 0;
  double bubble_ratio = 0;            ///< pipeline stage time spread vs slowest stage, 0..1
  double contention_index = 0;        ///< share of device time taken by others, 0..1
  double kv_watermark = 0;            ///< KV pool blocks in use / cap, 0..1
  Percentiles ttft_ms, tpot_ms, e2e_ms;
  std::vector<DeviceLoad> devices;
  std::vector<DomainView> domains;
  /// The GPUs' own signals from NVML (a CUDA service); in JSON when not
  /// empty.
  std::vector<GpuLoad> gpus;
  /// Why `gpus` is empty where one could expect it ("no GPU in the device
  /// pool (backend cpu)", "NVML: dlopen libnvml.so.1: ..."); in JSON when
  /// not empty.
  std::string gpu_signals_unavailable;
  /// Devices lost now: a policy shifts to no gear that uses one (in JSON
  /// only when there is one).
  std::vector<LostDevice> lost_devices;
};

/// One signal a policy weighed in a decision.
struct Signal {
  std::string name;                   ///< "forecast_load", "queue_time", "kv_watermark", ...
  double value = 0;
  double threshold = 0;
  bool agrees = false;                ///< whether it votes for the decision's action
};

/// ftp.decision/v1: what the controller wants.
struct Decision {
  std::int64_t t_ms = 0;
  std::string action = "hold";        ///< "hold" | "shift"
  std::string from;                   ///< current gear
  std::string to;                     ///< target gear; empty for hold
  std::string policy;                 ///< "gear-shifter", "tp-planner", ...
  std::string reason;                 ///< for people: why
  std::vector<Signal> signals;
  std::int64_t not_before_ms = 0;     ///< staggered start; 0 for now
  /// The shift's ramp (new domains' traffic shares, increasing, ending at
  /// 1) and its wait per step, ms, where the policy asks for its own (the
  /// gear shifter's urgent path); empty and < 0: the executor's.
  std::vector<double> ramp;
  std::int64_t ramp_step_ms = -1;
};

/// ftp.shift-event/v1: one step of a shift as it happens (phase records) or
/// the closing record (phase "done", with an outcome).
struct ShiftEvent {
  std::string shift_id;
  std::int64_t t_ms = 0;
  ShiftPhase phase = ShiftPhase::reserve;
  std::string from, to;
  std::string trigger;                ///< "manual", "policy:gear-shifter", ...
  double traffic_share = 0;           ///< share on the new domain after this step, 0..1
  double phase_ms = 0;                ///< time this phase took, ms
  std::optional<ShiftOutcome> outcome;  ///< only with phase done
  std::string message;
  std::optional<Percentiles> before;  ///< P50/P99 E2E before the shift
  std::optional<Percentiles> after;   ///< and after it
  /// reserve: the weights copied (CPU device-memory mode) or uploaded (GPU)
  /// back onto the target's devices that release weight mode had freed,
  /// bytes, and the wall time of that copy, ms (it runs beside the
  /// reservation; the phase waits for it). Absent where nothing was freed.
  std::optional<std::uint64_t> weights_copied_bytes;
  std::optional<double> weights_copy_ms;
  /// retire: the weights freed on devices that left a release-mode gear, bytes.
  std::optional<std::uint64_t> weights_released_bytes;
  /// warm: communicators the new domains had to create (0 when the pool
  /// made them ahead) and the time spent creating them, ms.
  std::optional<std::uint64_t> communicators_created;
  std::optional<double> communicator_ms;
  /// warm: the decode batch sizes (rows) the new domains' warm-up ran with
  /// dummy requests, ascending; the CUDA graphs captured meanwhile (0 on
  /// CPU); the warm-up's wall time, ms.
  std::optional<std::vector<int>> warm_batch_sizes;
  std::optional<std::uint64_t> graphs_captured;
  std::optional<double> warmup_ms;
};

json::Json to_json(const Observation& o);
Observation observation_from_json(const json::Json& j);

json::Json to_json(const Decision& d);
Decision decision_from_json(const json::Json& j);

json::Json to_json(const ShiftEvent& e);
ShiftEvent shift_event_from_json(const json::Json& j);

}  // namespace ftp::doc
