// SPDX-License-Identifier: Apache-2.0
#pragma once

// The blocking control-socket client the tools use (ftp-protocol(7)).

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "ipc/protocol.hpp"

namespace ftp::ipc {

/// Refuses a server that runs as another user than root or this process's:
/// in a directory others may write to, one of them could listen at the
/// socket's path first and take the tools' calls (a shift, a drain). Reads
/// SO_PEERCRED of the connected socket `fd`; on refusal closes it and throws
/// ftp::Error (Exit::unreachable) naming the server's uid, user and pid.
void check_server_credentials(int fd, const std::string& path);

/// A blocking JSON-RPC client over a Unix stream socket (plain POSIX + poll).
/// One thread at a time. Errors:
///  * daemon unreachable: ftp::Error, Exit::unreachable, naming the path and errno;
///  * a server of another user than root or this one: the same, naming its uid;
///  * an error response: RpcError with its code and name (e.g. ftp.NoSuchMethod);
///  * no response in time: RpcError ftp.Timeout (Exit::timeout);
///  * connection lost before the response: RpcError ftp.Disconnected (Exit::unreachable).
/// After a timeout or a lost connection the client is disconnected; the
/// next call connects again.
class Client {
 public:
  /// Connects at once; throws ftp::Error (Exit::unreachable) when it cannot.
  explicit Client(std::string path = default_socket_path());
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& path() const noexcept { return path_; }
  bool connected() const noexcept { return fd_ >= 0; }
  void connect();
  void close() noexcept;

  /// Calls a method and returns its result.
  Json call(std::string_view method, Json params = Json::object(),
            std::chrono::milliseconds timeout = kCallTimeout);

  /// Receives one stream item (the notification's params.data). Return false
  /// to stop: the client closes the connection, which cancels the stream on
  /// the server, and stream() returns nullopt.
  using OnItem = std::function<bool(const Json& data)>;

  /// Calls a streaming method: on_item for each ftp.stream notification tied
  /// to this call, then returns the final result. `idle` bounds the wait for
  /// each message (none: wait forever).
  std::optional<Json> stream(std::string_view method, Json params, const OnItem& on_item,
                             std::optional<std::chrono::milliseconds> idle = std::nullopt);

  /// Sends a request without waiting; returns its id.
  std::int64_t send_request(std::string_view method, Json params = Json::object());
  /// Sends raw bytes as they are (tests, diagnostics). Throws RpcError
  /// ftp.Disconnected when the connection is gone.
  void send_raw(std::string_view bytes);
  /// Next message (a line, parsed); nullopt at end of stream. Throws RpcError
  /// ftp.Timeout when nothing arrives in time.
  std::optional<Json> read_message(std::optional<std::chrono::milliseconds> timeout);

 private:
  std::optional<std::string> read_line(std::optional<std::chrono::steady_clock::time_point> deadline);
  [[noreturn]] void lost(const std::string& why);

  std::string path_;
  int fd_ = -1;
  std::int64_t next_id_ = 1;
  std::string buf_;
  std::size_t scan_ = 0;
};

}  // namespace ftp::ipc
