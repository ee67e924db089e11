// SPDX-License-Identifier: Apache-2.0
#pragma once

// The control-socket server: a libuv loop on its own thread serving many
// concurrent clients with the methods of one table (ftp-protocol(7)).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ipc/protocol.hpp"

namespace ftp::ipc {

namespace detail {
struct Core;
}

/// One parameter of a method, as `introspect` lists it and as the server
/// checks it before the handler runs (present when required, of its type).
struct Param {
  std::string name;
  /// "string", "integer", "number", "boolean", "object", "array" or "any".
  std::string type;
  bool required = false;
  std::string doc;
};

class Call;

/// A method handler. It runs on the server's loop thread and must not block:
/// long work goes to another thread with call.share(), which answers later.
using Handler = std::function<void(Call&)>;

/// One row of the method table.
struct Method {
  std::string name;
  std::string description;  ///< one line
  std::vector<Param> params;
  std::string result;       ///< one line on what the result holds
  bool streaming = false;   ///< sends ftp.stream notifications before its result
  Handler handler;
};

/// One call in progress. Every answering member is thread-safe and may be
/// called from any thread; the first of reply()/error()/end() ends the call
/// and later answers are ignored. A call whose client disconnects, or which
/// the server ends at shutdown, is cancelled.
class Call : public std::enable_shared_from_this<Call> {
 public:
  /// `id_text`: the id as the request wrote it, to answer with the same
  /// text (a 30-digit number a double cannot hold); empty: id's own text.
  Call(std::shared_ptr<detail::Core> core, std::uint64_t conn, std::uint64_t seq, Json id, bool has_id,
       std::string method, Json params, Peer peer, std::string id_text = {});

  const std::string& method() const noexcept { return method_; }
  /// The params object ({} when the request had none).
  const Json& params() const noexcept { return params_; }
  /// The request id; null for a notification (which gets no answer).
  const Json& id() const noexcept { return id_; }
  /// The id's JSON text in the answers: as the request wrote it.
  const std::string& id_text() const noexcept { return id_text_; }
  bool is_notification() const noexcept { return !has_id_; }
  /// Credentials of the client process (SO_PEERCRED).
  const Peer& peer() const noexcept { return peer_; }

  /// Keeps the call alive to answer it from elsewhere (another thread, a timer).
  std::shared_ptr<Call> share() { return shared_from_this(); }

  /// Answers with a result; ends the call.
  void reply(Json result);
  /// Ends a stream with its final result (default {"end": true}).
  void end(Json result = nullptr);
  /// Answers with an error of the table; ends the call.
  void error(Errc errc, std::string_view message, const Json& data = nullptr);
  /// Answers with an error named by a later method ("ftp.NoSuchGear", code
  /// in -32000..-32099 or a code of the table); ends the call.
  void error(int code, std::string_view name, std::string_view message, const Json& data = nullptr);
  /// Sends one stream item as an ftp.stream notification tied to this call's id.
  /// Returns false when the call is over (ended or cancelled).
  bool notify(Json data);

  /// True once the client has gone or the server is stopping.
  bool cancelled() const noexcept { return cancelled_.load(); }
  /// True once the call was answered (or cancelled).
  bool done() const noexcept { return done_.load(); }
  /// Runs fn once when the call is cancelled (on the loop thread), or at once
  /// on this thread when it already is.
  void on_cancel(std::function<void()> fn);

 private:
  friend struct detail::Core;
  bool finish(std::string line);
  void cancel();

  std::shared_ptr<detail::Core> core_;
  std::uint64_t conn_;
  std::uint64_t seq_;
  Json id_;
  std::string id_text_;  ///< JSON text of id_ for the answers
  bool has_id_;
  std::string method_;
  Json params_;
  Peer peer_;
  std::atomic<bool> done_{false};
  std::atomic<bool> cancelled_{false};
  std::mutex cancel_mu_;
  std::function<void()> on_cancel_;
};

struct ServerOptions {
  std::string socket_path;  ///< empty: default_socket_path()
  std::size_t max_message_bytes = kMaxMessageBytes;  ///< bytes
  std::chrono::milliseconds idle_timeout = kIdleTimeout;  ///< 0 disables
  std::size_t max_connections = kMaxConnections;
  /// At stop(), how long clients get to take their last messages before the
  /// connections are closed hard. // ms
  std::chrono::milliseconds shutdown_grace{2000};
  /// Bytes of answers queued for a client that does not read (calls it
  /// sent, a stream it does not consume) past which the server cuts the
  /// connection when it writes the next one. // bytes
  std::size_t max_queued_bytes = kMaxQueuedBytes;
  /// Mode of the socket file.
  unsigned socket_mode = 0660;
  /// Errors of the methods' own (beyond the protocol's, ipc::error_table):
  /// introspect lists them after those.
  struct MethodError {
    int code;
    std::string name, summary;
  };
  std::vector<MethodError> method_errors;
  /// Receives the server's log lines (accepts with peer credentials, protocol
  /// errors, closes). Called on the loop thread. Default: none.
  LogFn log;
};

/// The server. Construct with the method table, start(), stop() (or destroy).
/// The built-in method `introspect` is added to the table.
class Server {
 public:
  Server(ServerOptions options, std::vector<Method> methods);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Creates the socket (mode 0660; a stale socket file is replaced, a live
  /// one is an error), then serves on a new thread. Throws ftp::Error.
  void start();
  /// Stops accepting, ends pending calls and streams with ftp.ShuttingDown,
  /// closes every connection (after a short grace to flush), removes the
  /// socket file and joins the thread. Idempotent. Not from a method
  /// handler (it runs on the loop thread this joins): throws there.
  void stop();

  const std::string& socket_path() const noexcept;
  /// Connections open now.
  std::size_t connection_count() const noexcept;
  /// Bytes of answers queued for all clients, not yet written. // bytes
  std::size_t queued_bytes() const noexcept;
  /// The `introspect` result.
  Json introspect() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ftp::ipc
