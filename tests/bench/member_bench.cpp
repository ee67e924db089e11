// SPDX-License-Identifier: Apache-2.0
// member-bench: the distributed data plane (issue 16) against one process,
// measured in one run on this machine over loopback:
//   all-reduce (float32 sum, 2 ranks): Gloo over TCP (comm::GlooGroup) vs
//     the in-process communicator, time and bus bandwidth per size;
//   a member's join: spawn of `ftp-serve --join` (it loads the model) until
//     the leader lists it;
//   warm of a cross-process domain: build_spanning_engine + first step;
//   decode step at batch 1 of TP 2 with one rank here and one in the member
//     vs TP 2 in this process, on stories260K and (--synthetic-1b) a
//     synthetic TinyLlama-shaped ~1.1 B model in Q4_0 (tests/support);
//   the member's resident memory (VmRSS, RssFile, RssAnon of its process)
//     after it joins, after TP 2 steps (it holds rank 1 of every layer) and,
//     in a second member, after PP 2 steps (it holds the last half of the
//     layers and the head): a process maps the whole file and touches only
//     the layers and shards its devices serve;
//   with --head (--head-only: that and the all-reduce table alone), the
//     vocabulary-parallel head's collective at TP 2 and 4, 1 and 16 rows,
//     vocabularies of 32000 and 128256, in-process and over Gloo: the
//     all-reduce of zeroed full rows it used until issue 17 against the
//     gather into rank 0 (comm::Collective::gather_columns) that replaced
//     it, time on rank 0 (median) and the bytes each moves.
// Output: a table on stderr, one JSON document (ftp.member-bench/v1) on stdout.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/tool.hpp"
#include "comm/gloo.hpp"
#include "comm/inproc.hpp"
#include "engine/executor.hpp"
#include "member/leader.hpp"
#include "member/spanning.hpp"
#include "model/model.hpp"
#include "synthetic_gguf.hpp"
#include "test_data.hpp"

extern char** environ;
using namespace ftp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

pid_t spawn_member(const std::string& serve, const std::string& leader, const std::string& secret_file,
                   const std::string& model) {
  std::vector<std::string> args = {serve, "--join", leader, "--secret-file", secret_file, "--name", "n1",
                                   "--virtual-devices", "1", "-m", model, "--gloo-timeout-ms", "120000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) throw Error("cannot start " + serve);
  return pid;
}

/// Mean seconds of a decode step at batch 1 after a prompt of `prompt` tokens.
/// Resident memory of a process, bytes (/proc/PID/status).
struct Rss {
  double total = 0, file = 0, anon = 0;
};
Rss rss_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  Rss r;
  std::string key;
  double kb = 0;
  while (f >> key) {
    if (key == "VmRSS:" && f >> kb) r.total = kb * 1024;
    else if (key == "RssFile:" && f >> kb) r.file = kb * 1024;
    else if (key == "RssAnon:" && f >> kb) r.anon = kb * 1024;
  }
  return r;
}
json::Json to_json(const Rss& r) {
  return json::Json{{"rss_mb", r.total / 1e6}, {"rss_file_mb", r.file / 1e6}, {"rss_anon_mb", r.anon / 1e6}};
}

/// Bytes of the matrices and vectors of layers [first, first + n).
double layer_bytes(const model::Model& m, int first, int n) {
  double b = 0;
  for (int i = first; i < first + n; ++i)
    for (const auto* t : m.weights.layers.at(static_cast<std::size_t>(i)).tensors()) b += static_cast<double>(t->bytes);
  return b;
}

double decode_step_s(engine::Engine& e, int prompt, int steps) {
  std::vector<int> blocks;
  for (int i = 0; i < (prompt + steps) / 16 + 2; ++i) blocks.push_back(i);
  engine::SeqChunk c;
  c.blocks = &blocks;
  c.tokens.assign(static_cast<std::size_t>(prompt), 5);
  c.want_logits = true;
  std::vector<engine::TokenChoice> greedy(1);
  int tok = e.forward_choose({c}, 1, greedy)[0];
  c.start_pos = prompt;
  c.tokens = {tok};
  tok = e.forward_choose({c}, 1, greedy)[0];  // one untimed decode step
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    c.start_pos = prompt + 1 + s;
    c.tokens = {tok};
    tok = e.forward_choose({c}, 1, greedy)[0];
  }
  return seconds_since(t0) / steps;
}

