// SPDX-License-Identifier: Apache-2.0
// ftp-serve: the daemon (OpenAI-compatible HTTP, control socket, live gear
// shifts), or with --prompt one completion and exit.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <set>
#include <string>

#include "cli/tool.hpp"
#include "core/error.hpp"
#include "core/json.hpp"
#include "doc/gear_table.hpp"
#include "engine/kv_cache.hpp"
#include "hub/fetch.hpp"
#include "member/channel.hpp"
#include "member/worker.hpp"
#include "model/model.hpp"
#include "api/openai/server.hpp"
#include "serve/daemon.hpp"
#include "serve/generate.hpp"
#include "serve/remote.hpp"
#include "sim/serving.hpp"
#include "topology/probe.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-serve",
                      "Serve a Llama-family model (GGUF, llama2.c or a Hugging Face folder) on CPU virtual devices:\n"
                      "an OpenAI-compatible HTTP API and a JSON-RPC control socket; the gear changes while it serves\n"
                      "(ftp-shift).\n"
                      "With --prompt: generate one completion, print only its text, and exit.");
  ftp::serve::DaemonOptions d;
  std::string prompt;
  bool have_prompt = false;
  ftp::serve::GenerateOptions o;
  std::string ramp;
  auto& app = tool.app();
  app.add_option("-m,--model", d.model_path,
                 "Model: a GGUF v3 file (llama, qwen2, qwen3), a llama2.c checkpoint (.bin), or a Hugging Face folder\n"
                 "(config.json, *.safetensors, tokenizer.json); with --engine sim also a model-shape JSON;\n"
                 "or hf:ORG/REPO[:FILE], downloaded from the Hugging Face hub into $XDG_CACHE_HOME/flextp (HF_ENDPOINT,\n"
                 "HF_TOKEN, HF_HUB_OFFLINE)")
      ->required()
      ->option_text("PATH|hf:ORG/REPO[:FILE]");
  app.add_option("--tokenizer", d.tokenizer_path,
                 "llama2.c tokenizer.bin (default: tokenizer.bin or tok<vocab>.bin beside the model)")
      ->option_text("PATH");
  app.add_option("--engine", d.engine,
                 "real (default): the model's math on the CPU; sim: the simulated engine, the cost model's time on\n"
                 "the --topology devices (no weights needed)")
      ->option_text("real|sim");
  app.add_option("--backend", d.service.backend,
                 "Where the real engine runs: cpu (default; virtual devices) or cuda (gear devices gpu<N> are CUDA\n"
                 "device N, any other name device 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->option_text("cpu|cuda");
  app.add_option("--topology", d.topology_path,
                 "With --engine sim: device speeds, ftp.topology/v1 (ftp-probe) or ftp.cluster/v1\n"
                 "(default: probe this machine's CPU virtual devices)")
      ->option_text("FILE");
  app.add_option("--calibration", d.calibration_path,
                 "With --engine sim: fitted cost-model constants, ftp.sim-calibration/v1 (from the sim-fidelity benchmark)")
      ->option_text("FILE");
  app.add_option("--gears", d.gears_path, "Gear table (ftp.gear-table/v1); SIGHUP reloads it")->option_text("FILE");
  app.add_option("--gear", d.gear_spec, "One-gear layout instead of --gears (default tp=1,pp=1,dp=1)")
      ->option_text("tp=T,pp=P,dp=D");
  app.add_option("--start-gear", d.service.start_gear, "Gear to start in (default: the first of the table)")
      ->option_text("NAME");
  app.add_option("--host", d.http.host, "HTTP address (default 127.0.0.1)")->option_text("ADDR");
  app.add_option("--port", d.http.port, "HTTP port (default 8080; 0 picks a free one)")->check(ftp::cli::in_range(0, 65535));
  app.add_option("--socket", d.socket_path, "Control socket (default $FTP_SOCKET, $XDG_RUNTIME_DIR/flextp/control.sock)")
      ->option_text("PATH");
  app.add_option("--config-dir", d.config_dir,
                 "The control socket's reload reads a path only below DIR (default: the --gears file's directory)")
      ->option_text("DIR");
  app.add_option("--state-dir", d.state_dir,
                 "The shift journal's directory, shifts.jsonl (default: $STATE_DIRECTORY, else /var/lib/flextp)")
      ->option_text("DIR");
  app.add_flag("--enable-test-hooks", d.test_hooks, "Accept test hooks on the control socket (shift's inject_fault)");
  app.add_option("--http-threads", d.http.threads,
                 "Threads that parse HTTP requests (default 2); connections and streams hold none (one event loop)")
      ->check(ftp::cli::positive())
      ->option_text("N");
  ftp::http::Limits& lim = d.http.limits;
  app.add_option("--max-body-bytes", lim.max_body_bytes, "Largest request body; over: 413, unread (default 16777216)")
      ->option_text("BYTES");
  app.add_option("--max-header-bytes", lim.max_header_bytes, "Largest request line + headers; over: 431 (default 16384)")
      ->option_text("BYTES");
  app.add_option("--max-headers", lim.max_headers, "Most header fields of a request; over: 431 (default 100)")
      ->check(ftp::cli::positive())
      ->option_text("N");
  app.add_option("--header-timeout-ms", lim.header_timeout_ms,
                 "Deadline from a request's first byte to the end of its headers; over: 408 (default 10000)")
      ->check(ftp::cli::positive())
      ->option_text("MS");
  app.add_option("--body-timeout-ms", lim.body_timeout_ms,
                 "Deadline from the end of the headers to the end of the body; over: 408 (default 60000)")
      ->check(ftp::cli::positive())
      ->option_text("MS");
  app.add_option("--idle-timeout-ms", lim.idle_timeout_ms,
                 "How long a kept-alive connection may wait for its next request (default 30000)")
      ->check(ftp::cli::positive())
      ->option_text("MS");
  app.add_option("--max-connections", lim.max_connections, "Open HTTP connections in all; over: 503 (default 16384)")
      ->check(ftp::cli::positive())
      ->option_text("N");
  app.add_option("--max-connections-per-address", lim.max_connections_per_address,
                 "Open HTTP connections of one client address; over: 503 (default 1024)")
      ->check(ftp::cli::positive())
      ->option_text("N");
  app.add_option("--stream-buffer-bytes", lim.stream_buffer_bytes,
                 "Bytes of a stream its client has not taken before the stream ends and its request is cancelled "
                 "(default 1048576)")
      ->option_text("BYTES");
  app.add_option("--served-model-name", d.http.served_model_names,
                 "A name the API serves the model as (repeatable; the first is the one answers carry; default: the "
                 "model's name)")
      ->option_text("NAME");
  app.add_option("--api-key", d.http.api_key, "Require 'Authorization: Bearer KEY' on /v1/* (default: $FTP_API_KEY)")
      ->envname("FTP_API_KEY")
      ->option_text("KEY");
  app.add_option("--cors-origin", d.http.cors_origin,
                 "Allow browser clients of this origin ('*' or one, e.g. https://ui.example): CORS headers and "
                 "OPTIONS preflights (default: none)")
      ->option_text("ORIGIN");
  app.add_option("--virtual-devices", d.virtual_devices,
                 "CPU virtual devices vd0..vd<N-1>; the gears must stay on them (default: those the table names)")
      ->check(ftp::cli::non_negative())
      ->option_text("N");
  app.add_option("--virtual-device-memory", d.service.virtual_device_memory,
                 "Memory budget of each CPU virtual device, bytes, as a GPU's memory (default: the host's split "
                 "evenly)")
      ->check(ftp::cli::positive())
      ->option_text("BYTES");
  app.add_flag("--device-memory", d.service.device_memory,
               "Each CPU virtual device holds a private copy of exactly its weight shards over the gear table "
               "(their union, ranks nested), made at start and counted on its budget as a GPU's; domains view "
               "those copies (default: views of the mapped file)");
  app.add_option("--kv-blocks", d.service.kv_blocks,
                 "KV-cache pages of 16 tokens per domain (default: the gear's kv_cache_cap of each virtual device's "
                 "free memory, at most what --max-running requests of the full context need)")
      ->check(ftp::cli::positive());
  app.add_option_function<std::string>(
         "--kv-cache-dtype",
         [&d](const std::string& s) { d.service.kv_dtype = ftp::engine::kv_dtype_from_string(s, "--kv-cache-dtype"); },
         "Element type of the KV pages: auto (16 bits in the model's compute type: bf16 for a BF16 model, f16 "
         "otherwise), f16, bf16 or f32 (default auto)")
      ->check(CLI::IsMember({"auto", "f16", "bf16", "f32"}))
      ->option_text("TYPE");
  app.add_option("--max-running", d.service.max_running, "Sequences in a domain's running batch (default 64)")
      ->check(ftp::cli::positive());
  app.add_option("--max-waiting-requests", d.service.admission.service_requests,
                 "Admission: requests waiting for their first step, whole service; past it 429 (default 512)")
      ->check(ftp::cli::positive());
  app.add_option("--max-waiting-tokens", d.service.admission.service_tokens,
                 "Admission: prompt tokens of the waiting requests, whole service (default 524288)")
      ->check(ftp::cli::positive());
  app.add_option("--domain-max-waiting-requests", d.service.admission.domain_requests,
                 "Admission: requests waiting in one domain (default 256)")
      ->check(ftp::cli::positive());
  app.add_option("--domain-max-waiting-tokens", d.service.admission.domain_tokens,
                 "Admission: prompt tokens waiting in one domain (default 262144)")
      ->check(ftp::cli::positive());
  app.add_option("--max-batched-tokens", d.service.max_batched_tokens, "Token budget of one step (default 256)")
      ->check(ftp::cli::positive());
  app.add_option("--max-tokens-limit", d.service.max_tokens_limit, "Largest max_tokens a request may ask (default 2048)")
      ->check(ftp::cli::positive());
  app.add_option("--max-prompt-tokens", d.service.max_prompt_tokens, "Longest prompt (default: the context - 1)")
      ->check(ftp::cli::non_negative());
  app.add_option("--route-long-prompt", d.service.route_long_prompt_tokens,
                 "Send prompts of at least N tokens to the largest-TP domain (default 0: off)")
      ->check(ftp::cli::non_negative())
      ->option_text("N");
  app.add_option("--ramp", ramp, "Traffic shares of a shift's ramp (default 0.1,0.5,1.0)")->option_text("LIST");
  app.add_option("--step-interval-ms", d.service.step_interval_ms, "Wait at each ramp step (default 1000)")
      ->check(ftp::cli::non_negative());
  app.add_option("--drain-timeout-ms", d.service.drain_timeout_ms,
                 "How long a shift, a rollback or SIGTERM waits for a draining domain's requests (default 600000): a "
                 "shift then returns and the domain retires once idle; SIGTERM ends them with an error")
      ->check(ftp::cli::positive());
  app.add_option("--rerun-wait-ms", d.service.rerun_wait_ms,
                 "How long a request whose domain failed before it streamed anything (a member lost) waits for "
                 "another domain to run it again (default 30000); then it ends with the domain's error")
      ->check(ftp::cli::non_negative());
  app.add_flag("--auto", d.auto_loop, "Run the control loop inside: observations -> policy -> shifts");
  app.add_option("--policy", d.policy_path, "With --auto: policy config (ftp.policy/v1; default the built-in defaults)")
      ->option_text("FILE");
  app.add_option("--policy-name", d.policy_name, "With --auto: gear-shifter (default), tp-planner or naive")
      ->check(CLI::IsMember({"gear-shifter", "tp-planner", "naive"}));
  app.add_option("--observe-interval-ms", d.observe_interval_ms, "With --auto: ms between observations (default 1000)")
      ->check(ftp::cli::in_range(50, 3600000));
  app.add_option("-p,--prompt", prompt, "One-shot: generate a completion of TEXT and exit ('' means BOS only)")
      ->option_text("TEXT")
      ->each([&](const std::string&) { have_prompt = true; });
  app.add_option("-n,--max-tokens", o.max_tokens, "One-shot: tokens to generate at most (default 256)")
      ->check(ftp::cli::positive());
  app.add_option("-t,--temperature", o.sampling.temperature, "One-shot: temperature; 0 is greedy (default 0)")
      ->check(ftp::cli::in_range(0.0f, 100.0f));
  app.add_option("--top-k", o.sampling.top_k, "One-shot: sample among the K most likely tokens (0: off)")
      ->check(ftp::cli::non_negative());
  app.add_option("--top-p", o.sampling.top_p, "One-shot: sample from the smallest set of mass P (1: off)")
      ->check(ftp::cli::in_range(0.0f, 1.0f));
  app.add_option("-s,--seed", o.sampling.seed, "One-shot: random seed of the sampler (default 0)");
  app.add_option("--stop", o.stop, "One-shot: stop before this text (repeatable)")->option_text("TEXT");
  ftp::member::WorkerOptions w;
  std::string secret_file;
  int gloo_timeout_ms = 10000;
  app.add_option("--join", w.leader,
                 "Run as a member of the service whose leader's member channel is HOST:PORT: host this machine's\n"
                 "--virtual-devices as NAME/vd0.. and run the ranks the leader places on them (ftp-multi-node(7))")
      ->option_text("HOST:PORT");
  app.add_option("--secret-file", secret_file, "The members' shared secret (a file of mode 0600, at least 16 bytes)")
      ->option_text("FILE");
  app.add_option("--name", w.name, "With --join: this machine's name in device names (default n1)")->option_text("NAME");
  app.add_option("--gloo-host", w.gloo.hostname,
                 "With --join: the address this process's Gloo connections bind (default 127.0.0.1)")
      ->option_text("ADDR");
  app.add_option("--gloo-timeout-ms", gloo_timeout_ms,
                 "With --join: how long a collective or hand-off waits for a peer that does not answer (default 10000)")
      ->check(ftp::cli::positive());
  app.add_option("--members-listen", d.members_listen,
                 "Leader: take members on this member-channel address (HOST:PORT; needs --secret-file); their\n"
                 "devices are NAME/vd0.. in the gear table, and this machine's are --machine-name/vd0 or vd0")
      ->option_text("HOST:PORT");
  app.add_option("--machine-name", d.service.machine_name, "Leader: this machine's name in device names (default n0)")
      ->option_text("NAME");
  app.add_option("--wait-members", d.wait_members, "Leader: wait for N members before building the start gear")
      ->check(ftp::cli::non_negative())
      ->option_text("N");
  app.get_option("--gears")->excludes(app.get_option("--gear"));

  return tool.run(argc, argv, [&]() -> int {
    ftp::sim::check_engine_name(d.engine);  // an unknown engine is named as such, one-shot or not
    // Options that only act with another are refused without it, not ignored.
    auto given = [&](const char* name) { return tool.app().count(name) > 0; };
    if (d.engine != "sim")
      for (const char* opt : {"--topology", "--calibration"})
        if (given(opt)) throw ftp::InputError(std::string(opt) + ": only with --engine sim");
    if (!d.auto_loop)
      for (const char* opt : {"--policy", "--policy-name", "--observe-interval-ms"})
        if (given(opt)) throw ftp::InputError(std::string(opt) + ": only with --auto");
    if (given("--join")) {
      if (secret_file.empty()) throw ftp::InputError("--join: needs --secret-file");
      if (have_prompt || given("--gears") || given("--gear")) throw ftp::InputError("--join: a member serves the leader's gears only");
      w.secret = ftp::member::load_secret(secret_file);
      if (w.name.empty()) w.name = "n1";
      w.virtual_devices = d.virtual_devices > 0 ? d.virtual_devices : 2;
      w.gloo.timeout = std::chrono::milliseconds(gloo_timeout_ms);
      ftp::model::Model model = ftp::model::load_model(d.model_path, d.tokenizer_path);
      const std::string pid = std::to_string(::getpid());
      return ftp::member::run_worker(w, model, [&](const std::string& line) {
        std::cerr << "ftp-serve[" << pid << "] " << w.name << ": " << line << "\n" << std::flush;
      });
    }
    for (const char* opt : {"--name", "--gloo-host"})
      if (given(opt)) throw ftp::InputError(std::string(opt) + ": only with --join");
    for (const char* opt : {"--machine-name", "--wait-members"})
      if (given(opt) && !given("--members-listen")) throw ftp::InputError(std::string(opt) + ": only with --members-listen");
    d.secret_file = secret_file;
    d.service.gloo.timeout = std::chrono::milliseconds(gloo_timeout_ms);
    if (have_prompt)
      for (const char* opt : {"--device-memory", "--virtual-device-memory"})
        if (given(opt)) throw ftp::InputError(std::string(opt) + ": only with the daemon (one-shot has no virtual devices)");
    if (have_prompt && given("--gears"))
      throw ftp::InputError("--gears: one-shot (--prompt) runs one gear; give it with --gear tp=T,pp=P");
    if (d.engine != "real" && d.service.backend != "cpu")
      throw ftp::InputError("--backend " + d.service.backend + ": only the real engine has a backend (--engine " +
                            d.engine + ")");
    if (ftp::hub::is_hub_ref(d.model_path)) {
      auto fo = ftp::hub::options_from_environment();
      fo.log = [](std::string_view line) { std::cerr << "ftp-serve: " << line << "\n" << std::flush; };
      d.model_path = ftp::hub::fetch(ftp::hub::parse_ref(d.model_path), fo).string();
    }
    if (!have_prompt) {
      if (!ramp.empty()) d.service.ramp = ftp::serve::parse_ramp(ramp);
      if (d.engine == "sim" && d.topology_path.empty()) {
        // No described cluster: the simulated engine runs at this machine's measured speeds.
        ftp::topology::ProbeOptions po;
        po.quick = true;
        po.gpus = false;
        auto g = ftp::serve::parse_gear_spec(d.gear_spec);
        po.virtual_devices = d.virtual_devices > 0 ? d.virtual_devices : g.tp * g.pp * g.dp;
        if (d.virtual_devices == 0 && !d.gears_path.empty()) {
          // As many as the gear table names.
          auto table = ftp::json::parse_file(d.gears_path, [](const ftp::json::Json& j) { return ftp::doc::gear_table_from_json(j); });
          std::set<std::string> names;
          for (const auto& gear : table.gears)
            for (const auto& dev : gear.devices()) names.insert(dev);
          po.virtual_devices = std::max<int>(1, static_cast<int>(names.size()));
        }
        d.topology = ftp::topology::probe_local(po);
      }
      std::string pid = std::to_string(::getpid());
      d.log = [&](std::string_view line) { std::cerr << "ftp-serve[" << pid << "]: " << line << "\n" << std::flush; };
      d.http_front = ftp::api::openai::make_front;
      return ftp::serve::run_daemon(d);
    }
    if (d.engine != "real")
      throw ftp::InputError("--prompt: one-shot runs the real engine only; for --engine " + d.engine +
                            " run the daemon and ask over HTTP");
    o.gear = ftp::serve::parse_gear_spec(d.gear_spec);
    o.backend = d.service.backend;
    o.prompt = prompt;
    ftp::model::Model model = ftp::model::load_model(d.model_path, d.tokenizer_path);
    bool json = !tool.app().get_option("--json")->empty();
    std::string text = ftp::serve::generate_once(model, o, [&](std::string_view piece) {
      if (!json) std::cout << piece << std::flush;
    });
    if (json)
      tool.emit(ftp::json::Json{{"kind", "ftp.completion/v1"}, {"model", d.model_path}, {"gear", d.gear_spec}, {"text", text}});
    else
      std::cout << "\n" << std::flush;
    return 0;
  });
}
