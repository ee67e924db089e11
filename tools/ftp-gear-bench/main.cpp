// SPDX-License-Identifier: Apache-2.0
// ftp-gear-bench: drive a running ftp-serve with open-loop load over HTTP and
// measure a gear: latency percentiles, throughput, goodput, capacity.
#include <chrono>
#include <fstream>

#include "bench/bench.hpp"
#include "cli/tool.hpp"
#include "core/error.hpp"
#include "ipc/client.hpp"
#include "serve/remote.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-gear-bench",
                      "Drive a running ftp-serve over its OpenAI-compatible HTTP API (streamed completions, so\n"
                      "TTFT and inter-token latency are timed per chunk) with open-loop synthetic arrivals at one\n"
                      "rate or a sweep of rates; report TTFT/TPOT/ITL/E2E percentiles, throughput and goodput\n"
                      "under SLOs, the maximum sustained throughput and safe = 0.8 x max, and optionally write\n"
                      "that capacity into a gear table; or replay a trace. A simulated domain is driven the same way:\n"
                      "point --url at an ftp-serve whose engine is the simulated one (see ftp-serve(1)).");
  ftp::bench::BenchSpec spec;
  std::string rate, sweep, duration, gears_path, samples_path;
  bool write = false, shift = false;
  double min_throughput = -1;
  auto& app = tool.app();
  app.add_option("--url", spec.target.url, "Base URL of the daemon (default http://127.0.0.1:8080)")->option_text("URL");
  app.add_option("--model", spec.target.model, "Model name sent with each request (default: none sent)")->option_text("NAME");
  app.add_option("--api-key", spec.target.api_key, "Bearer token for /v1 (default $FTP_API_KEY)")
      ->envname("FTP_API_KEY")
      ->option_text("KEY");
  app.add_option("--gear", spec.gear, "The gear this measures (named in the report and the capacity)")->option_text("NAME");
  app.add_flag("--shift", shift, "Shift the daemon to --gear over the control socket before the bench");
  tool.add_socket_option("With --shift: ");
  app.add_option("--gears", gears_path, "Gear table (ftp.gear-table/v1) for --write-capacity")->option_text("FILE");
  app.add_flag("--write-capacity", write, "Write the measured capacity into --gear of --gears (source \"bench\")");
  auto* o_rate = app.add_option("--rate", rate, "One offered rate, requests/s (default 1)")->option_text("R");
  auto* o_sweep = app.add_option("--sweep", sweep, "Increasing rates, stop after the first not sustained")->option_text("R1,R2,...");
  o_rate->excludes(o_sweep);
  auto* o_trace = app.add_option("--trace", spec.trace_path, "Replay a trace (Azure CSV, Mooncake JSONL) as one run")
                      ->option_text("FILE");
  o_trace->excludes(o_rate)->excludes(o_sweep);
  app.add_option("--arrivals", spec.arrivals.process, "Arrival process (default poisson)")
      ->check(CLI::IsMember({"poisson", "gamma", "constant"}));
  app.add_option("--burstiness", spec.arrivals.burstiness, "Gamma shape of --arrivals gamma (default 1)")
      ->check(ftp::cli::positive())
      ->option_text("K");
  auto* o_dur = app.add_option("--duration", duration, "Arrivals per run for this long: 30, 30s, 500ms, 2m (default 10s)")
                    ->option_text("TIME");
  auto* o_req = app.add_option("--requests", spec.requests, "Requests per run instead of --duration")
                    ->check(ftp::cli::positive())
                    ->option_text("N");
  o_dur->excludes(o_req);
  app.add_option("--prompt-tokens", spec.prompt_tokens, "About this many prompt tokens (default 64)")
      ->check(ftp::cli::positive())
      ->option_text("N");
  app.add_option("--output-tokens", spec.output_tokens, "max_tokens of each request (default 64)")
      ->check(ftp::cli::positive())
      ->option_text("N");
  app.add_option("--seed", spec.arrivals.seed, "Seed of the arrival RNG (default 0)");
  app.add_option("--slo-ttft-ms", spec.slo.ttft_ms, "Goodput bound on TTFT, ms (default none)")->check(ftp::cli::non_negative());
  app.add_option("--slo-tpot-ms", spec.slo.tpot_ms, "Goodput bound on TPOT, ms (default none)")->check(ftp::cli::non_negative());
  app.add_option("--slo-latency-ms", spec.slo.e2e_ms, "Goodput bound on E2E latency, ms (default none)")->check(ftp::cli::non_negative());
  app.add_option("--min-attainment", spec.sustain.min_attainment, "Sustained: this share meets the SLOs (default 0.9)")
      ->check(ftp::cli::in_range(0.0, 1.0));
  app.add_option("--min-keep-up", spec.sustain.min_keep_up, "Sustained: achieved/offered rate (default 0.9)")
      ->check(ftp::cli::in_range(0.0, 1.0));
  app.add_option("--timeout", spec.target.timeout_s, "Per-request timeout, s (default 300)")->check(ftp::cli::positive());
  app.add_option("--samples", samples_path, "Raw per-request samples as JSON Lines")->option_text("FILE");
  app.add_option("--min-throughput", min_throughput, "Exit 6 when the max sustained req/s is below X")
      ->option_text("X")
      ->check(ftp::cli::non_negative());

  return tool.run(argc, argv, [&]() -> int {
    spec.rates = ftp::bench::parse_rates(!sweep.empty() ? sweep : !rate.empty() ? rate : "1");
    if (!duration.empty()) spec.duration_s = ftp::bench::parse_duration_s(duration);
    if (!spec.trace_path.empty()) {
      if (duration.empty()) spec.duration_s = 1e18;  // the whole trace
      if (app.count("--prompt-tokens")) spec.max_prompt_tokens = spec.prompt_tokens;
      if (app.count("--output-tokens")) spec.max_output_tokens = spec.output_tokens;
    }
    if (spec.arrivals.process != "gamma" && app.count("--burstiness"))
      throw ftp::InputError("--burstiness needs --arrivals gamma");
    if (write && (gears_path.empty() || spec.gear.empty())) throw ftp::InputError("--write-capacity needs --gears FILE and --gear NAME");
    if (shift && spec.gear.empty()) throw ftp::InputError("--shift needs --gear NAME");
    if (!gears_path.empty() && !spec.gear.empty()) ftp::bench::check_gear(gears_path, spec.gear);
    std::ofstream samples;
    if (!samples_path.empty()) {
      samples.open(samples_path, std::ios::trunc);
      if (!samples) throw ftp::Error(samples_path + ": cannot open for writing");
    }
    if (shift) {
      ftp::ipc::Client client(tool.socket_path());
      ftp::serve::ShiftRequest req;
      req.to = spec.gear;
      req.trigger = "ftp-gear-bench";
      try {
        ftp::json::Json done = ftp::serve::remote_shift(client, req, [&](const ftp::json::Json& e) {
          tool.progress("shift: " + e.value("phase", "") + " " + e.value("message", ""));
        });
        if (ftp::serve::shift_exit_code(done) != 0) throw ftp::Error("shift to " + spec.gear + " did not commit");
      } catch (const ftp::Error& e) {
        // Already in that gear is what we wanted.
        if (std::string(e.what()).find("ftp.SameGear") == std::string::npos) throw;
      }
    }
    const auto t_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
    auto rep = ftp::bench::run_bench(spec, t_ms, [&](std::string_view m) { tool.progress(m); },
                                     [&](const ftp::bench::Sample& s) {
                                       if (samples) samples << ftp::bench::to_json(s).dump() << '\n';
                                     });
    samples.flush();
    if (!samples_path.empty() && !samples) throw ftp::Error(samples_path + ": write failed");
    tool.emit(ftp::bench::to_json(spec, rep));
    ftp::bench::check_report(rep);
    if (write) {
      ftp::bench::check_table_model(gears_path, rep.served_model);
      if (!rep.capacity) throw ftp::Error("no rate was sustained; " + gears_path + " left unchanged", ftp::Exit::check_failed);
      ftp::bench::write_capacity(gears_path, spec.gear, *rep.capacity);
      tool.progress("wrote the measured capacity of " + spec.gear + " into " + gears_path);
    }
    const double best = rep.capacity ? rep.capacity->max_rps : 0.0;
    if (min_throughput >= 0 && best < min_throughput) {
      tool.warn("max sustained throughput " + std::to_string(best) + " req/s is below --min-throughput " +
                std::to_string(min_throughput));
      return static_cast<int>(ftp::Exit::check_failed);
    }
    return 0;
  });
}
