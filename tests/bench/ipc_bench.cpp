// SPDX-License-Identifier: Apache-2.0
// ipc-bench: round-trip latency of the control socket. By default it starts an
// in-process server with an `echo` method on a temp socket and times N calls
// from a blocking client on the main thread (the server loop has its own).
// With --socket it times calls to a running daemon instead.
//
// Output: one JSON document on stdout (kind ftp.ipc-bench/v1) and a summary
// line on stderr. The goal is p99 <= 1 ms; --max-p99-us turns it into a gate
// (exit 6 when p99 is above it).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <optional>

#include "cli/tool.hpp"
#include "core/error.hpp"
#include "ipc/client.hpp"
#include "ipc/server.hpp"

using namespace ftp;

namespace {

constexpr double kGoalP99Us = 1000.0;

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  auto lo = static_cast<std::size_t>(rank);
  std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("ipc-bench", "Round-trip latency of the flextp control socket (p50/p99/mean)");
  int count = 20000;
  int warmup = 1000;
  std::size_t payload = 64;
  std::string socket;
  std::string method;
  double max_p99_us = 0;
  auto& app = tool.app();
  app.add_option("-n,--count", count, "Timed round trips")->check(ftp::cli::positive())->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed round trips first")->check(ftp::cli::non_negative())->capture_default_str();
  app.add_option("--payload", payload, "Bytes of the string echoed in each call")->capture_default_str();
  app.add_option("--socket", socket, "Time a running daemon at this socket instead of an in-process server");
  app.add_option("--method", method, "Method to call (default: echo in-process, introspect with --socket)");
  app.add_option("--max-p99-us", max_p99_us, "Exit 6 when p99 is above this many microseconds (0: no gate)");

  return tool.run(argc, argv, [&]() -> int {
    std::unique_ptr<ipc::Server> server;
    std::string dir;
    std::string path = socket;
    if (path.empty()) {
      char tmpl[] = "/tmp/ftp-ipc-bench-XXXXXX";
      if (!::mkdtemp(tmpl)) throw Error(std::string("mkdtemp: ") + std::strerror(errno));
      dir = tmpl;
      path = dir + "/control.sock";
      ipc::ServerOptions opt;
      opt.socket_path = path;
      server = std::make_unique<ipc::Server>(
          opt, std::vector<ipc::Method>{{"echo", "returns its params", {}, "the params", false,
                                         [](ipc::Call& c) { c.reply(c.params()); }}});
      server->start();
      if (method.empty()) method = "echo";
    } else if (method.empty()) {
      method = "introspect";
    }

    std::vector<double> us;
    {
      ipc::Client client(path);
      ipc::Json params = method == "echo" ? ipc::Json{{"value", std::string(payload, 'x')}} : ipc::Json::object();
      for (int i = 0; i < warmup; ++i) client.call(method, params);
      us.reserve(static_cast<std::size_t>(count));
      for (int i = 0; i < count; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        client.call(method, params);
        auto t1 = std::chrono::steady_clock::now();
        us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
    if (server) server->stop();
    if (!dir.empty()) std::filesystem::remove_all(dir);

    std::sort(us.begin(), us.end());
    double mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
    double p50 = percentile(us, 50), p99 = percentile(us, 99);
    json::Json doc = json::Json::object();
    doc["kind"] = "ftp.ipc-bench/v1";
    doc["socket"] = socket.empty() ? "in-process" : socket;
    doc["method"] = method;
    doc["count"] = count;
    doc["payload_bytes"] = method == "echo" ? payload : 0;
    doc["p50_us"] = p50;
    doc["p99_us"] = p99;
    doc["mean_us"] = mean;
    doc["min_us"] = us.front();
    doc["max_us"] = us.back();
    doc["goal_p99_us"] = kGoalP99Us;
    doc["p99_over_goal"] = p99 / kGoalP99Us;
    doc["meets_goal"] = p99 <= kGoalP99Us;
    tool.emit(doc);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "ipc-bench: %d round trips: p50 %.1f us, p99 %.1f us, mean %.1f us; p99/goal %.3f (goal p99 <= "
                  "1000 us: %s)\n",
                  count, p50, p99, mean, p99 / kGoalP99Us, p99 <= kGoalP99Us ? "met" : "missed");
    std::cerr << line;
    if (max_p99_us > 0 && p99 > max_p99_us) {
      std::cerr << "ipc-bench: error: p99 " << p99 << " us is above --max-p99-us " << max_p99_us << "\n";
      return static_cast<int>(Exit::check_failed);
    }
    return 0;
  });
}
