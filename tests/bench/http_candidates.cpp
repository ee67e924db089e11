// SPDX-License-Identifier: Apache-2.0
// The HTTP libraries issue 20 chose between, each serving GET / -> "ok" on
// 127.0.0.1:PORT with its defaults for a server of this kind, for
// tests/bench/http-candidates.sh to measure (idle connections held:
// threads and RSS; a normal request under slowloris):
//   http-candidates httplib|mhd|flextp PORT
// httplib: cpp-httplib 0.11, thread pool (what ftp-serve had). mhd:
// libmicrohttpd 0.9.75, one epoll thread, 10 s connection timeout.
// flextp: lib/http (libuv + http-parser), its default limits.
#include <httplib.h>
#include <microhttpd.h>

#include <csignal>
#include <cstring>
#include <iostream>
#include <string>

#include <unistd.h>

#include "http/server.hpp"

namespace {

MHD_Result mhd_answer(void*, MHD_Connection* c, const char*, const char*, const char*, const char*, size_t*, void** state) {
  static int first;
  if (*state != &first) {  // the headers: wait for the (empty) body
    *state = &first;
    return MHD_YES;
  }
  static const char ok[] = "ok";
  MHD_Response* r = MHD_create_response_from_buffer(2, const_cast<char*>(ok), MHD_RESPMEM_PERSISTENT);
  MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: http-candidates httplib|mhd|flextp PORT\n";
    return 2;
  }
  const std::string which = argv[1];
  const int port = std::stoi(argv[2]);
  std::signal(SIGPIPE, SIG_IGN);
  if (which == "httplib") {
    httplib::Server svr;
    svr.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
    std::cout << "listening\n" << std::flush;
    return svr.listen("127.0.0.1", port) ? 0 : 1;
  }
  if (which == "mhd") {
    MHD_Daemon* d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, static_cast<uint16_t>(port),
                                     nullptr, nullptr, &mhd_answer, nullptr, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                     MHD_OPTION_CONNECTION_LIMIT, 20000u, MHD_OPTION_END);
    if (!d) return 1;
    std::cout << "listening\n" << std::flush;
    pause();
    return 0;
  }
  if (which == "flextp") {
    ftp::http::ServerOptions o;
    o.port = port;
    o.limits.max_connections = 20000;
    o.limits.max_connections_per_address = 20000;
    o.handler = [](ftp::http::Request&&, std::shared_ptr<ftp::http::Exchange> ex) {
      ex->respond(ftp::http::Response{200, "text/plain", {}, "ok"});
    };
    ftp::http::Server s(o);
    s.start();
    std::cout << "listening\n" << std::flush;
    pause();
    return 0;
  }
  std::cerr << "http-candidates: unknown server '" << which << "'\n";
  return 2;
}
