// SPDX-License-Identifier: Apache-2.0
#pragma once

// The HTTP/1.1 transport of the daemon: one libuv event loop for every
// connection (no thread per connection), requests parsed by http-parser
// (Debian's libhttp-parser), handlers run on a small pool of worker threads
// and answer through an Exchange from any thread. Enforces http::Limits
// (431, 413, 400, 408, 503), answers pipelined requests in order, listens
// with a backlog of SOMAXCONN. Why this and not Boost.Beast or
// libmicrohttpd: docs/architecture.md, section 5.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "http/exchange.hpp"
#include "http/limits.hpp"
#include "http/message.hpp"

namespace ftp::http {

namespace detail {
struct Core;
}

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  ///< 0 picks a free port
  Limits limits;
  int workers = 2;  ///< threads that run handlers
  /// Called on the event loop when a request's headers are in, before its
  /// body is read: an answer refuses it there (the body is not read, the
  /// connection closes). Must be quick.
  std::function<std::optional<Response>(const Request&)> on_headers;
  /// The request, once whole, on a worker thread. It answers through the
  /// exchange, now or later from any thread.
  std::function<void(Request&&, std::shared_ptr<Exchange>)> handler;
  /// An answer of the transport itself (status and reason, e.g. 431 "header
  /// fields over 16384 bytes"): the body to send. Empty: text.
  std::function<Response(int status, const std::string& reason)> error_body;
  /// One line per connection-level event (limit hit, timeout); from the loop.
  std::function<void(const std::string&)> log;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds and runs the loop on its own thread. Throws ftp::Error naming
  /// host:port and the reason.
  void start();
  int port() const;
  /// Open connections now.
  int connections() const;
  /// Stops listening, closes idle connections, lets answers in progress
  /// end for up to grace_ms, then closes every connection and joins the
  /// threads. Idempotent.
  void stop(int grace_ms = 1000);

 private:
  std::shared_ptr<detail::Core> core_;
};

}  // namespace ftp::http
