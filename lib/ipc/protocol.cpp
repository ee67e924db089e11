// SPDX-License-Identifier: Apache-2.0
#include "ipc/protocol.hpp"

#include <cstdlib>

namespace ftp::ipc {

const std::vector<ErrorInfo>& error_table() {
  static const std::vector<ErrorInfo> table = {
      {Errc::parse_error, -32700, "ftp.ParseError", Exit::usage, "a message is not valid JSON"},
      {Errc::invalid_request, -32600, "ftp.InvalidRequest", Exit::usage,
       "a message is JSON but not a JSON-RPC 2.0 request (or is a batch)"},
      {Errc::no_such_method, -32601, "ftp.NoSuchMethod", Exit::usage, "the method does not exist"},
      {Errc::invalid_params, -32602, "ftp.InvalidParams", Exit::usage,
       "a parameter is missing, of the wrong type, or has a bad value"},
      {Errc::internal, -32603, "ftp.Internal", Exit::failure, "the daemon failed while handling the call"},
      {Errc::message_too_large, -32001, "ftp.MessageTooLarge", Exit::usage,
       "a message is over the size limit; the connection is closed"},
      {Errc::too_many_connections, -32002, "ftp.TooManyConnections", Exit::unreachable,
       "the daemon serves its maximum of connections; the connection is closed"},
      {Errc::idle_timeout, -32003, "ftp.IdleTimeout", Exit::timeout,
       "the connection was idle too long; it is closed"},
      {Errc::shutting_down, -32004, "ftp.ShuttingDown", Exit::unreachable,
       "the daemon is stopping; pending calls and streams end with it"},
      {Errc::timeout, -32005, "ftp.Timeout", Exit::timeout,
       "client side: no response within the client's timeout"},
      {Errc::disconnected, -32006, "ftp.Disconnected", Exit::unreachable,
       "client side: the connection closed before the response"},
  };
  return table;
}

const ErrorInfo& error_info(Errc errc) {
  for (const auto& e : error_table())
    if (e.errc == errc) return e;
  return error_table().at(static_cast<std::size_t>(Errc::internal));
}

const ErrorInfo* find_error(std::string_view name) {
  for (const auto& e : error_table())
    if (e.name == name) return &e;
  return nullptr;
}

RpcError::RpcError(int code, std::string name, std::string message, Json data, Exit exit)
    : Error(name + ": " + message, exit),
      code_(code),
      name_(std::move(name)),
      message_(std::move(message)),
      data_(std::move(data)) {}

RpcError::RpcError(Errc errc, std::string message, Json data)
    : RpcError(error_info(errc).code, std::string(error_info(errc).name), std::move(message), std::move(data),
               error_info(errc).exit) {}

RpcError RpcError::from_json(const Json& error) {
  int code = error_info(Errc::internal).code;
  std::string message = "malformed error object";
  std::string name = "ftp.Unknown";
  Json data = nullptr;
  if (error.is_object()) {
    if (auto it = error.find("code"); it != error.end() && it->is_number_integer()) code = it->get<int>();
    if (auto it = error.find("message"); it != error.end() && it->is_string()) message = it->get<std::string>();
    if (auto it = error.find("data"); it != error.end()) {
      if (it->is_object()) {
        data = *it;
        if (auto n = data.find("name"); n != data.end() && n->is_string()) name = n->get<std::string>();
        data.erase("name");
        if (data.empty()) data = nullptr;
      } else {
        data = *it;
      }
    }
  }
  if (name == "ftp.Unknown") {
    // A peer that does not name its errors: name standard codes ourselves.
    for (const auto& e : error_table())
      if (e.code == code) name = std::string(e.name);
  }
  const ErrorInfo* info = find_error(name);
  return RpcError(code, name, message, data, info ? info->exit : Exit::failure);
}

Json error_object(int code, std::string_view name, std::string_view message, const Json& data) {
  Json d = Json::object();
  d["name"] = name;
  if (data.is_object()) {
    for (auto it = data.begin(); it != data.end(); ++it)
      if (it.key() != "name") d[it.key()] = it.value();
  } else if (!data.is_null()) {
    d["detail"] = data;
  }
  Json e = Json::object();
  e["code"] = code;
  e["message"] = message;
  e["data"] = std::move(d);
  return e;
}

Json error_object(Errc errc, std::string_view message, const Json& data) {
  const auto& info = error_info(errc);
  return error_object(info.code, info.name, message, data);
}

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
  }
  return "?";
}

std::string default_socket_path() {
  if (const char* s = std::getenv("FTP_SOCKET"); s && *s) return s;
  if (const char* r = std::getenv("XDG_RUNTIME_DIR"); r && *r) return std::string(r) + "/flextp/control.sock";
  return "/run/flextp/control.sock";
}

}  // namespace ftp::ipc
