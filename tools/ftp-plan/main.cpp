// SPDX-License-Identifier: Apache-2.0
// ftp-plan: enumerate the gears of a model on a topology, estimate their
// capacity and print the chosen ftp.gear-table/v1; `decide` turns
// observations into decisions.
#include <fstream>
#include <iostream>

#include "cli/tool.hpp"
#include "control/decide.hpp"
#include "control/trace.hpp"
#include "control/policy.hpp"
#include "core/error.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "plan/device_memory.hpp"
#include "plan/planner.hpp"
#include "sim/simulate.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-plan",
                      "Enumerate the gears (TP, PP, DP layouts) of a model on a topology: memory fit per device,\n"
                      "heads divisibility, TP inside an island, pipeline stages split by device speed, DP replicas;\n"
                      "estimate each gear's capacity with the cost model and print the chosen ftp.gear-table/v1\n"
                      "(economy < standard < performance, plus memory-guard). --model takes a model file (GGUF,\n"
                      "llama2.c) or a model-shape JSON (ftp.model-shape/v1) for models without weights at hand.\n"
                      "'ftp-plan decide' reads observations (JSON Lines) on stdin and writes decisions;\n"
                      "'ftp-plan simulate' replays a trace in virtual time through a control policy.");
  std::string topology_path, model_path;
  ftp::plan::PlanOptions opts;
  bool explain = false;
  auto& app = tool.app();
  app.add_option("--topology", topology_path, "Topology (ftp.topology/v1 from ftp-probe, '-' for stdin)")
      ->option_text("FILE");
  app.add_option("--model", model_path, "Model file (GGUF, llama2.c) or model shape (ftp.model-shape/v1, '-' for stdin)")->option_text("FILE");
  app.add_option("--concurrency", opts.workload.concurrency,
                 "Requests each gear must hold at once, at --context tokens each (default 8)")
      ->check(ftp::cli::positive());
  app.add_option("--context", opts.workload.context, "KV tokens per request (default: the model's context_length)")
      ->check(ftp::cli::positive());
  app.add_option("--prompt-tokens", opts.workload.prompt_tokens, "Reference request: prompt tokens (default 512; 4/5 of a shorter context)")
      ->check(ftp::cli::positive());
  app.add_option("--output-tokens", opts.workload.output_tokens, "Reference request: output tokens (default 128; 1/5 of a shorter context)")
      ->check(ftp::cli::positive());
  app.add_option("--max-batched-tokens", opts.workload.max_batched_tokens,
                 "Scheduler token budget per step (default 2048)")
      ->check(ftp::cli::positive());
  app.add_option("--max-gears", opts.max_gears, "Gears in the table at most (default 4)")->check(ftp::cli::positive());
  app.add_option("--max-pp", opts.max_pp, "Pipeline stages per replica at most (default 8)")->check(ftp::cli::positive());
  std::vector<std::string> layouts;
  app.add_option("--layout", layouts,
                 "A table of exactly these layouts instead of the chosen gears, as normal gears in the order given\n"
                 "(repeat it): NAME:tp=T[,pp=P][,dp=D], e.g. --layout tp4:tp=4 --layout tp8:tp=8")
      ->option_text("SPEC")
      ->allow_extra_args(false);
  app.add_flag("--explain", explain,
               "Print every candidate layout and why it was kept or rejected, then the chosen table's bytes per "
               "device (weights as the shard union over the gears, KV, activations), as "
               "JSON Lines on stderr");

  std::string gears_path, policy_path, policy_name = "gear-shifter";
  auto* decide = app.add_subcommand("decide", "Read observations (ftp.observation/v1, JSON Lines) on stdin, write one\n"
                                              "decision (ftp.decision/v1) per observation on stdout; time is their t_ms");
  decide->add_option("--gears", gears_path, "Gear table (ftp.gear-table/v1)")->option_text("FILE")->required();
  decide->add_option("--policy", policy_path, "Policy config (ftp.policy/v1; default: the built-in defaults)")
      ->option_text("FILE");
  decide->add_option("--policy-name", policy_name, "Policy: gear-shifter (default), tp-planner or naive")
      ->check(CLI::IsMember(ftp::control::policy_names()))
      ->option_text("NAME");

  ftp::sim::SimulateOptions so;
  std::string service = "engine", prompt_lengths = "512", output_lengths = "128";
  auto* sim = app.add_subcommand(
      "simulate",
      "Replay a trace in virtual time through a control policy and write one ftp.sim-interval/v1 per\n"
      "interval (JSON Lines), then the ftp.sim-summary/v1. By default SIMULATED engines serve it\n"
      "(\"service\": \"simulated-engine\"): the cost model's step times behind the real scheduler\n"
      "(continuous batching, chunked prefill, paged KV with preemption, micro-batches), one domain per\n"
      "replica, shifts with their phases; it needs --topology and --model. The queueing service is\n"
      "the fast first estimate: an M/M/c queue per gear at its max_rps, one service time per request");
  sim->add_option("--service", service, "engine (default: the simulated engine) or queueing (M/M/c estimate)")
      ->check(CLI::IsMember({"engine", "queueing"}))
      ->option_text("NAME");
  sim->add_option("--gears", so.gears_path, "Gear table (ftp.gear-table/v1); default: planned from --topology and --model")
      ->option_text("FILE");
  sim->add_option("--topology", topology_path, "Topology or cluster spec the gears run on (ftp.topology/v1, ftp.cluster/v1)")
      ->option_text("FILE");
  sim->add_option("--model", model_path, "The model the gears serve (file or ftp.model-shape/v1)")->option_text("FILE");
  sim->add_option("--trace", so.trace_path, "Trace: Azure LLM 2023 CSV or Mooncake JSONL (format from the first line)")
      ->option_text("FILE");
  sim->add_option("--rate-pattern", so.synth.pattern,
                  "Synthetic arrivals instead: const:R, steps:R1,R2,...@S or day:MIN,MAX@PERIOD_S (req/s, s)")
      ->option_text("SPEC");
  sim->add_option("--burstiness", so.synth.burstiness, "Synthetic: CV of the gaps, 1 = Poisson, else gamma (default 1)")
      ->check(ftp::cli::positive());
  sim->add_option("--seed", so.synth.seed, "Synthetic: RNG seed (default 1)");
  auto* o_pl = sim->add_option("--prompt-lengths", prompt_lengths,
                               "Synthetic: prompt tokens, N, uniform:MIN,MAX or lognormal:MEAN,CV (default 512)")
                   ->option_text("DIST");
  auto* o_ol = sim->add_option("--output-lengths", output_lengths, "Synthetic: output tokens, as --prompt-lengths (default 128)")
                   ->option_text("DIST");
  sim->add_option("--policy", so.policy,
                  "static:GEAR, dynamic-tp, gear-shifter (default) or naive, each optionally :CONFIG.json")
      ->option_text("SPEC");
  sim->add_option("--start-gear", so.start_gear, "Gear at t = 0 (default: the static gear, else the first)")->option_text("GEAR");
  auto& rc = so.replay;
  sim->add_option("--start", rc.start_s, "Replay the trace from this trace time, s (default 0)")->check(ftp::cli::non_negative());
  sim->add_option("--duration", rc.duration_s, "Trace time to replay (synthetic: to generate), s (default: all)")
      ->check(ftp::cli::non_negative());
  sim->add_option("--rate-scale", rc.rate_scale, "Compress the trace in time by this factor (default 1)")->check(ftp::cli::positive());
  sim->add_option("--interval", rc.interval_s, "Virtual seconds per interval record (default 10)")->check(ftp::cli::positive());
  sim->add_option("--observe-interval-s", rc.observation_period_s,
                  "Virtual seconds between the policy's observations (default 1, as the daemon's control loop)")
      ->check(ftp::cli::positive());
  sim->add_option("--slo-ttft-ms", rc.slo_ttft_ms, "SLO on time to first token, ms (default 2000)")->check(ftp::cli::positive());
  sim->add_option("--slo-tpot-ms", rc.slo_tpot_ms, "SLO on time per output token, ms (default 100)")->check(ftp::cli::positive());
  const std::vector<CLI::Option*> engine_only = {
      sim->add_option("--calibration", so.calibration_path, "Engine: cost-model constants (ftp.sim-calibration/v1)")
          ->option_text("FILE"),
      sim->add_option("--max-running", so.engine.max_running, "Engine: running batch of a domain at most (default 256)")
          ->check(ftp::cli::positive()),
      sim->add_option("--block-tokens", so.engine.block_tokens, "Engine: KV page size, tokens (default 16)")
          ->check(ftp::cli::in_range(1, 4096)),
      sim->add_option("--route-long-prompt-tokens", so.engine.long_prompt_tokens,
                      "Engine: prompts of at least this many tokens go to the largest-TP domain (default 0: off)")
          ->check(ftp::cli::non_negative()),
      sim->add_option("--tail-s", so.engine.tail_s, "Engine: serve in-flight requests this long after the slice, s (default 600)")
          ->check(ftp::cli::non_negative()),
      sim->add_option("--warm-s", so.engine.shift.warm_s, "Engine: a shift's warm-up besides its first request, s (default 2)")
          ->check(ftp::cli::non_negative()),
      sim->add_option("--weight-load-gb-s", so.engine.shift.weight_load_gb_s,
                      "Engine: release-mode weight reload bandwidth, GB/s (default 25)")
          ->check(ftp::cli::positive())};
  const std::vector<CLI::Option*> queueing_only = {
      sim->add_option("--service-time-s", rc.model.service_time_s, "Queueing: service time per request, s (default 1)")
          ->check(ftp::cli::positive()),
      sim->add_option("--prefill-share", rc.prefill_share, "Queueing: share of the service time before the first token (default 0.2)")
          ->check(ftp::cli::in_range(0.0, 0.99)),
      sim->add_option("--shift-duration-s", rc.model.shift_duration_s, "Queueing: duration of a shift, s (default 45)")
          ->check(ftp::cli::non_negative())};
  std::string summary_path;
  sim->add_option("--summary", summary_path, "Write the summary to FILE instead of the last stdout line")->option_text("FILE");
  app.require_subcommand(0, 1);

  return tool.run(argc, argv, [&] {
    for (const auto& l : layouts) opts.layouts.push_back(ftp::plan::parse_layout(l));
    if (decide->parsed()) {
      if (gears_path == "-" || policy_path == "-")
        throw ftp::InputError("decide reads observations on stdin; --gears and --policy take files");
      if (!topology_path.empty() || !model_path.empty())
        throw ftp::InputError("decide: --topology and --model plan a table; decide reads the one of --gears");
      auto table = ftp::json::parse_file(gears_path, [](const ftp::json::Json& j) { return ftp::doc::gear_table_from_json(j); });
      ftp::control::PolicyConfig config;
      if (!policy_path.empty())
        config = ftp::json::parse_file(policy_path, [](const ftp::json::Json& j) { return ftp::control::policy_config_from_json(j); });
      std::unique_ptr<ftp::control::Policy> policy;
      try {
        policy = ftp::control::make_policy(policy_name, table, config);
      } catch (const std::exception& e) {
        ftp::json::rethrow_with_source(gears_path, e);
      }
      auto st = ftp::control::decide(std::cin, "stdin", *policy, [&](const ftp::json::Json& d) { tool.emit_line(d); },
                                     [&](const std::string& w) { tool.warn(w); });
      tool.progress(std::to_string(st.decisions) + " decisions, " + std::to_string(st.shifts) + " shifts, " +
                    std::to_string(st.skipped) + " lines skipped");
      return st.skipped ? 2 : 0;  // the stream went on; the exit says some input was bad
    }
    if (sim->parsed()) {
      so.service = ftp::sim::service_from_name(service);
      const bool engine = so.service == ftp::sim::Service::engine;
      for (auto* opt : engine ? queueing_only : engine_only)
        if (opt->count())
          throw ftp::InputError(opt->get_name() + ": acts only with --service " + (engine ? "queueing" : "engine"));
      if (so.synth.pattern.empty() && (o_pl->count() || o_ol->count()))
        throw ftp::InputError("--prompt-lengths, --output-lengths: act only with --rate-pattern (a trace has its own)");
      so.synth.prompt = ftp::control::parse_length_dist(prompt_lengths, "--prompt-lengths");
      so.synth.output = ftp::control::parse_length_dist(output_lengths, "--output-lengths");
      so.topology_path = topology_path;
      so.model_path = model_path;
      so.plan = opts;
      auto summary = ftp::sim::simulate(so, [&](const ftp::json::Json& r) { tool.emit_line(r); });
      if (summary_path.empty()) tool.emit_line(summary);
      else if (std::ofstream f(summary_path); !(f << ftp::json::dump(summary, ftp::json::Style::pretty) << "\n"))
        throw ftp::Error(summary_path + ": cannot write the summary");
      return 0;
    }
    if (topology_path.empty()) throw ftp::InputError("--topology is required");
    if (model_path.empty()) throw ftp::InputError("--model is required");
    if (topology_path == "-" && model_path == "-")
      throw ftp::InputError("--topology and --model cannot both read stdin");
    ftp::doc::Topology topo =
        ftp::json::parse_file(topology_path, [](const ftp::json::Json& j) { return ftp::doc::topology_from_json(j); });
    ftp::plan::ModelShape model = ftp::plan::read_model_input(model_path);
    if (explain)
      opts.on_candidate = [](const ftp::plan::Candidate& c) {
        std::cerr << ftp::json::dump(to_json(c), ftp::json::Style::short_) << "\n" << std::flush;
      };
    ftp::plan::Plan plan = ftp::plan::plan(topo, model, opts);
    if (explain)
      for (const auto& d : ftp::plan::device_memory(model, plan.table, topo, ftp::plan::resolve(opts.workload, model)))
        std::cerr << ftp::json::dump(ftp::json::Json{{"device_memory", to_json(d)}}, ftp::json::Style::short_) << "\n";
    tool.emit(ftp::doc::to_json(plan.table));
    if (ftp::cli::is_tty(2)) std::cerr << ftp::plan::summary_table(plan.table) << std::flush;
    return 0;
  });
}
