// SPDX-License-Identifier: Apache-2.0
#include "http/server.hpp"

#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <csignal>
#include <cstring>

#include "core/error.hpp"
#include "http/connection.hpp"

namespace ftp::http {

const char* reason_phrase(int status) {
  switch (status) {
#define XX(num, name, string) \
  case num:                   \
    return #string;
    HTTP_STATUS_MAP(XX)
#undef XX
    default:
      return "Unknown";
  }
}

namespace detail {

void Core::post(Op op) {
  std::lock_guard lk(mu);
  if (loop_done) return;  // the loop has ended: nobody is left to answer
  ops.push_back(std::move(op));
  uv_async_send(&wake);
}

void Core::submit(std::function<void()> fn) {
  {
    std::lock_guard lk(wmu);
    work.push_back(std::move(fn));
  }
  wcv.notify_one();
}

void Core::log(const std::string& line) {
  if (!opts.log) return;
  try {
    opts.log(line);
  } catch (...) {
    // A failing log sink must not stop the loop.
  }
}

Response Core::error_response(int status, const std::string& reason) {
  if (opts.error_body) {
    try {
      return opts.error_body(status, reason);
    } catch (...) {
    }
  }
  return Response{status, "text/plain; charset=utf-8", {}, reason + "\n"};
}

void Core::run_ops() {
  std::deque<Op> batch;
  bool stop_now = false;
  {
    std::lock_guard lk(mu);
    batch.swap(ops);
    stop_now = stop_requested && !stopping;
  }
  for (auto& op : batch) {
    auto it = conns.find(op.conn);
    if (it == conns.end()) {
      if (op.ex) op.ex->sent(op.bytes.size());
      continue;
    }
    Connection* c = it->second;
    if (c->ex != op.ex) {  // an exchange the connection no longer answers
      if (op.ex) op.ex->sent(op.bytes.size());
      continue;
    }
    if (op.abort) {
      log("peer=" + c->peer + " event=client_not_reading detail=\"stream buffer over " +
          std::to_string(opts.limits.stream_buffer_bytes) + " bytes; closed\"");
      c->ex.reset();
      c->close();
      continue;
    }
    c->write(std::move(op.bytes), op.ex);
    if (op.final) c->finish_exchange(op.close);
  }
  if (stop_now) begin_stop();
}

void Core::begin_stop() {
  stopping = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
  std::vector<Connection*> idle;
  for (auto& [id, c] : conns)
    if (c->state != Connection::State::answering) idle.push_back(c);
  for (Connection* c : idle) {
    if (c->state == Connection::State::closing) continue;
    c->close();
  }
  if (conns.empty()) return shutdown_loop();
  uv_timer_start(
      &stop_timer, [](uv_timer_t* t) { static_cast<Core*>(t->data)->shutdown_loop(); },
      static_cast<std::uint64_t>(grace_ms > 0 ? grace_ms : 0), 0);
}

void Core::shutdown_loop() {
  if (shut) return;
  shut = true;
  std::vector<Connection*> all;
  for (auto& [id, c] : conns) all.push_back(c);
  for (Connection* c : all) c->close();
  uv_timer_stop(&stop_timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&stop_timer), nullptr);
  std::lock_guard lk(mu);
  loop_done = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&wake), nullptr);
}

}  // namespace detail

Server::Server(ServerOptions options) : core_(std::make_shared<detail::Core>(std::move(options))) {}

Server::~Server() { stop(0); }

int Server::port() const { return core_->port; }

int Server::connections() const { return core_->open.load(); }

void Server::start() {
  detail::Core& c = *core_;
  if (c.thread.joinable()) throw Error("http: already started on port " + std::to_string(c.port));
  const std::string where =
      (c.opts.host.find(':') != std::string::npos ? "[" + c.opts.host + "]" : c.opts.host) + ":" +
      std::to_string(c.opts.port);
  if (c.opts.port < 0 || c.opts.port > 65535) throw InputError("http: " + where + ": port must be 0..65535");
  // Every connection is a descriptor: take what the hard limit allows.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  // libuv writes with write(2), which raises SIGPIPE when a client has hung
  // up: a server in any process (not only the daemon, which ignores it too)
  // must see EPIPE on that connection instead of dying. Only the default
  // disposition is replaced; an embedder's own handler stays.
  struct sigaction sa{};
  if (sigaction(SIGPIPE, nullptr, &sa) == 0 && sa.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  // http-parser's own bound on a header block, above ours (ours answers 431).
  http_parser_set_max_header_size(static_cast<std::uint32_t>(
      std::max<std::size_t>(c.opts.limits.max_header_bytes + 4096, 8192)));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(c.opts.port);
  if (int rc = getaddrinfo(c.opts.host.c_str(), port_s.c_str(), &hints, &res); rc != 0 || !res)
    throw Error("http: cannot listen on " + where + ": " + gai_strerror(rc));
  uv_loop_init(&c.loop);
  uv_tcp_init(&c.loop, &c.listener);
  c.listener.data = &c;
  int rc = uv_tcp_bind(&c.listener, res->ai_addr, 0);
  freeaddrinfo(res);
  const int backlog = c.opts.limits.backlog > 0 ? c.opts.limits.backlog : SOMAXCONN;
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&c.listener), backlog, detail::on_connection);
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c.listener), nullptr);
    uv_run(&c.loop, UV_RUN_DEFAULT);
    uv_loop_close(&c.loop);
    throw Error("http: cannot listen on " + where + ": " + std::strerror(-rc));
  }
  sockaddr_storage ss{};
  int len = sizeof ss;
  uv_tcp_getsockname(&c.listener, reinterpret_cast<sockaddr*>(&ss), &len);
  c.port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  uv_async_init(&c.loop, &c.wake, [](uv_async_t* a) { static_cast<detail::Core*>(a->data)->run_ops(); });
  c.wake.data = &c;
  uv_timer_init(&c.loop, &c.stop_timer);
  c.stop_timer.data = &c;
  const int nw = c.opts.workers > 0 ? c.opts.workers : 1;
  for (int i = 0; i < nw; ++i)
    c.workers.emplace_back([&c] {
      for (;;) {
        std::function<void()> fn;
        {
          std::unique_lock lk(c.wmu);
          c.wcv.wait(lk, [&] { return c.wstop || !c.work.empty(); });
          if (c.work.empty()) return;
          fn = std::move(c.work.front());
          c.work.pop_front();
        }
        try {
          fn();
        } catch (const std::exception& e) {
          c.log(std::string("event=handler_failed detail=\"") + e.what() + "\"");
        }
      }
    });
  c.thread = std::thread([&c] {
    uv_run(&c.loop, UV_RUN_DEFAULT);
    uv_loop_close(&c.loop);
  });
}

void Server::stop(int grace_ms) {
  detail::Core& c = *core_;
  if (!c.thread.joinable()) return;
  {
    std::lock_guard lk(c.mu);
    c.stop_requested = true;
    c.grace_ms = grace_ms;
    if (!c.loop_done) uv_async_send(&c.wake);
  }
  c.thread.join();
  {
    std::lock_guard lk(c.wmu);
    c.wstop = true;
  }
  c.wcv.notify_all();
  for (auto& w : c.workers) w.join();
  c.workers.clear();
}

}  // namespace ftp::http
