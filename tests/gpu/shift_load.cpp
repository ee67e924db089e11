// SPDX-License-Identifier: Apache-2.0
// shift-load: the streaming load and the checks of a shift run against a
// live ftp-serve (tests/gpu/shift-under-load.sh), with no curl, jq or
// python on the machine: the lent GPU machine has none of them.
//
//   shift-load once   --url U --prompt P --max-tokens M
//       one greedy streamed completion; prints its text (exit 1 on failure).
//   shift-load run    --url U --clients N --prompt P --max-tokens M --stop-file F --out FILE [--max-seconds S]
//       N closed-loop clients, each streaming one greedy completion after
//       another until F exists (or S seconds pass); one JSON line a request
//       in FILE: client, sent_ms (wall clock, ms since the epoch), ok,
//       status, error, ttft_ms, e2e_ms, text.
//   shift-load report --samples FILE --shifts FILE --windows FILE --reference FILE [--reference FILE ...]
//                     --expect-shifts N --step-interval MS [--timings assert|info] [--outputs assert|info]
//                     [--release-expect copy|none [--release-why TEXT]] [--gears G0,G1,..]
//       prints one PASS / FAIL / INFO / N/A line per check and a summary
//       line; exits 6 when a check failed.
//
// --shifts is the ftp-shift --follow --json=short output of every shift
// (ftp.shift-event/v1, one a line); --windows has one line "START_MS END_MS"
// per shift, the wall-clock span of its ftp-shift call as the script saw it.
// A request whose wait for its first token (sent .. sent + TTFT) overlaps a
// window counts as "during shifts", every other as steady. With --gears
// G0,G1,..,GN (the gear before the first shift, then after each) the
// steady baseline is gear-matched, as shift-bench's headline ratio: each
// steady request counts for the gear in effect when it was sent, each
// shifting one half for its shift's old gear and half for its new one, and
// the steady requests of each gear weigh that gear's share of the
// shifting ones (the gears of a table differ in speed, and a plain pool
// would compare a different mix of them); the pooled ratio is printed too.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double wall_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Args {
  std::map<std::string, std::vector<std::string>> v;
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = v.find(k);
    return it == v.end() || it->second.empty() ? def : it->second.back();
  }
  std::vector<std::string> all(const std::string& k) const {
    auto it = v.find(k);
    return it == v.end() ? std::vector<std::string>{} : it->second;
  }
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "shift-load: error: %s (see the head of tests/gpu/shift_load.cpp)\n", why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv, int from) {
  Args a;
  for (int i = from; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) usage("expected --NAME VALUE, got '" + k + "'");
    a.v[k.substr(2)].push_back(argv[++i]);
  }
  return a;
}

int int_arg(const Args& a, const std::string& k, int def) {
  const std::string s = a.get(k);
  if (s.empty()) return def;
  try {
    return std::stoi(s);
  } catch (...) {
    usage("--" + k + ": expected an integer, got '" + s + "'");
  }
}

/// One streamed greedy completion.
struct Sample {
  int client = 0;
  double sent_ms = 0;  // wall clock, ms since the epoch
  bool ok = false;
  int status = 0;
  std::string error;
  double ttft_ms = -1, e2e_ms = 0;
  std::string text;
};

Sample complete(const std::string& base, const std::string& prompt, int max_tokens, int timeout_s) {
  Sample s;
  httplib::Client cli(base);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(timeout_s, 0);
  const std::string body =
      Json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true}}.dump();
  std::string buf, failure;
  bool done = false;
  const auto t0 = Clock::now();
  s.sent_ms = wall_ms();
  auto since = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    buf.append(data, n);
    std::size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const Json j = Json::parse(payload, nullptr, false);
      if (j.is_discarded()) {
        failure = "unparsable event: " + payload.substr(0, 80);
        continue;
      }
      if (j.contains("error")) {
        failure = j["error"].is_object() ? j["error"].value("message", std::string("error event")) : "error event";
        continue;
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const Json& c = j["choices"][0];
      if (!c.contains("text") || !c["text"].is_string()) continue;
      const std::string t = c["text"].get<std::string>();
      if (!t.empty() && s.ttft_ms < 0) s.ttft_ms = since();
      s.text += t;
    }
    return true;
  };
  auto res = cli.send(req);
  s.e2e_ms = since();
  if (!res) {
    s.error = "http: " + httplib::to_string(res.error());
    return s;
  }
  s.status = res->status;
  if (res->status != 200)
    s.error = "HTTP " + std::to_string(res->status) + ": " + buf.substr(0, 200);
  else if (!failure.empty())
    s.error = failure;
  else if (!done)
    s.error = "stream ended without [DONE]";
  else
    s.ok = true;
  if (s.ttft_ms < 0) s.ttft_ms = s.e2e_ms;
  return s;
}

