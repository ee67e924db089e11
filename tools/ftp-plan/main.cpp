// SPDX-License-Identifier: Apache-2.0
// ftp-plan: enumerate the gears of a model on a topology, estimate their
// capacity and print the chosen ftp.gear-table/v1; `decide` turns
// observations into decisions.
#include <iostream>

#include "cli/tool.hpp"
#include "control/decide.hpp"
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
                      "'ftp-plan decide' reads observations (JSON Lines) on stdin and writes decisions.");
  std::string topology_path, model_path;
  ftp::plan::PlanOptions opts;
  bool explain = false;
  auto& app = tool.app();
  app.add_option("--topology", topology_path, "Topology (ftp.topology/v1 from ftp-probe, '-' for stdin)")
      ->option_text("FILE");
  app.add_option("--model", model_path, "Model file (GGUF, llama2.c) or model shape (ftp.model-shape/v1, '-' for stdin)")->option_text("FILE");
  app.add_option("--concurrency", opts.workload.concurrency,
                 "Requests each gear must hold at once, at --context tokens each (default 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--context", opts.workload.context, "KV tokens per request (default: the model's context_length)")
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt-tokens", opts.workload.prompt_tokens, "Reference request: prompt tokens (default 512; 4/5 of a shorter context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--output-tokens", opts.workload.output_tokens, "Reference request: output tokens (default 128; 1/5 of a shorter context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-batched-tokens", opts.workload.max_batched_tokens,
                 "Scheduler token budget per step (default 2048)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-gears", opts.max_gears, "Gears in the table at most (default 4)")->check(CLI::PositiveNumber);
  app.add_option("--max-pp", opts.max_pp, "Pipeline stages per replica at most (default 8)")->check(CLI::PositiveNumber);
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
  app.require_subcommand(0, 1);

  return tool.run(argc, argv, [&] {
    if (decide->parsed()) {
      if (gears_path == "-" || policy_path == "-")
        throw ftp::InputError("decide reads observations on stdin; --gears and --policy take files");
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
