// SPDX-License-Identifier: Apache-2.0
// ftp-probe: discover and measure devices, links and islands; print ftp.topology/v1.
#include "cli/tool.hpp"
#include "doc/topology.hpp"
#include "ipc/client.hpp"
#include "topology/probe.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-probe",
                      "Discover this machine's devices (CPU, CPU virtual devices, GPUs, MIG slices), measure them\n"
                      "(GEMM TFLOP/s, triad GB/s, all-reduce bus bandwidth), group them into islands and print\n"
                      "an ftp.topology/v1 document. With --cluster, describe a cluster from a spec instead.");
  ftp::topology::ProbeOptions opts;
  std::string cluster;
  bool no_gpu = false;
  auto& app = tool.app();
  app.add_option("-n,--virtual-devices", opts.virtual_devices,
                 "Split the CPU into N virtual devices in one island (0: one cpu0 device)")
      ->check(ftp::cli::in_range(0, 4096));
  app.add_option("--cluster", cluster, "Read a cluster spec (ftp.cluster/v1, '-' for stdin) instead of probing")
      ->option_text("FILE");
  app.add_flag("--quick", opts.quick, "Short measurements (seconds instead of tens of seconds)");
  app.add_flag("--no-gpu", no_gpu, "Do not look for CUDA devices");
  bool watch = false;
  int interval_ms = 1000, count = 0;
  app.add_flag("--watch", watch, "Stream ftp.observation/v1 JSON Lines from a running ftp-serve");
  app.add_option("--interval", interval_ms, "With --watch: ms between observations (default 1000)")
      ->check(ftp::cli::in_range(50, 3600000))
      ->option_text("MS");
  app.add_option("--count", count, "With --watch: stop after N observations (default: never)")
      ->check(ftp::cli::positive());
  bool gather = false;
  app.add_flag("--gather", gather,
               "Ask a running ftp-serve for its machine's probe and each member's, gathered into one topology with "
               "the measured link between machines (with --quick: short measurements)");
  tool.add_socket_option("With --watch or --gather: ");
  app.get_option("--watch")->excludes(app.get_option("--cluster"));
  app.get_option("--gather")->excludes(app.get_option("--watch"));
  app.get_option("--gather")->excludes(app.get_option("--cluster"));
  app.get_option("--gather")->excludes(app.get_option("--virtual-devices"));
  app.get_option("--cluster")->excludes(app.get_option("--virtual-devices"));

  return tool.run(argc, argv, [&] {
    if (!watch) {
      for (const char* opt : {"--interval", "--count"})
        if (tool.app().count(opt)) throw ftp::InputError(std::string(opt) + ": only with --watch");
      if (!gather && tool.app().count("--socket")) throw ftp::InputError("--socket: only with --watch or --gather");
    }
    if (gather) {
      ftp::ipc::Client client(tool.socket_path());
      // A full probe of every machine takes tens of seconds each.
      tool.emit(client.call("topology", ftp::json::Json{{"quick", opts.quick}}, std::chrono::minutes(10)));
      return 0;
    }
    if (watch) {
      ftp::ipc::Client client(tool.socket_path());
      ftp::json::Json params{{"interval_ms", interval_ms}};
      if (count > 0) params["count"] = count;
      client.stream("watch", params, [&](const ftp::json::Json& o) {
        tool.emit_line(o);
        return true;
      });
      return 0;
    }
    opts.gpus = !no_gpu;
    opts.progress = [&](std::string_view line) { tool.progress(line); };
    ftp::doc::Topology topo = cluster.empty() ? ftp::topology::probe_local(opts)
                                              : ftp::topology::topology_from_cluster_file(cluster);
    tool.emit(ftp::doc::to_json(topo));
    return 0;
  });
}
