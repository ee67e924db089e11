// SPDX-License-Identifier: Apache-2.0
// shift-bench: live gear shifts on CPU virtual devices (stories260K).
// Prints, measured in one run: the time from a shift's acceptance to 100 %
// of traffic on the new domain minus the configured ramp waits (median over
// the shifts; goal <= 100 ms), and P99 TTFT while shifting against steady
// state under the same load in the same gears, no shift running (goal <= 1.1x). --max-ttft-ratio makes it a gate.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cli/tool.hpp"
#include "doc/gear_table.hpp"
#include "model/model.hpp"
#include "serve/service.hpp"

using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

/// Runs `clients` closed-loop clients until stop; collects TTFT samples (ms).
struct Load {
  explicit Load(serve::Service& s) : svc(s) {}
  serve::Service& svc;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<double> ttft;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  void start(int clients, int max_tokens) {
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([this, c, max_tokens] {
        for (int i = 0; !stop; ++i) {
          std::mutex m;
          std::condition_variable cv;
          bool done = false, first = true;
          auto t0 = Clock::now();
          serve::CompletionRequest r;
          r.id = "b" + std::to_string(c) + "-" + std::to_string(i);
          r.prompt = "Once upon a time";
          r.max_tokens = max_tokens;
          r.on_event = [&](const serve::CompletionEvent& e) {
            std::lock_guard lk(m);
            if (first) {
              first = false;
              std::lock_guard l2(mu);
              ttft.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
            }
            if (e.finished) {
              if (e.finish_reason == "error") ++failed;
              done = true;
              cv.notify_all();
            }
          };
          svc.submit(std::move(r));
          std::unique_lock lk(m);
          cv.wait(lk, [&] { return done; });
        }
      });
  }
  std::vector<double> finish() {
    stop = true;
    for (auto& t : threads) t.join();
    threads.clear();
    std::lock_guard lk(mu);
    return ttft;
  }
};

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("shift-bench", "Shift latency and TTFT during shifts, on CPU virtual devices.");
  std::string model_path, gears_path;
  int shifts = 20, clients = 8, step_ms = 20, max_tokens = 32;
  double steady_s = 3, max_ratio = 0;
  auto& app = tool.app();
  app.add_option("--model", model_path, "Model (stories260K.gguf)")->required();
  app.add_option("--gears", gears_path, "Gear table (examples/gears/stories260K-cpu.json)")->required();
  app.add_option("--shifts", shifts, "Shifts to run (default 20)")->check(CLI::PositiveNumber);
  app.add_option("--clients", clients, "Concurrent closed-loop clients (default 8)")->check(CLI::PositiveNumber);
  app.add_option("--step-interval-ms", step_ms, "Ramp step wait (default 20)")->check(CLI::NonNegativeNumber);
  app.add_option("--steady-s", steady_s, "Seconds of steady state (default 3)")->check(CLI::PositiveNumber);
  app.add_option("--max-ttft-ratio", max_ratio, "Exit 6 when P99 TTFT shifting / steady exceeds this");
  return tool.run(argc, argv, [&]() -> int {
    if (!std::filesystem::exists(model_path)) {
      std::fprintf(stderr, "SKIP: %s not found (set FTP_TEST_DATA to ../shared/data)\n", model_path.c_str());
      return 77;
    }
    model::Model m = model::load_model(model_path);
    serve::ServiceConfig cfg;
    cfg.model_name = "bench";
    cfg.gears = json::parse_file(gears_path, [](const json::Json& j) { return doc::gear_table_from_json(j); });
    cfg.step_interval_ms = step_ms;
    serve::Service svc(m, cfg);
    svc.start();

    const std::vector<std::string> cycle = {"standard", "performance", "standard", "economy", "pipelined"};
    // Steady state: the same load in each gear of the cycle, no shift
    // running; the baseline pools their samples (the gears differ in speed).
    std::vector<double> ttft_steady;
    int steady_failed = 0;
    for (const std::string gear : {"economy", "standard", "performance", "pipelined"}) {
      if (svc.current_gear() != gear) {
        serve::Service::ShiftOptions o;
        o.to = gear;
        svc.shift(o, nullptr);
      }
      Load steady{svc};
      steady.start(clients, max_tokens);
      std::this_thread::sleep_for(std::chrono::duration<double>(steady_s / 4));
      auto v = steady.finish();
      steady_failed += steady.failed;
      ttft_steady.insert(ttft_steady.end(), v.begin(), v.end());
    }
    Load during{svc};
    during.start(clients, max_tokens);
    std::vector<double> overhead;
    int committed = 0;
    for (int s = 0; s < shifts; ++s) {
      serve::Service::ShiftOptions o;
      o.to = cycle[static_cast<std::size_t>(s) % cycle.size()];
      if (o.to == svc.current_gear()) o.to = "economy";
      std::int64_t t_reserve = 0, t_full = 0;
      auto done = svc.shift(o, [&](const doc::ShiftEvent& e) {
        if (e.phase == "reserve") t_reserve = e.t_ms;
        if (e.phase == "ramp" && e.traffic_share >= 1.0) t_full = e.t_ms;
      });
      committed += done.outcome == "committed";
      std::size_t waits = cfg.ramp.size() - 1;
      overhead.push_back(static_cast<double>(t_full - t_reserve) - static_cast<double>(waits) * step_ms);
    }
    auto ttft_shift = during.finish();
    double p99_steady = pct(ttft_steady, 99), p99_shift = pct(ttft_shift, 99);
    double ratio = p99_steady > 0 ? p99_shift / p99_steady : 0;
    json::Json out{{"kind", "ftp.shift-bench/v1"},
                   {"shifts", shifts},
                   {"committed", committed},
                   {"clients", clients},
                   {"step_interval_ms", step_ms},
                   {"accept_to_full_minus_waits_ms", {{"median", pct(overhead, 50)}, {"max", pct(overhead, 100)}}},
                   {"ttft_ms_steady", {{"p50", pct(ttft_steady, 50)}, {"p99", p99_steady}, {"n", ttft_steady.size()}}},
                   {"ttft_ms_shifting", {{"p50", pct(ttft_shift, 50)}, {"p99", p99_shift}, {"n", ttft_shift.size()}}},
                   {"p99_ttft_ratio", ratio},
                   {"failed_requests", steady_failed + during.failed}};
    tool.emit(out);
    std::fprintf(stderr, "shift-bench: accept->100%% minus waits: median %.1f ms (goal <= 100); P99 TTFT %.1f ms shifting vs %.1f ms steady = %.2fx (goal <= 1.1)\n",
                 pct(overhead, 50), p99_shift, p99_steady, ratio);
    if (steady_failed + during.failed > 0) return 1;
    return (max_ratio > 0 && ratio > max_ratio) ? 6 : 0;
  });
}
