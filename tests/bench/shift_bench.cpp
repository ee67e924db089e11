// SPDX-License-Identifier: Apache-2.0
// shift-bench: live gear shifts on CPU virtual devices (stories260K).
// Prints, measured in one run: the time from a shift's acceptance to 100 %
// of traffic on the new domain minus the configured ramp waits (median over
// the shifts; goal <= 100 ms), and P99 TTFT while shifting against steady
// state (goal <= 1.1x): one closed-loop load runs throughout, steady windows
// alternate with shifts, and a request whose wait for its first token
// overlaps a shift counts as shifting. The JSON also splits the samples by
// the phase they were sent in, with each phase's share above the steady
// P99, to show where a tail comes from. --max-ttft-ratio makes it a gate.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
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
  std::vector<Clock::time_point> sent;  ///< submit time of each ttft sample
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
              sent.push_back(t0);
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
    // One closed-loop load for the whole run; steady windows (no shift
    // running) alternate with shifts, so both see the same gears and the
    // same drift of a shared machine. A request whose wait for its first
    // token overlaps a shift -- from the call of shift() to its return, so
    // the old domains' retirement counts -- is a shifting sample, every
    // other one a steady sample.
    const auto window = std::chrono::duration<double>(steady_s / static_cast<double>(shifts + 1));
    Load during{svc};
    during.start(clients, max_tokens);
    std::vector<double> overhead;
    int committed = 0;
    std::vector<std::pair<Clock::time_point, Clock::time_point>> shifting;  // [call, return) of each shift
    // Where each shift is, in real time: to attribute the TTFT samples.
    std::vector<std::pair<Clock::time_point, std::string>> phases;
    for (int s = 0; s < shifts; ++s) {
      std::this_thread::sleep_for(window);
      serve::Service::ShiftOptions o;
      o.to = cycle[static_cast<std::size_t>(s) % cycle.size()];
      if (o.to == svc.current_gear()) o.to = "economy";
      std::int64_t t_reserve = 0, t_full = 0;
      const auto t_call = Clock::now();
      phases.emplace_back(t_call, "build");
      auto done = svc.shift(o, [&](const doc::ShiftEvent& e) {
        if (e.phase == "reserve") t_reserve = e.t_ms;
        if (e.phase == "ramp" && e.traffic_share >= 1.0) t_full = e.t_ms;
        // A request sent in a phase: "build" (shadow built and warmed),
        // "ramp" (both domains take traffic), "drain" (old domain
        // finishing), "retire" (old domain stopped and released, until
        // shift() returns).
        const std::string name = e.phase == "warm" || (e.phase == "ramp" && e.traffic_share < 1.0) ? "ramp"
                                 : e.phase == "ramp"                                                ? "drain"
                                 : e.phase == "drain"                                               ? "retire"
                                                                                                    : "";
        if (!name.empty() && name != phases.back().second) phases.emplace_back(Clock::now(), name);
      });
      shifting.emplace_back(t_call, Clock::now());
      phases.emplace_back(shifting.back().second, "steady");
      committed += done.outcome == "committed";
      std::size_t waits = cfg.ramp.size() - 1;
      overhead.push_back(static_cast<double>(t_full - t_reserve) - static_cast<double>(waits) * step_ms);
    }
    std::this_thread::sleep_for(window);
    auto ttft_all = during.finish();
    std::vector<double> ttft_steady, ttft_shift;
    std::map<std::string, std::vector<double>> by_phase;
    double shifting_s = 0;
    for (const auto& [a, b] : shifting) shifting_s += std::chrono::duration<double>(b - a).count();
    for (std::size_t i = 0; i < ttft_all.size(); ++i) {
      const Clock::time_point sent = during.sent[i];
      const Clock::time_point first = sent + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double, std::milli>(ttft_all[i]));
      const bool overlaps = std::any_of(shifting.begin(), shifting.end(),
                                        [&](const auto& iv) { return sent < iv.second && first > iv.first; });
      (overlaps ? ttft_shift : ttft_steady).push_back(ttft_all[i]);
      auto it = std::upper_bound(phases.begin(), phases.end(), sent,
                                 [](Clock::time_point t, const auto& p) { return t < p.first; });
      by_phase[it == phases.begin() ? "steady" : std::prev(it)->second].push_back(ttft_all[i]);
    }
    // Where the tail comes from: the share of each phase's samples above
    // the steady P99 (1 % in steady state by definition).
    const double p99_steady_all = pct(ttft_steady, 99);
    json::Json phase_json = json::Json::object();
    for (const auto& [name, v] : by_phase) {
      const auto over = std::count_if(v.begin(), v.end(), [&](double x) { return x > p99_steady_all; });
      phase_json[name] = {{"p50", pct(v, 50)},
                          {"p99", pct(v, 99)},
                          {"n", v.size()},
                          {"over_steady_p99", static_cast<double>(over) / static_cast<double>(v.size())}};
    }
    double p99_steady = pct(ttft_steady, 99), p99_shift = pct(ttft_shift, 99);
    double ratio = p99_steady > 0 ? p99_shift / p99_steady : 0;
    // How far sampling alone moves the ratio: a percentile bootstrap (both
    // sample sets resampled with replacement, 1000 times, fixed seed).
    std::vector<double> boot;
    if (!ttft_steady.empty() && !ttft_shift.empty()) {
      std::mt19937 rng(7);
      auto resample_p99 = [&](const std::vector<double>& v) {
        std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
        std::vector<double> r(v.size());
        for (double& x : r) x = v[pick(rng)];
        return pct(std::move(r), 99);
      };
      for (int i = 0; i < 1000; ++i) {
        const double st = resample_p99(ttft_steady);
        if (st > 0) boot.push_back(resample_p99(ttft_shift) / st);
      }
    }
    const double lo = pct(boot, 5), hi = pct(boot, 95);
    json::Json out{{"kind", "ftp.shift-bench/v1"},
                   {"shifts", shifts},
                   {"committed", committed},
                   {"clients", clients},
                   {"step_interval_ms", step_ms},
                   {"accept_to_full_minus_waits_ms", {{"median", pct(overhead, 50)}, {"max", pct(overhead, 100)}}},
                   {"ttft_ms_steady", {{"p50", pct(ttft_steady, 50)}, {"p99", p99_steady}, {"n", ttft_steady.size()}}},
                   {"ttft_ms_shifting", {{"p50", pct(ttft_shift, 50)}, {"p99", p99_shift}, {"n", ttft_shift.size()}}},
                   {"p99_ttft_ratio", ratio},
                   {"p99_ttft_ratio_bootstrap_90", {lo, hi}},
                   {"shifting_s", shifting_s},
                   {"ttft_ms_shifting_by_phase", phase_json},
                   {"failed_requests", during.failed.load()}};
    tool.emit(out);
    std::fprintf(stderr,
                 "shift-bench: accept->100%% minus waits: median %.1f ms (goal <= 100); P99 TTFT %.2f ms shifting (n %zu) "
                 "vs %.2f ms steady (n %zu) = %.2fx, bootstrap 90 %% interval %.2f-%.2fx (goal <= 1.1)\n",
                 pct(overhead, 50), p99_shift, ttft_shift.size(), p99_steady, ttft_steady.size(), ratio, lo, hi);
    if (during.failed > 0) return 1;
    return (max_ratio > 0 && ratio > max_ratio) ? 6 : 0;
  });
}