int cmd_once(const Args& a) {
  const Sample s = complete(a.get("url"), a.get("prompt", "Zoo"), int_arg(a, "max-tokens", 57), int_arg(a, "timeout", 120));
  if (!s.ok) {
    std::fprintf(stderr, "shift-load once: %s\n", s.error.c_str());
    return 1;
  }
  std::fwrite(s.text.data(), 1, s.text.size(), stdout);
  return 0;
}

int cmd_run(const Args& a) {
  const std::string url = a.get("url"), prompt = a.get("prompt", "Zoo"), stop = a.get("stop-file"), out = a.get("out");
  if (url.empty() || stop.empty() || out.empty()) usage("run needs --url, --stop-file and --out");
  const int clients = int_arg(a, "clients", 16), max_tokens = int_arg(a, "max-tokens", 57);
  const int max_s = int_arg(a, "max-seconds", 600), timeout_s = int_arg(a, "timeout", 120);
  std::ofstream f(out);
  if (!f) usage("--out: cannot write " + out);
  std::mutex mu;
  const auto deadline = Clock::now() + std::chrono::seconds(max_s);
  std::vector<std::thread> th;
  for (int c = 0; c < clients; ++c)
    th.emplace_back([&, c] {
      while (!std::filesystem::exists(stop) && Clock::now() < deadline) {
        Sample s = complete(url, prompt, max_tokens, timeout_s);
        s.client = c;
        const Json j{{"client", s.client}, {"sent_ms", s.sent_ms}, {"ok", s.ok},       {"status", s.status},
                     {"error", s.error},   {"ttft_ms", s.ttft_ms}, {"e2e_ms", s.e2e_ms}, {"text", s.text}};
        {
          std::lock_guard lk(mu);
          f << j.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
          f.flush();
        }
        // No answer at all (the daemon gone): do not spin.
        if (s.status == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  for (auto& t : th) t.join();
  return 0;
}

std::vector<Json> read_lines(const std::string& path, bool required) {
  std::ifstream f(path);
  if (!f) {
    if (required) usage("cannot read " + path);
    return {};
  }
  std::vector<Json> out;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      std::fprintf(stderr, "shift-load: %s:%d: not JSON: %.80s\n", path.c_str(), n, line.c_str());
      j = Json{{"unparsable", line}};
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) usage("cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// numpy's default percentile (linear between closest ranks); 0 when empty.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double r = p / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(r);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (r - static_cast<double>(lo));
}

/// Percentile p of values with weights (the smallest value whose
/// cumulative weight reaches p % of the total); 0 when empty.
double weighted_percentile(std::vector<std::pair<double, double>> vw, double p) {
  double total = 0;
  for (const auto& [x, w] : vw) total += w;
  if (vw.empty() || total <= 0) return 0;
  std::sort(vw.begin(), vw.end());
  double cum = 0;
  for (const auto& [x, w] : vw) {
    cum += w;
    if (cum >= p / 100.0 * total - 1e-12) return x;
  }
  return vw.back().first;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

struct Tally {
  int pass = 0, fail = 0, info = 0, na = 0;
  void line(const char* verdict, const std::string& what) {
    std::printf("%s: %s\n", verdict, what.c_str());
    std::fflush(stdout);
    const std::string v = verdict;
    if (v == "PASS") ++pass;
    else if (v == "FAIL") ++fail;
    else if (v == "INFO") ++info;
    else ++na;
  }
  void check(bool ok, const std::string& what) { line(ok ? "PASS" : "FAIL", what); }
};

std::string num(double x, int prec = 1) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, x);
  return b;
}

int cmd_report(const Args& a) {
  const std::vector<Json> samples = read_lines(a.get("samples"), true);
  const std::vector<Json> events = read_lines(a.get("shifts"), true);
  const int expect_shifts = int_arg(a, "expect-shifts", 20);
  const double step_ms = int_arg(a, "step-interval", 100);
  const bool assert_timings = a.get("timings", "assert") == "assert";
  const bool assert_outputs = a.get("outputs", "assert") == "assert";
  const std::string release = a.get("release-expect", "none");
  Tally t;

  // Windows of the ftp-shift calls (wall clock, ms).
  std::vector<std::pair<double, double>> windows;
  {
    std::ifstream f(a.get("windows"));
    if (!f) usage("--windows: cannot read " + a.get("windows"));
    double s, e;
    while (f >> s >> e) windows.emplace_back(s, e);
  }

  // The static gears' greedy texts: every request must give one of them,
  // and they must agree with each other.
  std::vector<std::string> refs;
  for (const auto& r : a.all("reference")) refs.push_back(slurp(r));
  if (refs.empty()) usage("report needs --reference");

  // The gear in effect before the first window and after each; empty: no matching.
  const std::vector<std::string> gears = split_commas(a.get("gears"));
  if (!gears.empty() && gears.size() != windows.size() + 1)
    usage("--gears: expected " + std::to_string(windows.size() + 1) + " gears (one before the first shift, one after each), got " +
          std::to_string(gears.size()));
  std::map<std::string, std::vector<double>> steady_by_gear;
  std::map<std::string, double> shifting_by_gear;  // requests, half to each gear of their shift

  int n = 0, failed = 0, wrong = 0;
  std::string first_error, first_wrong;
  std::vector<double> ttft_steady, ttft_shift;
  for (const Json& s : samples) {
    ++n;
    if (!s.value("ok", false)) {
      ++failed;
      if (first_error.empty()) first_error = s.value("error", std::string("?"));
      continue;
    }
    const std::string text = s.value("text", std::string());
    if (std::find(refs.begin(), refs.end(), text) == refs.end()) {
      ++wrong;
      if (first_wrong.empty()) first_wrong = text.substr(0, 60);
    }
    const double sent = s.value("sent_ms", 0.0), ttft = s.value("ttft_ms", 0.0);
    int window = -1;  // the first shift this request's wait overlaps
    std::size_t before = 0;  // windows ended before it was sent
    for (std::size_t w = 0; w < windows.size(); ++w) {
      if (window < 0 && sent <= windows[w].second && sent + ttft >= windows[w].first) window = static_cast<int>(w);
      if (windows[w].second < sent) before = w + 1;
    }
    (window >= 0 ? ttft_shift : ttft_steady).push_back(ttft);
    if (!gears.empty()) {
      if (window >= 0) {
        shifting_by_gear[gears[static_cast<std::size_t>(window)]] += 0.5;
        shifting_by_gear[gears[static_cast<std::size_t>(window) + 1]] += 0.5;
      } else {
        steady_by_gear[gears[before]].push_back(ttft);
      }
    }
  }
  t.check(n > 0 && failed == 0, "requests: " + std::to_string(n) + " streamed, " + std::to_string(failed) + " failed" +
                                    (first_error.empty() ? "" : " (first: " + first_error + ")"));
  const bool refs_agree =
      !refs[0].empty() && std::all_of(refs.begin(), refs.end(), [&](const std::string& r) { return r == refs[0]; });
  // A model with random weights (gpu-bench's 8 B) has near-ties that a
  // gear's order of sums may break either way: --outputs info.
  auto outputs_line = [&](bool ok, const std::string& what) {
    if (assert_outputs)
      t.check(ok, what);
    else
      t.line("INFO", what + " [outputs: not asserted for this model]");
  };
  outputs_line(refs_agree, "static gears: " + std::to_string(refs.size()) + " greedy texts, " +
                          (refs_agree ? "all equal" : refs[0].empty() ? "empty" : "they differ"));
  outputs_line(n - failed > 0 && wrong == 0, "greedy outputs equal to the static gear's: " + std::to_string(n - failed - wrong) +
                                            " of " + std::to_string(n - failed) +
                                            (first_wrong.empty() ? "" : " (first other: \"" + first_wrong + "\")"));

  // The shift records, by shift id, in order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<Json>> by_id;
  int unparsable = 0;
  for (const Json& e : events) {
    if (e.contains("unparsable") || !e.contains("shift_id") || !e.contains("phase")) {
      ++unparsable;
      continue;
    }
    const std::string id = e["shift_id"].get<std::string>();
    if (!by_id.count(id)) order.push_back(id);
    by_id[id].push_back(e);
  }
  int committed = 0, well_formed = 0, comm_zero = 0, comm_present = 0;
  double comm_ms = 0;
  std::vector<double> accept_ms;
  std::vector<std::string> copies;  // "BYTES bytes in MS ms (GEAR)", one per reserve record that copied
  long long copied = 0;
  double copy_ms_max = 0;
  long long released = 0;
  int retires_releasing = 0;
  std::string bad;
  for (const auto& id : order) {
    const auto& ev = by_id[id];
    std::string phases;
    double t_accept = -1, t_full = -1;
    int waits = 0;
    bool ok_order = true;
    for (const Json& e : ev) {
      const std::string ph = e.value("phase", std::string());
      phases += (phases.empty() ? "" : " ") + ph;
      const bool has_kind_fields = e.contains("t_ms") && e.contains("from") && e.contains("to") && e.contains("phase_ms");
      if (!has_kind_fields) ok_order = false;
      if (ph == "reserve") {
        t_accept = e.value("t_ms", 0.0) - e.value("phase_ms", 0.0);
        if (e.contains("weights_copied_bytes")) {
          const long long b = e["weights_copied_bytes"].get<long long>();
          const double ms = e.value("weights_copy_ms", -1.0);
          copies.push_back(std::to_string(b) + " bytes in " + num(ms) + " ms (" + e.value("to", std::string()) + ")");
          copied += b;
          copy_ms_max = std::max(copy_ms_max, ms);
          if (b <= 0 || ms < 0) copies.back() += " [not > 0 bytes, >= 0 ms]";
        }
      }
      if (ph == "retire" && e.contains("weights_released_bytes")) {
        released += e["weights_released_bytes"].get<long long>();
        ++retires_releasing;
      }
      if (ph == "warm" && e.contains("communicators_created")) {
        ++comm_present;
        if (e["communicators_created"].get<long long>() == 0) ++comm_zero;
        comm_ms += e.value("communicator_ms", 0.0);
      }
      if (ph == "ramp") {
        if (e.value("traffic_share", 0.0) >= 1.0)
          t_full = e.value("t_ms", 0.0);
        else
          ++waits;
      }
    }
    const Json& last = ev.back();
    const bool done = last.value("phase", std::string()) == "done" && last.value("outcome", std::string()) == "committed";
    committed += done;
    const bool shape = ok_order && phases.rfind("reserve warm ramp", 0) == 0 && t_accept >= 0 && t_full >= 0 && done;
    well_formed += shape;
    if (!shape && bad.empty()) bad = id + ": " + phases + (done ? "" : " (not committed)");
    if (t_accept >= 0 && t_full >= 0) accept_ms.push_back(t_full - t_accept - waits * step_ms);
  }
  const int shifts = static_cast<int>(order.size());
  t.check(shifts == expect_shifts && committed == expect_shifts && well_formed == shifts && unparsable == 0,
          "shift records (ftp.shift-event/v1): " + std::to_string(shifts) + " shifts of " + std::to_string(expect_shifts) +
              ", " + std::to_string(committed) + " committed, " + std::to_string(well_formed) +
              " reserve/warm/ramp../done" + (unparsable ? ", " + std::to_string(unparsable) + " lines unreadable" : "") +
              (bad.empty() ? "" : " (first other: " + bad + ")"));
  t.check(comm_present == shifts && comm_zero == shifts && shifts > 0,
          "warm communicators_created 0: " + std::to_string(comm_zero) + " of " + std::to_string(shifts) + " shifts (" +
              std::to_string(comm_present) + " records carry it; communicator_ms total " + num(comm_ms) + ")");

  const double acc_med = percentile(accept_ms, 50), acc_max = percentile(accept_ms, 100);
  const std::string acc = "accept-to-100 % minus ramp waits: median " + num(acc_med) + " ms, max " + num(acc_max) +
                          " ms over " + std::to_string(accept_ms.size()) + " shifts (goal <= 1000 ms, stretch <= 100 ms: " +
                          (acc_max <= 100 ? "stretch met" : acc_max <= 1000 ? "goal met, stretch not" : "goal not met") + ")";
  const double p99_pooled = percentile(ttft_steady, 99), p99_shift = percentile(ttft_shift, 99);
  // The gear-matched steady P99 (see the head of the file); a gear that
  // served shifts but has no steady request weighs on the pool instead.
  double p99_steady = p99_pooled;
  std::string by_gear;
  if (!gears.empty()) {
    std::vector<std::pair<double, double>> vw;
    for (const auto& [g, share] : shifting_by_gear) {
      auto it = steady_by_gear.find(g);
      const std::vector<double>& base = it == steady_by_gear.end() || it->second.empty() ? ttft_steady : it->second;
      for (double x : base) vw.emplace_back(x, share / static_cast<double>(base.size()));
    }
    if (!vw.empty()) p99_steady = weighted_percentile(vw, 99);
    for (const auto& [g, v] : steady_by_gear)
      by_gear += (by_gear.empty() ? "" : ", ") + g + " " + num(percentile(v, 99)) + " ms (n " + std::to_string(v.size()) + ")";
  }
  const double ratio = p99_steady > 0 ? p99_shift / p99_steady : 0;
  const std::string ttft = "P99 TTFT during shifts / steady" + std::string(gears.empty() ? "" : " (gear-matched)") + ": " +
                           num(p99_shift) + " ms (n " + std::to_string(ttft_shift.size()) + ") / " + num(p99_steady) +
                           " ms (n " + std::to_string(ttft_steady.size()) + ") = " + num(ratio, 2) + " (goal <= 1.1; pooled steady " +
                           num(p99_pooled) + " ms: " + num(p99_pooled > 0 ? p99_shift / p99_pooled : 0, 2) + "; P50 " +
                           num(percentile(ttft_shift, 50)) + " / " + num(percentile(ttft_steady, 50)) + " ms)";
  if (assert_timings) {
    t.check(!accept_ms.empty() && acc_max <= 1000, acc);
    t.check(!ttft_shift.empty() && !ttft_steady.empty() && ratio <= 1.1, ttft);
  } else {
    t.line("INFO", acc + " [timing: not asserted here]");
    t.line("INFO", ttft + " [timing: not asserted here]");
  }
  if (!by_gear.empty()) t.line("INFO", "steady P99 TTFT by gear: " + by_gear);

  if (!copies.empty()) {
    std::string first, bad_copy;
    for (std::size_t i = 0; i < copies.size(); ++i) {
      if (i < 3) first += (first.empty() ? "" : "; ") + copies[i];
      if (copies[i].find("[not") != std::string::npos && bad_copy.empty()) bad_copy = copies[i];
    }
    // A device copies back at most what it had released.
    t.check(release == "copy" && bad_copy.empty() && copied <= released,
            "release-mode reserve weights_copied_bytes / weights_copy_ms: " + std::to_string(copies.size()) +
                " reserves copied " + std::to_string(copied) + " bytes, the longest in " + num(copy_ms_max) + " ms (" + first +
                (copies.size() > 3 ? "; ..." : "") + "); retire records: " + std::to_string(released) + " bytes released in " +
                std::to_string(retires_releasing) + (copied <= released ? "" : ", less than copied") +
                (bad_copy.empty() ? "" : "; bad: " + bad_copy));
  } else if (release == "copy") {
    t.line("FAIL", "release-mode reserve weights_copied_bytes / weights_copy_ms: no reserve record carries them (retire records: " +
                       std::to_string(released) + " bytes released in " + std::to_string(retires_releasing) + ")");
  } else {
    t.line("N/A", "release-mode reserve weights_copied_bytes: no reserve record carries them (retire records: " +
                      std::to_string(released) + " bytes released in " + std::to_string(retires_releasing) +
                      "), as expected here: " + a.get("release-why", "no device left the release-mode gear's devices"));
  }
  std::printf("shift-load report: %d passed, %d failed, %d info, %d n/a\n", t.pass, t.fail, t.info, t.na);
  return t.fail == 0 ? 0 : 6;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("expected once, run or report");
  const std::string cmd = argv[1];
  const Args a = parse(argc, argv, 2);
  if (cmd == "once") return cmd_once(a);
  if (cmd == "run") return cmd_run(a);
  if (cmd == "report") return cmd_report(a);
  usage("unknown command '" + cmd + "'");
}