/// The vocabulary-parallel head's collective over `tp` ranks (threads; Gloo:
/// one communicator per rank, as processes would hold): seconds per call,
/// median of `iters`, of the all-reduce the head used before (zeroed full
/// rows, rows x vocab floats summed on every rank) or of the gather into
/// rank 0's rows that replaced it.
double head_collective_s(bool gloo, int tp, std::size_t rows, std::size_t vocab, bool gather, int iters) {
  std::vector<std::shared_ptr<comm::Collective>> c(static_cast<std::size_t>(tp));
  comm::LocalStore store;
  static int next = 0;
  const std::string prefix = "head" + std::to_string(next++);
  if (!gloo) {
    auto one = std::make_shared<comm::InprocCommunicator>(tp);
    for (auto& x : c) x = one;
  } else {
    std::vector<std::thread> th;
    for (int r = 0; r < tp; ++r)
      th.emplace_back([&, r] {
        c[static_cast<std::size_t>(r)] = std::make_shared<comm::GlooCommunicator>(store, prefix, tp, std::vector<int>{r});
      });
    for (auto& t : th) t.join();
  }
  std::vector<std::size_t> widths;
  for (int r = 0; r < tp; ++r) widths.push_back(vocab / tp + (static_cast<std::size_t>(r) < vocab % tp ? 1 : 0));
  std::vector<double> times(static_cast<std::size_t>(iters));
  std::vector<std::thread> th;
  for (int r = 0; r < tp; ++r)
    th.emplace_back([&, r] {
      std::vector<float> full(rows * vocab, 0.0f), slice(rows * widths[static_cast<std::size_t>(r)], 1.0f);
      comm::Collective& me = *c[static_cast<std::size_t>(r)];
      for (int i = -2; i < iters; ++i) {
        float sync = 0;
        me.all_reduce_sum(r, &sync, 1);  // the ranks start together
        const auto t0 = Clock::now();
        if (gather) {
          me.gather_columns(r, slice.data(), rows, widths, r == 0 ? full.data() : nullptr);
        } else {
          std::fill(full.begin(), full.end(), 0.0f);
          me.all_reduce_sum(r, full.data(), full.size());
        }
        if (r == 0 && i >= 0) times[static_cast<std::size_t>(i)] = seconds_since(t0);
      }
    });
  for (auto& t : th) t.join();
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  cli::Tool tool("member-bench", "Cross-process data plane (Gloo, members) against one process");
  std::string serve = std::string(std::getenv("FTP_BUILD_ROOT") ? std::getenv("FTP_BUILD_ROOT") : "build") + "/tools/ftp-serve";
  std::string model_path = test::stories260k("stories260K.bin");
  bool big = false, head = false, head_only = false;
  int steps = 40, big_steps = 4;
  auto& app = tool.app();
  app.add_option("--serve", serve, "ftp-serve to start the member with")->capture_default_str();
  app.add_option("--model", model_path, "The small model")->capture_default_str();
  app.add_flag("--synthetic-1b", big, "Also the synthetic ~1.1 B model (Q4_0, written to a temp dir)");
  app.add_flag("--head", head, "Also the vocabulary-parallel head's collective: all-reduce of full rows vs gather into rank 0");
  app.add_flag("--head-only", head_only, "Only the all-reduce table and --head (implies --head)");
  app.add_option("--steps", steps, "Timed decode steps (small model)")->check(cli::positive())->capture_default_str();
  app.add_option("--big-steps", big_steps, "Timed decode steps (1 B)")->check(cli::positive())->capture_default_str();
  return tool.run(argc, argv, [&]() -> int {
    head = head || head_only;
    json::Json out{{"kind", "ftp.member-bench/v1"}};
    // All-reduce.
    json::Json ar = json::Json::array();
    std::fprintf(stderr, "%-10s %12s %12s %12s %12s %8s\n", "bytes", "inproc us", "gloo us", "inproc busbw", "gloo busbw",
                 "gloo/in");
    for (std::size_t bytes : {std::size_t{256}, std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20, std::size_t{16} << 20}) {
      const auto in = comm::measure_inproc_allreduce(2, bytes, true);
      const auto gl = comm::measure_gloo_allreduce(2, bytes, true);
      std::fprintf(stderr, "%-10zu %12.1f %12.1f %12.2f %12.2f %8.1f\n", bytes, in.time_us, gl.time_us, in.busbw_gb_s,
                   gl.busbw_gb_s, gl.time_us / in.time_us);
      ar.push_back(json::Json{{"bytes", bytes}, {"inproc_us", in.time_us}, {"gloo_us", gl.time_us},
                              {"inproc_busbw_gb_s", in.busbw_gb_s}, {"gloo_busbw_gb_s", gl.busbw_gb_s},
                              {"ratio", gl.time_us / in.time_us}});
    }
    out["allreduce"] = ar;
    if (head) {
      // The head's collective, before (all-reduce of zeroed full rows) and
      // after (gather into rank 0): time on rank 0 and the bytes each
      // moves per step (ring all-reduce: 2 (tp - 1)/tp of the rows into
      // every rank; Gloo's all-reduce, an all-gather: tp - 1 rows' worth
      // into every rank; the gather: (tp - 1)/tp into rank 0 only).
      json::Json hd = json::Json::array();
      std::fprintf(stderr, "\n%-6s %3s %5s %7s %14s %14s %8s %16s %16s\n", "comm", "tp", "rows", "vocab", "all-reduce us",
                   "gather us", "ar/ga", "ar bytes/rank", "gather bytes r0");
      for (bool gloo : {false, true})
        for (std::size_t vocab : {std::size_t{32000}, std::size_t{128256}})
          for (int tp : {2, 4})
            for (std::size_t rows : {std::size_t{1}, std::size_t{16}}) {
              const int iters = gloo ? 10 : 30;
              const double ar_s = head_collective_s(gloo, tp, rows, vocab, false, iters);
              const double ga_s = head_collective_s(gloo, tp, rows, vocab, true, iters);
              const double row_bytes = double(rows) * double(vocab) * 4;
              const double ar_bytes = gloo ? (tp - 1) * row_bytes : 2.0 * (tp - 1) / tp * row_bytes;
              const double ga_bytes = double(tp - 1) / tp * row_bytes;
              std::fprintf(stderr, "%-6s %3d %5zu %7zu %14.1f %14.1f %8.2f %16.0f %16.0f\n", gloo ? "gloo" : "inproc", tp,
                           rows, vocab, ar_s * 1e6, ga_s * 1e6, ar_s / ga_s, ar_bytes, ga_bytes);
              hd.push_back(json::Json{{"comm", gloo ? "gloo" : "inproc"}, {"tp", tp}, {"rows", rows}, {"vocab", vocab},
                                      {"allreduce_us", ar_s * 1e6}, {"gather_us", ga_s * 1e6},
                                      {"allreduce_bytes_per_rank", ar_bytes}, {"gather_bytes_rank0", ga_bytes}});
            }
      out["head"] = hd;
      if (head_only) {
        tool.emit(out);
        return 0;
      }
    }

    const std::string dir = std::filesystem::temp_directory_path() / ("member-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string secret_file = dir + "/secret";
    std::ofstream(secret_file) << "member-bench-secret-0123456789\n";
    ::chmod(secret_file.c_str(), 0600);
    std::vector<std::pair<std::string, std::string>> models = {{"stories260K", model_path}};
    if (big) {
      testing::SyntheticShape s;
      s.n_layer = 22, s.n_embd = 2048, s.n_ff = 5632, s.n_head = 32, s.n_head_kv = 4, s.n_vocab = 32000, s.n_ctx = 2048;
      s.dtype = model::DType::q4_0;
      s.seed = 42;
      testing::write_synthetic_gguf(dir + "/1b-q4_0.gguf", s);
      models.push_back({"synthetic-1.1b-q4_0", dir + "/1b-q4_0.gguf"});
    }
    json::Json runs = json::Json::array();
    for (const auto& [name, path] : models) {
      const model::Model m = model::load_model(path);
      const engine::WeightStore store(m);
      member::Leader leader("127.0.0.1:0", "member-bench-secret-0123456789");
      auto t0 = Clock::now();
      const pid_t pid = spawn_member(serve, leader.address(), secret_file, path);
      if (!leader.wait_for_members(1, 300000)) throw Error("the member did not join");
      const double join_s = seconds_since(t0);
      const Rss joined = rss_of(pid);
      const int n = m.hparams.n_layer;
      member::SpanningDomain d{"bench", {{0, n, {"vd0", "n1/vd0"}}}, 64, 16, 256};
      t0 = Clock::now();
      auto cross = member::build_spanning_engine(leader, "n0", store, d, [](const std::string&) { return nullptr; },
                                                 nullptr, comm::GlooOptions{"127.0.0.1", std::chrono::milliseconds(120000)});
      const int nsteps = name == "stories260K" ? steps : big_steps;
      std::vector<int> blocks = {0};
      engine::SeqChunk c;
      c.blocks = &blocks;
      c.tokens = {1};
      c.want_logits = true;
      cross->forward_choose({c}, 1, std::vector<engine::TokenChoice>(1));
      const double warm_s = seconds_since(t0);
      engine::Executor local(store, {{0, n, 2}}, 64, 16);
      const double in_s = decode_step_s(local, 16, nsteps);
      const double x_s = decode_step_s(*cross, 16, nsteps);
      const Rss tp2 = rss_of(pid);
      cross.reset();
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
      // PP 2 in a fresh member: it holds layers [n/2, n) and the head.
      member::Leader leader2("127.0.0.1:0", "member-bench-secret-0123456789");
      const pid_t pid2 = spawn_member(serve, leader2.address(), secret_file, path);
      if (!leader2.wait_for_members(1, 300000)) throw Error("the second member did not join");
      const Rss joined2 = rss_of(pid2);
      member::SpanningDomain d2{"bench-pp", {{0, n / 2, {"vd0"}}, {n / 2, n - n / 2, {"n1/vd0"}}}, 64, 16, 256};
      auto pp = member::build_spanning_engine(leader2, "n0", store, d2, [](const std::string&) { return nullptr; },
                                              nullptr, comm::GlooOptions{"127.0.0.1", std::chrono::milliseconds(120000)});
      decode_step_s(*pp, 16, std::min(nsteps, 3));
      const Rss pp2 = rss_of(pid2);
      pp.reset();
      ::kill(pid2, SIGTERM);
      ::waitpid(pid2, nullptr, 0);
      const double file_mb = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
      const double all_layers_mb = layer_bytes(m, 0, n) / 1e6, half_layers_mb = layer_bytes(m, n / 2, n - n / 2) / 1e6;
      std::fprintf(stderr,
                   "%s: member RSS (MB, file + anon): joined %.0f + %.0f; after TP 2 steps %.0f + %.0f; "
                   "PP 2 member joined %.0f + %.0f, after steps %.0f + %.0f; file %.0f, layers %.0f, "
                   "the PP member's layers %.0f\n",
                   name.c_str(), joined.file / 1e6, joined.anon / 1e6, tp2.file / 1e6, tp2.anon / 1e6, joined2.file / 1e6,
                   joined2.anon / 1e6, pp2.file / 1e6, pp2.anon / 1e6, file_mb, all_layers_mb, half_layers_mb);
      std::fprintf(stderr, "%s: join %.2f s, cross-process warm %.3f s, TP 2 decode step: in-process %.2f ms, "
                   "cross-process %.2f ms, ratio %.2f\n", name.c_str(), join_s, warm_s, in_s * 1e3, x_s * 1e3, x_s / in_s);
      runs.push_back(json::Json{{"model", name}, {"join_s", join_s}, {"warm_s", warm_s}, {"inproc_step_ms", in_s * 1e3},
                                {"cross_step_ms", x_s * 1e3}, {"ratio", x_s / in_s}, {"steps", nsteps},
                                {"file_mb", file_mb}, {"layers_mb", all_layers_mb}, {"pp_member_layers_mb", half_layers_mb},
                                {"member_joined", to_json(joined)}, {"member_after_tp2", to_json(tp2)},
                                {"pp_member_joined", to_json(joined2)}, {"pp_member_after_pp2", to_json(pp2)}});
    }
    std::filesystem::remove_all(dir);
    out["runs"] = runs;
    tool.emit(out);
    return 0;
  });
}
