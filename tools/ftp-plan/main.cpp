// SPDX-License-Identifier: Apache-2.0
// ftp-plan: enumerate the gears of a model on a topology, estimate their
// capacity and print the chosen ftp.gear-table/v1; `decide` turns
// observations into decisions.
#include <fstream>
#include <iostream>

#include "cli/tool.hpp"
#include "control/decide.hpp"
#include "control/replay.hpp"
#include "control/trace.hpp"
#include "control/policy.hpp"
#include "core/error.hpp"
#include "doc/gear_table.hpp"
#include "doc/topology.hpp"
#include "plan/planner.hpp"

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
  app.add_flag("--explain", explain, "Print every candidate layout and why it was kept or rejected, as JSON Lines on stderr");

  std::string gears_path, policy_path, policy_name = "gear-shifter";
  auto* decide = app.add_subcommand("decide", "Read observations (ftp.observation/v1, JSON Lines) on stdin, write one\n"
                                              "decision (ftp.decision/v1) per observation on stdout; time is their t_ms");
  decide->add_option("--gears", gears_path, "Gear table (ftp.gear-table/v1)")->option_text("FILE")->required();
  decide->add_option("--policy", policy_path, "Policy config (ftp.policy/v1; default: the built-in defaults)")
      ->option_text("FILE");
  decide->add_option("--policy-name", policy_name, "Policy: gear-shifter (default), tp-planner or naive")
      ->check(CLI::IsMember(ftp::control::policy_names()))
      ->option_text("NAME");

  std::string trace_path, sim_policy = "gear-shifter", start_gear, summary_path;
  ftp::control::SyntheticConfig synth;
  ftp::control::ReplayConfig rc;
  auto* sim = app.add_subcommand(
      "simulate",
      "Replay a trace in virtual time through a control policy and write one ftp.sim-interval/v1 per\n"
      "interval (JSON Lines), then the ftp.sim-summary/v1. The service is SIMULATED by the queueing\n"
      "model (QueueingModelSim, \"service\": \"queueing-model\"), not an engine: each gear's capacity\n"
      "is its measured, else estimated, max_rps of the gear table (given, or planned from topology\n"
      "and model)");
  sim->add_option("--gears", gears_path, "Gear table (ftp.gear-table/v1) with capacities")->option_text("FILE");
  sim->add_option("--topology", topology_path, "Without --gears: plan the table from this topology ...")->option_text("FILE");
  sim->add_option("--model", model_path, "... and this model (file or ftp.model-shape/v1)")->option_text("FILE");
  sim->add_option("--trace", trace_path, "Trace: Azure LLM 2023 CSV or Mooncake JSONL (format from the first line)")
      ->option_text("FILE");
  sim->add_option("--rate-pattern", synth.pattern,
                  "Synthetic arrivals instead: const:R, steps:R1,R2,...@S or day:MIN,MAX@PERIOD_S (req/s, s)")
      ->option_text("SPEC");
  sim->add_option("--burstiness", synth.burstiness, "Synthetic: CV of the gaps, 1 = Poisson, else gamma (default 1)")
      ->check(ftp::cli::positive());
  sim->add_option("--seed", synth.seed, "Synthetic: RNG seed (default 1)");
  sim->add_option("--policy", sim_policy,
                  "static:GEAR, dynamic-tp, gear-shifter (default) or naive, each optionally :CONFIG.json")
      ->option_text("SPEC");
  sim->add_option("--start-gear", start_gear, "Gear at t = 0 (default: the static gear, else the first)")->option_text("GEAR");
  sim->add_option("--start", rc.start_s, "Replay the trace from this trace time, s (default 0)")->check(ftp::cli::non_negative());
  sim->add_option("--duration", rc.duration_s, "Trace time to replay (synthetic: to generate), s (default: all)")
      ->check(ftp::cli::non_negative());
  sim->add_option("--rate-scale", rc.rate_scale, "Compress the trace in time by this factor (default 1)")->check(ftp::cli::positive());
  sim->add_option("--interval", rc.interval_s, "Virtual seconds per interval record (default 10)")->check(ftp::cli::positive());
  sim->add_option("--slo-ttft-ms", rc.slo_ttft_ms, "SLO on time to first token, ms (default 2000)")->check(ftp::cli::positive());
  sim->add_option("--slo-tpot-ms", rc.slo_tpot_ms, "SLO on time per output token, ms (default 100)")->check(ftp::cli::positive());
  sim->add_option("--service-time-s", rc.model.service_time_s, "Queueing model: service time per request, s (default 1)")
      ->check(ftp::cli::positive());
  sim->add_option("--prefill-share", rc.prefill_share, "Share of the service time before the first token (default 0.2)")
      ->check(ftp::cli::in_range(0.0, 0.99));
  sim->add_option("--shift-duration-s", rc.model.shift_duration_s, "Queueing model: duration of a shift, s (default 45)")
      ->check(ftp::cli::non_negative());
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
      if (trace_path.empty() == synth.pattern.empty()) throw ftp::InputError("simulate: give one of --trace and --rate-pattern");
      if (gears_path.empty() && (topology_path.empty() || model_path.empty()))
        throw ftp::InputError("simulate: give --gears, or --topology and --model");
      if (!gears_path.empty() && (!topology_path.empty() || !model_path.empty()))
        throw ftp::InputError("simulate: --gears is the table to replay; --topology and --model plan one instead, give either");
      auto table = !gears_path.empty()
          ? ftp::json::parse_file(gears_path, [](const ftp::json::Json& j) { return ftp::doc::gear_table_from_json(j); })
          : ftp::plan::plan(ftp::json::parse_file(topology_path, [](const ftp::json::Json& j) { return ftp::doc::topology_from_json(j); }),
                            ftp::plan::read_model_input(model_path), opts).table;
      auto spec = ftp::control::parse_policy_spec(sim_policy);
      ftp::control::PolicyConfig config;
      if (!spec.config_path.empty())
        config = ftp::json::parse_file(spec.config_path, [](const ftp::json::Json& j) { return ftp::control::policy_config_from_json(j); });
      std::unique_ptr<ftp::control::Policy> policy;
      try {
        policy = ftp::control::make_replay_policy(spec, table, config);
      } catch (const std::exception& e) {
        if (gears_path.empty()) throw;
        ftp::json::rethrow_with_source(gears_path, e);  // the table's errors name its file, as decide's do
      }
      if (start_gear.empty()) start_gear = spec.name == "static" ? spec.gear : table.gears.front().name;
      if (!table.find(start_gear)) throw ftp::InputError("--start-gear: gear \"" + start_gear + "\" is not in the gear table");
      ftp::control::Trace trace;
      if (!trace_path.empty()) {
        trace = ftp::control::read_trace(trace_path);
      } else {
        synth.duration_s = rc.duration_s;
        trace = ftp::control::synthesize(synth);
        rc.start_s = 0;
        // Replay the whole pattern, a quiet tail with no arrivals included.
        if (rc.duration_s <= 0) rc.duration_s = ftp::control::pattern_length_s(synth.pattern);
      }
      auto summary = ftp::control::replay(trace, *policy, sim_policy, table, start_gear, rc,
                                          [&](const ftp::json::Json& r) { tool.emit_line(r); });
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
    tool.emit(ftp::doc::to_json(plan.table));
    if (ftp::cli::is_tty(2)) std::cerr << ftp::plan::summary_table(plan.table) << std::flush;
    return 0;
  });
}
