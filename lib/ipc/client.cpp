// SPDX-License-Identifier: Apache-2.0
#include "ipc/client.hpp"

#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace ftp::ipc {

namespace {

using Clock = std::chrono::steady_clock;

bool is_connection_error(const Json& msg) {
  // Errors the server sends with id null before it closes the connection.
  auto id = msg.find("id");
  return msg.contains("error") && id != msg.end() && id->is_null();
}

std::string user_name(uid_t uid) {
  passwd pw{}, *found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found) return found->pw_name;
  return "no user name";
}

}  // namespace

void check_server_credentials(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error("control socket " + path + ": cannot read the server's credentials (SO_PEERCRED): " +
                    std::strerror(err),
                Exit::unreachable);
  }
  if (cred.uid == 0 || cred.uid == ::geteuid() || cred.uid == ::getuid()) return;
  ::close(fd);
  throw Error("control socket " + path + ": served by uid " + std::to_string(cred.uid) + " (" +
                  user_name(cred.uid) + "), pid " + std::to_string(cred.pid) + ", not by root or this user (uid " +
                  std::to_string(::geteuid()) + ", " + user_name(::geteuid()) +
                  "): refused (another user may have taken the socket's path)",
              Exit::unreachable);
}

Client::Client(std::string path) : path_(std::move(path)) { connect(); }

Client::~Client() { close(); }

void Client::connect() {
  close();
  sockaddr_un addr{};
  if (path_.empty() || path_.size() >= sizeof(addr.sun_path))
    throw Error("control socket path '" + path_ + "': must be 1 to " + std::to_string(sizeof(addr.sun_path) - 1) +
                    " bytes",
                Exit::unreachable);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("control socket " + path_ + ": socket(): " + std::strerror(errno), Exit::unreachable);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    throw Error("cannot connect to control socket " + path_ + ": " + std::strerror(err) +
                    " (is ftp-serve running? the path comes from --socket, $FTP_SOCKET or $XDG_RUNTIME_DIR)",
                Exit::unreachable);
  }
  check_server_credentials(fd, path_);
  fd_ = fd;
  buf_.clear();
  scan_ = 0;
}

void Client::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
  scan_ = 0;
}

void Client::lost(const std::string& why) {
  close();
  throw RpcError(Errc::disconnected, "control socket " + path_ + ": " + why);
}

void Client::send_raw(std::string_view bytes) {
  if (fd_ < 0) connect();
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Not lost() yet: the daemon may have said why before closing.
      throw RpcError(Errc::disconnected, "control socket " + path_ + ": send: " + std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::int64_t Client::send_request(std::string_view method, Json params) {
  std::int64_t id = next_id_++;
  Json req = Json::object();
  req["jsonrpc"] = "2.0";
  req["id"] = id;
  req["method"] = method;
  if (!params.is_null()) req["params"] = std::move(params);
  std::string line = req.dump(-1, ' ', false, Json::error_handler_t::replace);
  line += '\n';
  if (line.size() - 1 > kMaxMessageBytes)
    throw RpcError(Errc::message_too_large, "request of " + std::to_string(line.size() - 1) +
                                                " bytes is over the limit of " + std::to_string(kMaxMessageBytes));
  send_raw(line);
  return id;
}

std::optional<std::string> Client::read_line(std::optional<Clock::time_point> deadline) {
  if (fd_ < 0) return std::nullopt;
  char tmp[64 * 1024];
  for (;;) {
    std::size_t nl = buf_.find('\n', scan_);
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      scan_ = 0;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return line;
    }
    scan_ = buf_.size();
    if (buf_.size() > kMaxMessageBytes) lost("message from the daemon over the limit");
    int wait_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      wait_ms = left < 0 ? 0 : static_cast<int>(std::min<long long>(left + 1, 1 << 30));
    }
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      lost(std::string("poll: ") + std::strerror(errno));
    }
    if (rc == 0) {
      if (deadline && Clock::now() >= *deadline) throw RpcError(Errc::timeout, "no message from the daemon in time");
      continue;
    }
    ssize_t n = ::read(fd_, tmp, sizeof(tmp));
    if (n > 0) {
      buf_.append(tmp, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != ECONNRESET && errno != EPIPE) lost(std::string("read: ") + std::strerror(errno));
    return std::nullopt;  // end of stream
  }
}

std::optional<Json> Client::read_message(std::optional<std::chrono::milliseconds> timeout) {
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = Clock::now() + *timeout;
  auto line = read_line(deadline);
  if (!line) return std::nullopt;
  try {
    return json::parse_line(*line);
  } catch (const json::ParseError& e) {  // syntax, a number past a double, a limit
    lost(std::string("message from the daemon: ") + e.what());
  }
}

std::optional<Json> Client::stream(std::string_view method, Json params, const OnItem& on_item,
                                   std::optional<std::chrono::milliseconds> idle) {
  std::optional<RpcError> send_error;
  std::int64_t id = 0;
  try {
    id = send_request(method, std::move(params));
  } catch (const RpcError& e) {
    if (e.name() != error_info(Errc::disconnected).name) throw;
    send_error = e;
  }
  for (;;) {
    std::optional<Json> msg;
    try {
      msg = read_message(idle);
    } catch (const RpcError& e) {
      if (e.name() == error_info(Errc::timeout).name) close();
      throw;
    }
    if (!msg) {
      if (send_error) {
        close();
        throw *send_error;
      }
      lost("connection closed by the daemon before the response to " + std::string(method));
    }
    if (!msg->is_object()) continue;
    if (auto m = msg->find("method"); m != msg->end()) {
      const Json& p = (*msg)["params"];
      if (on_item && *m == kStreamNotification && p.is_object() && p.contains("id") && p["id"] == id) {
        if (!on_item(p.contains("data") ? p["data"] : Json())) {
          close();
          return std::nullopt;
        }
      }
      continue;
    }
    if (!msg->contains("id")) continue;
    const Json& rid = (*msg)["id"];
    if (rid == id || is_connection_error(*msg)) {
      if (auto e = msg->find("error"); e != msg->end()) {
        RpcError err = RpcError::from_json(*e);
        if (rid != id) close();  // the server closes after such an error
        throw err;
      }
      return msg->contains("result") ? (*msg)["result"] : Json();
    }
  }
}

Json Client::call(std::string_view method, Json params, std::chrono::milliseconds timeout) {
  auto result = stream(method, std::move(params), nullptr, timeout);
  return result ? std::move(*result) : Json();
}

}  // namespace ftp::ipc
