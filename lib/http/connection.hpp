// SPDX-License-Identifier: Apache-2.0
#pragma once

// Internal to lib/http: the event loop's state (Core) and one client
// connection (Connection): parsing, limits, timeouts, writes, pipelining.

#include <http_parser.h>
#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http/exchange.hpp"
#include "http/server.hpp"

namespace ftp::http::detail {

struct Connection;

/// What an Exchange asks of its connection's loop.
struct Op {
  std::uint64_t conn = 0;
  std::shared_ptr<Exchange> ex;
  std::string bytes;
  bool final = false;  ///< the exchange ends
  bool close = false;  ///< then the connection closes (after its bytes are sent)
  bool abort = false;  ///< close now, unsent bytes dropped (a client that does not read)
};

struct Core : std::enable_shared_from_this<Core> {
  explicit Core(ServerOptions o) : opts(std::move(o)) {}

  ServerOptions opts;
  uv_loop_t loop{};
  uv_tcp_t listener{};
  uv_async_t wake{};
  uv_timer_t stop_timer{};
  std::thread thread;
  int port = 0;
  std::atomic<int> open{0};

  // Between threads (Exchange -> loop).
  std::mutex mu;
  std::deque<Op> ops;
  bool stop_requested = false;
  bool loop_done = false;  ///< the wake handle is closed
  int grace_ms = 1000;

  // The loop's own.
  bool stopping = false, shut = false;
  std::unordered_map<std::uint64_t, Connection*> conns;
  std::unordered_map<std::string, int> per_address;
  std::uint64_t next_id = 1;

  // Workers that run handlers.
  std::mutex wmu;
  std::condition_variable wcv;
  std::deque<std::function<void()>> work;
  bool wstop = false;
  std::vector<std::thread> workers;

  void post(Op op);  ///< any thread
  void submit(std::function<void()> fn);
  void log(const std::string& line);
  Response error_response(int status, const std::string& reason);
  void run_ops();        ///< loop
  void begin_stop();     ///< loop
  void shutdown_loop();  ///< loop: closes what is left so that uv_run returns
};

struct Connection {
  enum class State { idle, headers, body, answering, closing };

  Connection(Core& core, std::uint64_t id);
  Core& core;
  std::uint64_t id;
  uv_tcp_t tcp{};
  uv_timer_t timer{};
  http_parser parser{};
  std::string peer;
  bool counted = false;  ///< in core.per_address
  State state = State::idle;

  Request req;
  bool in_value = false;
  std::size_t header_bytes = 0;
  int refuse = 0;  ///< a status to answer, found by a parser callback
  std::string refuse_reason;
  std::optional<Response> early;  ///< on_headers's refusal
  bool complete = false;          ///< a request is whole (the parser is paused)

  std::string pending;  ///< input read while answering
  bool reading = false;
  std::shared_ptr<Exchange> ex;
  std::size_t unsent = 0;
  bool close_when_flushed = false;
  bool closed = false;
  int open_handles = 0;

  void start();
  void on_data(const char* data, std::size_t n);
  void feed(const char* data, std::size_t n);
  void dispatch();
  void refuse_now(int status, const std::string& reason);
  void refuse_with(Response r);
  void write(std::string bytes, const std::shared_ptr<Exchange>& by);
  void finish_exchange(bool close);
  void linger();
  void set_timer(int ms);
  void on_timer();
  void close();
};

void on_connection(uv_stream_t* server, int status);

}  // namespace ftp::http::detail
