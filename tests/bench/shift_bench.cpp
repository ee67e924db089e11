// SPDX-License-Identifier: Apache-2.0
// shift-bench: live gear shifts on CPU virtual devices (stories260K).
// Prints, measured in one run: the time from a shift's acceptance to 100 %
// of traffic on the new domain minus the configured ramp waits (median over
// the shifts; goal <= 100 ms), and P99 TTFT while shifting against steady
// state (goal <= 1.1x): one closed-loop load runs throughout, steady windows
// alternate with shifts, and a request whose wait for its first token
// overlaps a shift counts as shifting. The JSON also splits the samples by
// the phase they were sent in (a ramp step's by the new or the old domain
// that served them) and by shift, with each set's share above the steady
// P99, and gives each gear's own ratio, to show where a tail comes from.
// --max-ttft-ratio makes it a gate.
//
// The gears of a table differ in speed (on the dev VM stories260K's TP 2
// answers in half the time of its TP 4 or its two stages), and the steady
// windows and the shifts spend different shares of their samples on each
// gear. So the headline ratio compares like with like: each shifting sample
// counts against the steady samples of the gear whose domain served it (the
// steady samples of each gear weighted by that gear's count of shifting
// samples). The ratio against all steady samples pooled is printed too.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "hardware/cpu/measure.hpp"
#include "cli/tool.hpp"
#include "doc/gear_table.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "serve/remote.hpp"
#include "serve/service.hpp"

using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

/// TTFT samples (ms) of one set, by the gear of the domain that served each.
using ByGear = std::map<std::string, std::vector<double>>;

std::vector<double> all_of(const ByGear& g) {
  std::vector<double> v;
  for (const auto& [gear, s] : g) v.insert(v.end(), s.begin(), s.end());
  return v;
}

/// Percentile p of the steady samples with each gear's samples weighted by
/// its share of the shifting samples: the steady state of the same mix of
/// gears. Gears that served no shifting sample weigh nothing; the share of
/// a gear without steady samples goes to all steady samples pooled.
double matched_pct(const ByGear& steady, const ByGear& shifting, double p) {
  std::vector<std::pair<double, double>> vw;  // value, weight
  double total = 0;
  const std::vector<double> pooled = all_of(steady);
  for (const auto& [gear, sv] : shifting) {
    auto it = steady.find(gear);
    const std::vector<double>& base = it == steady.end() || it->second.empty() ? pooled : it->second;
    const double w = static_cast<double>(sv.size()) / static_cast<double>(base.size());
    for (double x : base) vw.emplace_back(x, w);
    total += static_cast<double>(sv.size());
  }
  if (vw.empty()) return 0;
  std::sort(vw.begin(), vw.end());
  double cum = 0;
  for (const auto& [x, w] : vw)
    if ((cum += w) > p / 100.0 * total) return x;  // as pct: the first value past p %
  return vw.back().first;
}

/// The load: closed-loop clients (each sends its next request when the
/// last one ends) or open-loop Poisson arrivals at a fixed rate; runs until
/// stop and collects TTFT samples (ms).
struct Load {
  Load(serve::Service& s, std::vector<int> p) : svc(s), prompt(std::move(p)) {}
  serve::Service& svc;
  std::vector<int> prompt;  ///< every request's prompt, BOS first
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable idle;         ///< told when `outstanding` falls to 0
  int outstanding = 0;                  ///< requests sent and not finished
  std::vector<double> ttft;
  std::vector<Clock::time_point> sent;  ///< submit time of each ttft sample
  std::vector<std::string> domain;      ///< domain that served each ttft sample
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;

  /// Sends one request; `done` runs when it has finished.
  void send(const std::string& id, int max_tokens, std::function<void()> done) {
    const auto t0 = Clock::now();
    serve::CompletionRequest r;
    r.id = id;
    r.prompt_tokens = prompt;
    r.max_tokens = max_tokens;
    auto first = std::make_shared<std::atomic<bool>>(true);
    r.on_event = [this, t0, first, done = std::move(done)](const serve::CompletionEvent& e) {
      if (first->exchange(false)) {
        std::lock_guard lk(mu);
        ttft.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        sent.push_back(t0);
        domain.push_back(e.domain_id);
      }
      if (e.finished) {
        if (e.finish_reason == ftp::engine::FinishReason::error) ++failed;
        {
          std::lock_guard lk(mu);
          if (--outstanding == 0) idle.notify_all();
        }
        done();
      }
    };
    {
      std::lock_guard lk(mu);
      ++outstanding;
    }
    svc.submit(std::move(r));
  }

