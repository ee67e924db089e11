// SPDX-License-Identifier: Apache-2.0
#pragma once

// The control-socket protocol (ftp-protocol(7)): JSON-RPC 2.0, one message
// per line ('\n'-terminated UTF-8 JSON), over a Unix stream socket. This
// header holds what server and client share: the fixed limits, the one table
// of error codes and names, the error type, and the default socket path.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"

namespace ftp::ipc {

using Json = ftp::json::Json;

/// Protocol name and version, reported by `introspect`.
inline constexpr std::string_view kProtocolVersion = "ftp.protocol/v1";

/// Largest message, in bytes, not counting the terminating '\n' (16 MiB).
/// A longer line gets ftp.MessageTooLarge and the connection is closed.
inline constexpr std::size_t kMaxMessageBytes = std::size_t{16} << 20;

/// A connection with no traffic and no call in progress for this long is
/// sent ftp.IdleTimeout and closed. A running stream is never idle.
inline constexpr std::chrono::milliseconds kIdleTimeout{60'000};

/// Most client connections served at once; one more is sent
/// ftp.TooManyConnections and closed.
inline constexpr std::size_t kMaxConnections = 256;

/// Bytes of answers a connection may have queued, unread by its client,
/// when the server writes one more (1 MiB): past it the connection is cut
/// and what it held is freed. A client that sends 12,000 calls and never
/// reads held 63 MB before this bound. One answer larger than the bound
/// still goes to a client that reads.
inline constexpr std::size_t kMaxQueuedBytes = std::size_t{1} << 20;

/// Default time a blocking client waits for a response.
inline constexpr std::chrono::milliseconds kCallTimeout{30'000};

/// Method of the notifications that carry a stream's items; their params
/// are {"id": <request id>, "method": <request method>, "data": <item>}.
inline constexpr std::string_view kStreamNotification = "ftp.stream";

/// The errors of the protocol. Each has one JSON-RPC code and one qualified
/// name, carried as error.data.name; see error_table().
enum class Errc {
  parse_error,           ///< -32700 ftp.ParseError: a line is not valid JSON
  invalid_request,       ///< -32600 ftp.InvalidRequest: valid JSON, not a JSON-RPC 2.0 request
  no_such_method,        ///< -32601 ftp.NoSuchMethod
  invalid_params,        ///< -32602 ftp.InvalidParams: a parameter missing or of the wrong type
  internal,              ///< -32603 ftp.Internal: the server failed while handling the call
  message_too_large,     ///< -32001 ftp.MessageTooLarge: a line over the message limit
  too_many_connections,  ///< -32002 ftp.TooManyConnections
  idle_timeout,          ///< -32003 ftp.IdleTimeout
  shutting_down,         ///< -32004 ftp.ShuttingDown: the daemon is stopping
  timeout,               ///< -32005 ftp.Timeout: client side, no response in time
  disconnected,          ///< -32006 ftp.Disconnected: client side, connection lost
};

/// One row of the error table.
struct ErrorInfo {
  Errc errc;
  int code;               ///< JSON-RPC error.code
  std::string_view name;  ///< qualified name, error.data.name
  Exit exit;              ///< exit code a tool reports for it
  std::string_view summary;
};

/// Every error of the protocol, in code order of the man page.
const std::vector<ErrorInfo>& error_table();
const ErrorInfo& error_info(Errc errc);
/// The row with this name, or nullptr (names added by later methods).
const ErrorInfo* find_error(std::string_view name);

/// An error response of the protocol, thrown by the client (and which a
/// method handler may throw to answer with it). what() is "<name>: <message>".
class RpcError : public Error {
 public:
  RpcError(int code, std::string name, std::string message, Json data = nullptr, Exit exit = Exit::failure);
  RpcError(Errc errc, std::string message, Json data = nullptr);

  int code() const noexcept { return code_; }
  const std::string& name() const noexcept { return name_; }
  /// The message without the name.
  const std::string& message() const noexcept { return message_; }
  /// error.data without its "name" member (null when nothing else).
  const Json& data() const noexcept { return data_; }

  /// Builds the error from a response's "error" object.
  static RpcError from_json(const Json& error);

 private:
  int code_;
  std::string name_;
  std::string message_;
  Json data_;
};

/// Builds a JSON-RPC error object: {"code", "message", "data": {"name", ...}}.
/// An object `data` is merged into data; any other non-null value goes to data.detail.
Json error_object(int code, std::string_view name, std::string_view message, const Json& data = nullptr);
Json error_object(Errc errc, std::string_view message, const Json& data = nullptr);

/// Credentials of the peer process, read with SO_PEERCRED on accept.
struct Peer {
  std::int64_t pid = -1;
  std::int64_t uid = -1;
  std::int64_t gid = -1;
};

enum class LogLevel { debug, info, warning, error };
std::string_view to_string(LogLevel level) noexcept;
/// Library code never prints; it hands log lines to such a callback.
/// Called from the server's loop thread.
using LogFn = std::function<void(LogLevel, std::string_view)>;

/// $FTP_SOCKET, else $XDG_RUNTIME_DIR/flextp/control.sock, else
/// /run/flextp/control.sock.
std::string default_socket_path();

}  // namespace ftp::ipc
