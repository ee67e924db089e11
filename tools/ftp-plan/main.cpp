// SPDX-License-Identifier: Apache-2.0
// ftp-plan: enumerate the gears of a model on a topology, estimate their
// capacity and print the chosen ftp.gear-table/v1.
#include <iostream>

#include "cli/tool.hpp"
#include "core/error.hpp"
#include "doc/topology.hpp"
#include "plan/planner.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-plan",
                      "Enumerate the gears (TP, PP, DP layouts) of a model on a topology: memory fit per device,\n"
                      "heads divisibility, TP inside an island, pipeline stages split by device speed, DP replicas;\n"
                      "estimate each gear's capacity with the cost model and print the chosen ftp.gear-table/v1\n"
                      "(economy < standard < performance, plus memory-guard). --model takes a model-shape JSON\n"
                      "(ftp.model-shape/v1); GGUF arrives with the model loader.");
  std::string topology_path, model_path;
  ftp::plan::PlanOptions opts;
  bool explain = false;
  auto& app = tool.app();
  app.add_option("--topology", topology_path, "Topology (ftp.topology/v1 from ftp-probe, '-' for stdin)")
      ->option_text("FILE")
      ->required();
  app.add_option("--model", model_path, "Model shape (ftp.model-shape/v1, '-' for stdin)")->option_text("FILE")->required();
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

  return tool.run(argc, argv, [&] {
    if (topology_path == "-" && model_path == "-")
      throw ftp::InputError("--topology and --model cannot both read stdin");
    ftp::doc::Topology topo =
        ftp::json::parse_file(topology_path, [](const ftp::json::Json& j) { return ftp::doc::topology_from_json(j); });
    ftp::plan::ModelShape model = ftp::plan::read_model_shape(model_path);
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