  void start_closed(int clients, int max_tokens) {
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([this, c, max_tokens] {
        for (int i = 0; !stop; ++i) {
          auto ended = std::make_shared<std::promise<void>>();
          send("b" + std::to_string(c) + "-" + std::to_string(i), max_tokens, [ended] { ended->set_value(); });
          ended->get_future().wait();
        }
      });
  }

  /// Arrivals at `rate` requests/s, exponential gaps (fixed seed).
  void start_open(double rate, int max_tokens) {
    threads.emplace_back([this, rate, max_tokens] {
      std::mt19937 rng(11);
      std::exponential_distribution<double> gap(rate);
      auto next = Clock::now();
      for (int i = 0; !stop; ++i) {
        next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
        std::this_thread::sleep_until(next);
        send("o" + std::to_string(i), max_tokens, [] {});
      }
    });
  }

  std::vector<double> finish() {
    stop = true;
    for (auto& t : threads) t.join();
    threads.clear();
    std::unique_lock lk(mu);
    idle.wait(lk, [this] { return outstanding == 0; });
    return ttft;
  }
};

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("shift-bench", "Shift latency and TTFT during shifts, on CPU virtual devices.");
  std::string model_path, gears_path;
  int shifts = 20, clients = 8, step_ms = 20, max_tokens = 32, prompt_tokens = 0;
  double steady_s = 3, max_ratio = 0, rate = 0, noise_s = 1;
  int trace_worst = 0;
  std::string ramp_list;
  auto& app = tool.app();
  app.add_option("--model", model_path, "Model (stories260K.gguf)")->required();
  app.add_option("--gears", gears_path, "Gear table (examples/gears/stories260K-cpu.json)")->required();
  app.add_option("--shifts", shifts, "Shifts to run (default 20)")->check(ftp::cli::positive());
  app.add_option("--clients", clients, "Concurrent closed-loop clients (default 8)")->check(ftp::cli::positive());
  app.add_option("--rate", rate, "Open-loop Poisson arrivals, requests/s, instead of the closed-loop clients")
      ->check(ftp::cli::positive());
  app.add_option("--prompt-tokens", prompt_tokens,
                 "Prompt length in tokens: a story's text, repeated and cut to length (default: \"Once upon a time\", "
                 "5 tokens with BOS)")
      ->check(ftp::cli::positive());
  app.add_option("--ramp", ramp_list, "The new domains' traffic shares, comma-separated (default 0.1,0.5,1.0)");
  app.add_option("--step-interval-ms", step_ms, "Ramp step wait (default 20)")->check(ftp::cli::non_negative());
  app.add_option("--steady-s", steady_s, "Seconds of steady state (default 3)")->check(ftp::cli::positive());
  app.add_option("--noise-s", noise_s,
                 "Seconds to measure the CPUs' scheduling noise before and after the load (default 1; 0: skip)")
      ->check(ftp::cli::non_negative());
  app.add_option("--trace-worst", trace_worst,
                 "Print the N slowest TTFT samples with every domain step that overlapped each (stderr)")
      ->check(ftp::cli::non_negative());
  app.add_option("--max-ttft-ratio", max_ratio, "Exit 6 when P99 TTFT shifting / steady of the same gears exceeds this")
      ->check(ftp::cli::non_negative());
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
    if (!ramp_list.empty()) cfg.ramp = serve::parse_ramp(ramp_list);
    // Every step of every domain, for --trace-worst.
    struct Step {
      std::string domain;
      Clock::time_point begin, end;
      int done;
    };
    std::mutex steps_mu;
    std::vector<Step> steps;
    if (trace_worst > 0)
      cfg.step_observer = [&](const std::string& d, Clock::time_point b, Clock::time_point e, int done) {
        std::lock_guard lk(steps_mu);
        steps.push_back({d, b, e, done});
      };
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
    // The gear of every domain that serves, for the gear-matched baseline.
    std::map<std::string, std::string> gear_of;
    auto note_domains = [&] {
      const json::Json st = svc.status();  // named: a range-for over a temporary's member would dangle
      for (const auto& d : st.at("domains")) gear_of[d.at("id").get<std::string>()] = d.at("gear").get<std::string>();
    };
    note_domains();
    // The prompt: BOS and "Once upon a time", or a story's text repeated
    // and cut to --prompt-tokens.
    const model::Tokenizer& tok = svc.tokenizer();
    std::vector<int> prompt = tok.encode("Once upon a time", true);
    if (prompt_tokens > 0) {
      const std::vector<int> story = tok.encode(
          " Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she "
          "saw a big red ball in the park. She ran to the ball and kicked it high into the sky.",
          false);
      prompt.resize(1);  // BOS
      while (static_cast<int>(prompt.size()) < prompt_tokens)
        prompt.push_back(story[(prompt.size() - 1) % story.size()]);
      prompt.resize(static_cast<std::size_t>(prompt_tokens));
      if (prompt_tokens + max_tokens > m.hparams.n_ctx_train)
        throw InputError("--prompt-tokens: " + std::to_string(prompt_tokens) + " + " + std::to_string(max_tokens) +
                         " new tokens exceed the model's context of " + std::to_string(m.hparams.n_ctx_train));
    }
    // The machine's own noise, with the domains idle: the tail of
    // sub-millisecond TTFTs sits on it.
    hardware::CpuStalls noise_before, noise_after;
    if (noise_s > 0) noise_before = hardware::measure_cpu_stalls(noise_s);
    Load during{svc, prompt};
    if (rate > 0)
      during.start_open(rate, max_tokens);
    else
      during.start_closed(clients, max_tokens);
    std::vector<double> overhead;
    int committed = 0;
    std::vector<std::pair<Clock::time_point, Clock::time_point>> shifting;  // [call, return) of each shift
    // Where each shift is, in real time: to attribute the TTFT samples.
    std::vector<std::pair<Clock::time_point, std::string>> phases;
    // The shift that built each domain, and the shift of each phase: a ramp
    // sample says whether the new or the old domain served it.
    std::map<std::string, int> built_by;
    std::vector<int> phase_shift;
    std::vector<std::string> shift_name;  // "from->to" of each shift
    // How long each phase of each shift took (the shift events' phase_ms), by phase.
    std::map<std::string, std::vector<double>> phase_ms;
    for (int s = 0; s < shifts; ++s) {
      std::this_thread::sleep_for(window);
      serve::Service::ShiftOptions o;
      o.to = cycle[static_cast<std::size_t>(s) % cycle.size()];
      if (o.to == svc.current_gear()) o.to = "economy";
      shift_name.push_back(svc.current_gear() + "->" + o.to);
      std::int64_t t_reserve = 0, t_full = 0;
      std::size_t ramp_step = 0;
      const auto t_call = Clock::now();
      auto add_phase = [&](Clock::time_point t, std::string name) {
        phases.emplace_back(t, std::move(name));
        phase_shift.push_back(s);
      };
      add_phase(t_call, "build");
      auto done = svc.shift(o, [&](const doc::ShiftEvent& e) {
        phase_ms[e.phase == ftp::doc::ShiftPhase::ramp ? "ramp-" + std::to_string(static_cast<int>(e.traffic_share * 100 + 0.5))
                                                   : std::string(doc::to_string(e.phase))]
            .push_back(e.phase_ms);
        if (e.phase == ftp::doc::ShiftPhase::reserve) t_reserve = e.t_ms;
        if (e.phase == ftp::doc::ShiftPhase::ramp && e.traffic_share >= 1.0) t_full = e.t_ms;
        // A request sent in a phase: "build" (shadow built and warmed),
        // "ramp" (both domains take traffic), "drain" (old domain
        // finishing), "retire" (old domain stopped and released, until
        // shift() returns).
        // A ramp step is named by the new domains' share while it lasts
        // ("ramp-10", "ramp-50"): the "ramp" event of a share ends its step.
        std::string name;
        if (e.phase == ftp::doc::ShiftPhase::warm || (e.phase == ftp::doc::ShiftPhase::ramp && e.traffic_share < 1.0)) {
          const std::size_t next = e.phase == ftp::doc::ShiftPhase::warm ? 0 : ++ramp_step;
          if (next < cfg.ramp.size() && cfg.ramp[next] < 1.0)
            name = "ramp-" + std::to_string(static_cast<int>(cfg.ramp[next] * 100 + 0.5));
        } else if (e.phase == ftp::doc::ShiftPhase::ramp) {
          name = "drain";
        } else if (e.phase == ftp::doc::ShiftPhase::drain) {
          name = "retire";
        }
        if (!name.empty() && name != phases.back().second) add_phase(Clock::now(), name);
        if (e.phase == ftp::doc::ShiftPhase::warm) {
          const auto before = gear_of;
          note_domains();
          for (const auto& [id, gear] : gear_of)
            if (!before.count(id)) built_by[id] = s;
        }
      });
      shifting.emplace_back(t_call, Clock::now());
      add_phase(shifting.back().second, "steady");
      committed += done.outcome == ftp::doc::ShiftOutcome::committed;
      std::size_t waits = cfg.ramp.size() - 1;
      overhead.push_back(static_cast<double>(t_full - t_reserve) - static_cast<double>(waits) * step_ms);
    }
    std::this_thread::sleep_for(window);
    auto ttft_all = during.finish();
    if (noise_s > 0) noise_after = hardware::measure_cpu_stalls(noise_s);
    ByGear steady_by_gear, shift_by_gear;
    std::map<std::string, std::vector<double>> by_phase, by_shift;
    double shifting_s = 0;
    for (const auto& [a, b] : shifting) shifting_s += std::chrono::duration<double>(b - a).count();
    for (std::size_t i = 0; i < ttft_all.size(); ++i) {
      const Clock::time_point sent = during.sent[i];
      const Clock::time_point first = sent + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double, std::milli>(ttft_all[i]));
      const bool overlaps = std::any_of(shifting.begin(), shifting.end(),
                                        [&](const auto& iv) { return sent < iv.second && first > iv.first; });
      (overlaps ? shift_by_gear : steady_by_gear)[gear_of[during.domain[i]]].push_back(ttft_all[i]);
      auto it = std::upper_bound(phases.begin(), phases.end(), sent,
                                 [](Clock::time_point t, const auto& p) { return t < p.first; });
      std::string phase = it == phases.begin() ? "steady" : std::prev(it)->second;
      if (phase.rfind("ramp", 0) == 0) {
        auto b = built_by.find(during.domain[i]);
        const bool is_new = b != built_by.end() && b->second == phase_shift[std::prev(it) - phases.begin()];
        phase += is_new ? "/new" : "/old";
      }
      by_phase[phase].push_back(ttft_all[i]);
      if (phase != "steady") by_shift[shift_name[static_cast<std::size_t>(phase_shift[std::prev(it) - phases.begin()])]].push_back(ttft_all[i]);
    }
    const std::vector<double> ttft_steady = all_of(steady_by_gear), ttft_shift = all_of(shift_by_gear);
    // Where the tail comes from: the share of each phase's samples above
    // the steady P99 (1 % in steady state by definition).
    const double p99_steady_all = pct(ttft_steady, 99);
    auto tails = [&](const std::map<std::string, std::vector<double>>& sets) {
      json::Json j = json::Json::object();
      for (const auto& [name, v] : sets) {
        const auto over = std::count_if(v.begin(), v.end(), [&](double x) { return x > p99_steady_all; });
        j[name] = {{"p50", pct(v, 50)},
                   {"p99", pct(v, 99)},
                   {"n", v.size()},
                   {"over_steady_p99", static_cast<double>(over) / static_cast<double>(v.size())}};
      }
      return j;
    };
    // Each gear's samples, steady and shifting, and the baselines.
    json::Json gear_json = json::Json::object();
    for (const auto& [gear, v] : steady_by_gear) gear_json[gear]["steady"] = {{"p50", pct(v, 50)}, {"p99", pct(v, 99)}, {"n", v.size()}};
    // Each gear's own ratio, and the worst of them: a gear whose steady
    // state has a heavy tail (a saturated TP 1 with long prompts) lifts the
    // mixed baseline of the headline ratio, so the per-gear ratios tell
    // where a shift costs.
    double worst_gear = 0;
    for (const auto& [gear, v] : shift_by_gear) {
      gear_json[gear]["shifting"] = {{"p50", pct(v, 50)}, {"p99", pct(v, 99)}, {"n", v.size()}};
      auto st = steady_by_gear.find(gear);
      if (st == steady_by_gear.end() || st->second.empty()) continue;
      const double r = pct(v, 99) / pct(st->second, 99);
      gear_json[gear]["p99_ratio"] = r;
      worst_gear = std::max(worst_gear, r);
    }
    const double p99_steady = pct(ttft_steady, 99), p99_shift = pct(ttft_shift, 99);
    const double p99_matched = matched_pct(steady_by_gear, shift_by_gear, 99);
    const double ratio_pooled = p99_steady > 0 ? p99_shift / p99_steady : 0;
    const double ratio = p99_matched > 0 ? p99_shift / p99_matched : 0;
    // How far sampling alone moves the ratios: a percentile bootstrap (every
    // gear's steady and shifting samples resampled with replacement, 1000
    // times, fixed seed).
    std::vector<double> boot, boot_pooled;
    if (!ttft_steady.empty() && !ttft_shift.empty()) {
      std::mt19937 rng(7);
      auto resample = [&](const ByGear& g) {
        ByGear r;
        for (const auto& [gear, v] : g) {
          std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
          auto& out = r[gear];
          out.resize(v.size());
          for (double& x : out) x = v[pick(rng)];
        }
        return r;
      };
      for (int i = 0; i < 1000; ++i) {
        const ByGear st = resample(steady_by_gear), sh = resample(shift_by_gear);
        const double shift_p99 = pct(all_of(sh), 99), matched = matched_pct(st, sh, 99), pooled = pct(all_of(st), 99);
        if (matched > 0) boot.push_back(shift_p99 / matched);
        if (pooled > 0) boot_pooled.push_back(shift_p99 / pooled);
      }
    }
    const double lo = pct(boot, 5), hi = pct(boot, 95);
    json::Json phase_json = json::Json::object();
    for (const auto& [name, v] : phase_ms) phase_json[name] = {{"p50", pct(v, 50)}, {"max", pct(v, 100)}};
    json::Json out{{"kind", "ftp.shift-bench/v1"},
                   {"shifts", shifts},
                   {"committed", committed},
                   {"clients", rate > 0 ? 0 : clients},
                   {"rate", rate},
                   {"step_interval_ms", step_ms},
                   {"prompt_tokens", prompt.size()},
                   {"max_tokens", max_tokens},
                   {"accept_to_full_minus_waits_ms", {{"median", pct(overhead, 50)}, {"max", pct(overhead, 100)}}},
                   {"ttft_ms_steady", {{"p50", pct(ttft_steady, 50)}, {"p99", p99_steady}, {"n", ttft_steady.size()}}},
                   {"ttft_ms_shifting", {{"p50", pct(ttft_shift, 50)}, {"p99", p99_shift}, {"n", ttft_shift.size()}}},
                   {"ttft_ms_steady_gear_matched", {{"p99", p99_matched}}},
                   {"p99_ttft_ratio", ratio_pooled},
                   {"p99_ttft_ratio_bootstrap_90", {pct(boot_pooled, 5), pct(boot_pooled, 95)}},
                   {"p99_ttft_ratio_gear_matched", ratio},
                   {"p99_ttft_ratio_gear_matched_bootstrap_90", {lo, hi}},
                   {"ttft_ms_by_gear", gear_json},
                   {"p99_ttft_ratio_worst_gear", worst_gear},
                   {"shifting_s", shifting_s},
                   {"phase_ms", phase_json},
                   {"ttft_ms_shifting_by_phase", tails(by_phase)},
                   {"ttft_ms_shifting_by_shift", tails(by_shift)},
                   {"cpu_noise", json::Json::array()},
                   {"failed_requests", during.failed.load()}};
    if (noise_s > 0)
      for (const auto* n : {&noise_before, &noise_after})
        out["cpu_noise"].push_back({{"seconds", n->seconds},
                                    {"cpus", n->cpus},
                                    {"stalls_over_1ms_per_s", n->stalls_per_s},
                                    {"lost_share", n->lost_share},
                                    {"max_ms", n->max_ms}});
    tool.emit(out);
    for (const auto& [gear, v] : shift_by_gear) {
      const auto& st = steady_by_gear[gear];
      std::fprintf(stderr, "shift-bench: %-12s P99 TTFT %.2f ms steady (n %zu), %.2f ms shifting (n %zu) = %.2fx\n",
                   gear.c_str(), pct(st, 99), st.size(), pct(v, 99), v.size(), st.empty() ? 0.0 : pct(v, 99) / pct(st, 99));
    }
    std::fprintf(stderr,
                 "shift-bench: accept->100%% minus waits: median %.1f ms (goal <= 100); P99 TTFT %.2f ms shifting (n %zu) "
                 "vs %.2f ms steady of the same gears (n %zu) = %.2fx, bootstrap 90 %% interval %.2f-%.2fx (goal <= 1.1); "
                 "vs %.2f ms all steady samples pooled = %.2fx; worst gear %.2fx\n",
                 pct(overhead, 50), p99_shift, ttft_shift.size(), p99_matched, ttft_steady.size(), ratio, lo, hi,
                 p99_steady, ratio_pooled, worst_gear);
    if (noise_s > 0)
      std::fprintf(stderr,
                   "shift-bench: CPU noise with the domains idle, before / after: %.1f / %.1f stalls of over 1 ms per "
                   "second per CPU, %.1f / %.1f %% of the time lost, longest %.1f / %.1f ms\n",
                   noise_before.stalls_per_s, noise_after.stalls_per_s, 100 * noise_before.lost_share,
                   100 * noise_after.lost_share, noise_before.max_ms, noise_after.max_ms);
    if (trace_worst > 0) {
      // The slowest samples, each with the steps of every domain that ran
      // between its submission and its first token (times in ms from the
      // first request).
      std::vector<std::size_t> order(ttft_all.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ttft_all[a] > ttft_all[b]; });
      const Clock::time_point origin = during.sent.empty() ? Clock::now() : during.sent.front();
      auto at = [&](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - origin).count(); };
      std::lock_guard lk(steps_mu);
      for (std::size_t k = 0; k < order.size() && k < static_cast<std::size_t>(trace_worst); ++k) {
        const std::size_t i = order[k];
        const Clock::time_point sent = during.sent[i];
        const Clock::time_point first = sent + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double, std::milli>(ttft_all[i]));
        auto it = std::upper_bound(phases.begin(), phases.end(), sent,
                                   [](Clock::time_point t, const auto& p) { return t < p.first; });
        std::fprintf(stderr, "shift-bench: slow sample: TTFT %.3f ms, domain %s (%s), sent at %.3f ms in phase %s\n",
                     ttft_all[i], during.domain[i].c_str(), gear_of[during.domain[i]].c_str(), at(sent),
                     it == phases.begin() ? "steady" : std::prev(it)->second.c_str());
        for (const Step& st : steps)
          if (st.end > sent && st.begin < first)
            std::fprintf(stderr, "shift-bench:   step of %s (%s) %.3f..%.3f ms: %.3f ms, %d token(s) computed\n",
                         st.domain.c_str(), gear_of[st.domain].c_str(), at(st.begin), at(st.end),
                         std::chrono::duration<double, std::milli>(st.end - st.begin).count(), st.done);
      }
    }
    if (during.failed > 0) return 1;
    return (max_ratio > 0 && ratio > max_ratio) ? 6 : 0;
  });
}
