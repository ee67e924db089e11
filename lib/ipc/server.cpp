// SPDX-License-Identifier: Apache-2.0
#include "ipc/server.hpp"

#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "core/escape.hpp"

namespace ftp::ipc {

namespace detail {

/// What Call objects share with the server. It outlives the server while a
/// call is kept somewhere, so that a late answer from a worker thread finds
/// `open == false` and is dropped instead of touching a dead loop.
struct Core {
  struct Out {
    std::uint64_t conn;
    std::uint64_t seq;
    std::string line;  ///< with its '\n'; empty for "no bytes, just finish"
    bool final;
  };

  std::mutex mu;
  bool open = false;      ///< accepting messages from calls
  bool stopping = false;  ///< stop() asked
  std::vector<Out> outbox;
  uv_async_t* async = nullptr;
  Server::Impl* impl = nullptr;
  std::thread::id loop_thread;

  void send(std::uint64_t conn, std::uint64_t seq, std::string line, bool final);

  /// Marks a call answered; false when it already was.
  static bool claim(Call& c) { return !c.done_.exchange(true); }
  static void cancel(Call& c) { c.cancel(); }
};

}  // namespace detail

namespace {

std::string dump_line(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

/// An answer to the request whose id is `id_text` (its JSON text, as the
/// request wrote it): {"jsonrpc":"2.0","id":...,"result"|"error":...}.
std::string answer_line(const std::string& id_text, std::string_view member, const Json& value) {
  std::string s = "{\"jsonrpc\":\"2.0\",\"id\":";
  s += id_text;
  s += ",\"";
  s += member;
  s += "\":";
  s += dump_line(value);
  s += "}\n";
  return s;
}

std::string response_line(const std::string& id_text, const Json& result) {
  return answer_line(id_text, "result", result);
}

std::string error_text_line(const std::string& id_text, const Json& error) {
  return answer_line(id_text, "error", error);
}

std::string error_line(const Json& id, const Json& error) { return error_text_line(dump_line(id), error); }

bool type_ok(const std::string& type, const Json& v) {
  if (type == "string") return v.is_string();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d;
    }
    return false;
  }
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return true;  // "any"
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

// ---------------------------------------------------------------- Call

Call::Call(std::shared_ptr<detail::Core> core, std::uint64_t conn, std::uint64_t seq, Json id, bool has_id,
           std::string method, Json params, Peer peer, std::string id_text)
    : core_(std::move(core)),
      conn_(conn),
      seq_(seq),
      id_(std::move(id)),
      id_text_(id_text.empty() ? dump_line(id_) : std::move(id_text)),
      has_id_(has_id),
      method_(std::move(method)),
      params_(std::move(params)),
      peer_(peer) {}

bool Call::finish(std::string line) {
  if (done_.exchange(true)) return false;
  if (!has_id_) return false;
  core_->send(conn_, seq_, std::move(line), true);
  return true;
}

void Call::reply(Json result) {
  if (done_.load()) return;
  finish(response_line(id_text_, result));
}

void Call::end(Json result) {
  if (result.is_null()) result = Json{{"end", true}};
  reply(std::move(result));
}

void Call::error(Errc errc, std::string_view message, const Json& data) {
  if (done_.load()) return;
  finish(error_text_line(id_text_, error_object(errc, message, data)));
}

void Call::error(int code, std::string_view name, std::string_view message, const Json& data) {
  if (done_.load()) return;
  finish(error_text_line(id_text_, error_object(code, name, message, data)));
}

bool Call::notify(Json data) {
  if (!has_id_ || done_.load()) return false;
  std::string s = "{\"jsonrpc\":\"2.0\",\"method\":" + dump_line(Json(kStreamNotification)) + ",\"params\":{\"id\":" +
                  id_text_ + ",\"method\":" + dump_line(Json(method_)) + ",\"data\":" + dump_line(data) + "}}\n";
  core_->send(conn_, seq_, std::move(s), false);
  return true;
}

void Call::on_cancel(std::function<void()> fn) {
  std::unique_lock lk(cancel_mu_);
  if (cancelled_.load()) {
    lk.unlock();
    if (fn) fn();
    return;
  }
  on_cancel_ = std::move(fn);
}

void Call::cancel() {
  std::function<void()> fn;
  {
    std::lock_guard lk(cancel_mu_);
    if (cancelled_.exchange(true)) return;
    done_.store(true);
    fn = std::move(on_cancel_);
  }
  if (fn) fn();
}

// ---------------------------------------------------------------- Impl

struct Conn {
  Server::Impl* impl = nullptr;
  std::uint64_t id = 0;
  uv_pipe_t pipe{};
  uv_timer_t idle{};
  Peer peer;
  std::string inbuf;
  std::size_t scan = 0;  ///< inbuf before this has no '\n'
  std::unordered_map<std::uint64_t, std::shared_ptr<Call>> pending;
  bool counted = false;  ///< counts against max_connections
  bool closing = false;
  bool handles_closing = false;
  bool read_eof = false;
  bool cut_for_quota = false;  ///< closed for not reading its answers
  int open_handles = 2;
};

struct WriteReq {
  uv_write_t req;
  std::string data;
};

struct Server::Impl {
  ServerOptions opt;
  std::vector<Method> methods;
  std::unordered_map<std::string, std::size_t> by_name;
  std::shared_ptr<detail::Core> core = std::make_shared<detail::Core>();

  uv_loop_t loop{};
  uv_pipe_t listener{};
  uv_async_t async{};
  uv_timer_t grace{};
  std::thread thread;
  bool started = false;
  bool stopped = false;
  bool shutdown_started = false;
  ino_t socket_ino = 0;
  dev_t socket_dev = 0;

  std::unordered_map<std::uint64_t, Conn*> conns;
  std::uint64_t next_conn = 1;
  std::uint64_t next_seq = 1;
  std::atomic<std::size_t> active{0};
  std::atomic<std::size_t> queued{0};  ///< bytes in uv_write requests not yet done
  char readbuf[64 * 1024];

  Json introspect() const;

  void log(LogLevel level, const std::string& line) const {
    if (opt.log) opt.log(level, line);
  }

  // ---- socket file

  /// Refuses a socket directory where another user could replace the socket
  /// with one of their own (and so answer the tools in the daemon's name):
  /// one owned by another user than this process's or root, or one that
  /// others may write to without the sticky bit (which /tmp has).
  static void check_socket_directory(const std::string& path) {
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    struct stat ds {};
    if (::stat(dir.c_str(), &ds) != 0)
      throw Error("control socket " + path + ": cannot read directory " + dir + ": " + errno_text(errno));
    if (ds.st_uid != ::geteuid() && ds.st_uid != 0)
      throw Error("control socket " + path + ": directory " + dir + " belongs to uid " + std::to_string(ds.st_uid) +
                  ", not to this daemon (uid " + std::to_string(::geteuid()) +
                  ") or root: its owner could replace the socket");
    if ((ds.st_mode & S_IWOTH) && !(ds.st_mode & S_ISVTX)) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(ds.st_mode & 07777));
      throw Error("control socket " + path + ": directory " + dir + " (mode " + mode +
                  ") is writable by every user without the sticky bit: any of them could replace the socket");
    }
  }

  void create_socket(int& fd_out) {
    const std::string& path = opt.socket_path;
    sockaddr_un addr{};
    if (path.empty() || path.size() >= sizeof(addr.sun_path))
      throw Error("control socket path '" + path + "': must be 1 to " + std::to_string(sizeof(addr.sun_path) - 1) +
                  " bytes");
    if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
      std::string dir = path.substr(0, slash);
      struct stat ds {};
      if (::stat(dir.c_str(), &ds) != 0) {
        if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST)
          throw Error("control socket " + path + ": cannot create directory " + dir + ": " + errno_text(errno));
      }
    }
    check_socket_directory(path);

    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) throw Error("control socket " + path + ": exists and is not a socket");
      int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (probe < 0) throw Error("control socket " + path + ": socket(): " + errno_text(errno));
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
      int rc = ::connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      int err = errno;
      ::close(probe);
      if (rc == 0) throw Error("control socket " + path + ": in use by a running daemon");
      if (err != ECONNREFUSED && err != ENOENT)
        throw Error("control socket " + path + ": cannot probe existing socket: " + errno_text(err));
      if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        throw Error("control socket " + path + ": cannot remove stale socket: " + errno_text(errno));
      log(LogLevel::info, "removed stale control socket " + path);
    }

    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw Error("control socket " + path + ": socket(): " + errno_text(errno));
    // Bind to a private name, set the mode, then rename into place, so that
    // the socket is never reachable with a wider mode than asked.
    std::string tmp = path + ".~" + std::to_string(::getpid());
    bool via_tmp = tmp.size() < sizeof(addr.sun_path);
    const std::string& bind_path = via_tmp ? tmp : path;
    if (via_tmp) ::unlink(tmp.c_str());
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, bind_path.c_str(), bind_path.size() + 1);
    auto fail = [&](const std::string& what) {
      int err = errno;
      ::close(fd);
      if (via_tmp) ::unlink(tmp.c_str());
      throw Error("control socket " + path + ": " + what + ": " + errno_text(err));
    };
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) fail("bind()");
    if (::chmod(bind_path.c_str(), static_cast<mode_t>(opt.socket_mode)) != 0) fail("chmod()");
    if (::listen(fd, 256) != 0) fail("listen()");
    if (via_tmp && ::rename(tmp.c_str(), path.c_str()) != 0) fail("rename()");
    if (::stat(path.c_str(), &st) == 0) {
      socket_ino = st.st_ino;
      socket_dev = st.st_dev;
    }
    fd_out = fd;
  }

  void remove_socket() const {
    struct stat st {};
    // Only our own file: a second daemon may have replaced it meanwhile.
    if (::lstat(opt.socket_path.c_str(), &st) == 0 && st.st_ino == socket_ino && st.st_dev == socket_dev)
      ::unlink(opt.socket_path.c_str());
  }

  // ---- connections

  static void on_connection(uv_stream_t* server, int status) {
    auto* self = static_cast<Impl*>(server->data);
    if (status < 0) {
      self->log(LogLevel::warning, std::string("accept failed: ") + uv_strerror(status));
      return;
    }
    auto* c = new Conn;
    c->impl = self;
    c->id = self->next_conn++;
    uv_pipe_init(&self->loop, &c->pipe, 0);
    uv_timer_init(&self->loop, &c->idle);
    c->pipe.data = c;
    c->idle.data = c;
    self->conns[c->id] = c;
    if (int rc = uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->pipe)); rc != 0) {
      self->log(LogLevel::warning, std::string("accept failed: ") + uv_strerror(rc));
      c->closing = true;
      self->close_handles(c);
      return;
    }
    uv_os_fd_t fd = -1;
    uv_fileno(reinterpret_cast<uv_handle_t*>(&c->pipe), &fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      c->peer.pid = cred.pid;
      c->peer.uid = cred.uid;
      c->peer.gid = cred.gid;
    }
    std::string who = "conn=" + std::to_string(c->id) + " pid=" + std::to_string(c->peer.pid) +
                      " uid=" + std::to_string(c->peer.uid) + " gid=" + std::to_string(c->peer.gid);
    if (self->shutdown_started || self->active.load() >= self->opt.max_connections) {
      bool stopping = self->shutdown_started;
      self->log(LogLevel::warning, "client refused (" +
                                       std::string(stopping ? "shutting down" : "too many connections") +
                                       "): " + who);
      self->write_line(c, error_line(nullptr, stopping ? error_object(Errc::shutting_down, "the daemon is stopping")
                                                       : error_object(Errc::too_many_connections,
                                                                      "the daemon serves its maximum of " +
                                                                          std::to_string(self->opt.max_connections) +
                                                                          " connections",
                                                                      Json{{"max_connections",
                                                                            self->opt.max_connections}})));
      self->begin_close(c, false);
      return;
    }
    c->counted = true;
    self->active.fetch_add(1);
    self->log(LogLevel::info, "client connected: " + who);
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->pipe), on_alloc, on_read);
    self->touch(c);
  }

  void touch(Conn* c) {
    if (opt.idle_timeout.count() > 0 && !c->closing)
      uv_timer_start(&c->idle, on_idle, static_cast<std::uint64_t>(opt.idle_timeout.count()), 0);
  }

  static void on_idle(uv_timer_t* t) {
    auto* c = static_cast<Conn*>(t->data);
    Impl* self = c->impl;
    if (c->closing) return;
    if (!c->pending.empty()) {  // a call or a stream in progress: not idle
      self->touch(c);
      return;
    }
    self->log(LogLevel::info, "conn=" + std::to_string(c->id) + ": idle timeout, closing");
    self->write_line(c, error_line(nullptr, error_object(Errc::idle_timeout,
                                                         "connection idle for " +
                                                             std::to_string(self->opt.idle_timeout.count()) +
                                                             " ms",
                                                         Json{{"idle_timeout_ms", self->opt.idle_timeout.count()}})));
    self->begin_close(c, false);
  }

  static void on_alloc(uv_handle_t* h, std::size_t, uv_buf_t* buf) {
    auto* c = static_cast<Conn*>(h->data);
    // One buffer for the whole loop: on_read copies out before returning.
    *buf = uv_buf_init(c->impl->readbuf, sizeof(c->impl->readbuf));
  }

  static void on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
    auto* c = static_cast<Conn*>(s->data);
    Impl* self = c->impl;
    if (nread == 0 || c->closing) return;
    if (nread < 0) {
      if (nread != UV_EOF)
        self->log(LogLevel::info, "conn=" + std::to_string(c->id) + ": read error: " + uv_strerror(int(nread)));
      if (!c->inbuf.empty())
        self->log(LogLevel::info, "conn=" + std::to_string(c->id) + ": client closed mid-message, " +
                                      std::to_string(c->inbuf.size()) + " bytes dropped");
      c->inbuf.clear();
      c->read_eof = true;
      uv_read_stop(s);
      // A half-closed client (shutdown(SHUT_WR)) still waits for its answers;
      // a client that is gone (POLLHUP) cancels its calls and streams.
      if (c->pending.empty() || nread != UV_EOF || self->peer_gone(c)) {
        self->log(LogLevel::debug, "conn=" + std::to_string(c->id) + ": client disconnected");
        self->begin_close(c, true);
      }
      return;
    }
    self->touch(c);
    c->inbuf.append(buf->base, static_cast<std::size_t>(nread));
    std::size_t start = 0;
    const std::size_t max = self->opt.max_message_bytes;
    while (!c->closing) {
      std::size_t nl = c->inbuf.find('\n', c->scan);
      if (nl == std::string::npos) {
        c->scan = c->inbuf.size();
        break;
      }
      std::size_t len = nl - start;
      if (len > max) {
        self->too_large(c, len);
        return;
      }
      self->handle_line(c, std::string_view(c->inbuf.data() + start, len));
      start = nl + 1;
      c->scan = start;
    }
    if (c->closing) return;
    c->inbuf.erase(0, start);
    c->scan -= start;
    if (c->inbuf.size() > max) self->too_large(c, c->inbuf.size());
  }

  bool peer_gone(Conn* c) {
    uv_os_fd_t fd = -1;
    if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c->pipe), &fd) != 0) return true;
    pollfd p{fd, POLLOUT, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR));
  }

  void too_large(Conn* c, std::size_t len) {
    log(LogLevel::warning, "conn=" + std::to_string(c->id) + ": message of " + (len > opt.max_message_bytes ? "over " : "") +
                               std::to_string(len) + " bytes over the limit of " +
                               std::to_string(opt.max_message_bytes) + ", closing");
    c->inbuf.clear();
    c->inbuf.shrink_to_fit();
    write_line(c, error_line(nullptr, error_object(Errc::message_too_large,
                                                   "message over the limit of " +
                                                       std::to_string(opt.max_message_bytes) + " bytes",
                                                   Json{{"max_message_bytes", opt.max_message_bytes}})));
    begin_close(c, false);
  }

  /// Answers a request that does not reach a method; `id_text` as the request wrote its id.
  void reject(Conn* c, const std::string& id_text, Errc errc, const std::string& message, const Json& data = nullptr) {
    // The message may quote the client (a method's name): one line, whatever it sent.
    log(LogLevel::debug, "conn=" + std::to_string(c->id) + ": " + std::string(error_info(errc).name) + ": " +
                             printable(message, 400));
    write_line(c, error_text_line(id_text, error_object(errc, message, data)));
  }

  void handle_line(Conn* c, std::string_view text) {
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.find_first_not_of(" \t\r") == std::string_view::npos) return;  // blank line
    Json msg;
    try {
      // Within json::Limits, checked as it reads: linear in the line.
      msg = json::parse_line(text);
    } catch (const json::ParseError& e) {
      // A syntax error, a number past a double, or a limit passed. Nothing
      // may escape into the event loop's callback: it would end the process.
      Json data = Json::object();
      if (e.byte() > 0) data["byte"] = e.byte();
      if (!e.limit().empty()) data["limit"] = e.limit();
      reject(c, "null", Errc::parse_error, e.what(), data.empty() ? Json(nullptr) : data);
      return;
    }
    if (msg.is_array()) {
      reject(c, "null", Errc::invalid_request, "batch requests are not supported: send one request per line");
      return;
    }
    if (!msg.is_object()) {
      reject(c, "null", Errc::invalid_request, "a request must be a JSON object");
      return;
    }
    Json id = nullptr;
    std::string id_text;
    bool has_id = false;
    if (auto it = msg.find("id"); it != msg.end()) {
      if (!it->is_string() && !it->is_number() && !it->is_null()) {
        reject(c, "null", Errc::invalid_request, "id must be a string, a number or null");
        return;
      }
      id = *it;
      has_id = true;
      // A number a double cannot hold (30 digits) is answered as written.
      if (id.is_number_float()) id_text = json::member_number_text(text, "id").value_or(std::string());
    }
    if (id_text.empty()) id_text = dump_line(id);
    auto v = msg.find("jsonrpc");
    if (v == msg.end() || !v->is_string() || *v != "2.0") {
      reject(c, id_text, Errc::invalid_request, "jsonrpc must be \"2.0\"");
      return;
    }
    auto m = msg.find("method");
    if (m == msg.end() || !m->is_string()) {
      reject(c, id_text, Errc::invalid_request, "method must be a string");
      return;
    }
    std::string name = m->get<std::string>();
    Json params = Json::object();
    if (auto p = msg.find("params"); p != msg.end() && !p->is_null()) {
      if (p->is_array()) {
        if (has_id) reject(c, id_text, Errc::invalid_params, "params must be an object (named parameters)");
        return;
      }
      if (!p->is_object()) {
        if (has_id) reject(c, id_text, Errc::invalid_request, "params must be an object");
        return;
      }
      params = std::move(*p);
    }
    auto found = by_name.find(name);
    if (found == by_name.end()) {
      if (has_id) reject(c, id_text, Errc::no_such_method, "no such method: " + name, Json{{"method", name}});
      return;
    }
    const Method& method = methods[found->second];
    for (const Param& prm : method.params) {
      auto it = params.find(prm.name);
      if (it == params.end() || it->is_null()) {
        if (prm.required) {
          if (has_id)
            reject(c, id_text, Errc::invalid_params, name + ": missing required parameter \"" + prm.name + "\"",
                   Json{{"param", prm.name}});
          return;
        }
        continue;
      }
      if (!type_ok(prm.type, *it)) {
        if (has_id)
          reject(c, id_text, Errc::invalid_params,
                 name + ": parameter \"" + prm.name + "\" must be " + (prm.type == "integer" ? "an " : "a ") +
                     prm.type + ", got " + it->type_name(),
                 Json{{"param", prm.name}});
        return;
      }
    }

    std::uint64_t seq = next_seq++;
    auto call = std::make_shared<Call>(core, c->id, seq, id, has_id, name, std::move(params), c->peer, id_text);
    if (has_id) c->pending.emplace(seq, call);
    try {
      method.handler(*call);
    } catch (const RpcError& e) {
      call->error(e.code(), e.name(), e.message(), e.data());
    } catch (const InputError& e) {
      call->error(Errc::invalid_params, e.what());
    } catch (const std::exception& e) {
      log(LogLevel::error, "method " + printable(name) + " failed: " + printable(e.what(), 400));
      call->error(Errc::internal, std::string("method ") + name + " failed: " + e.what());
    }
    // Only our two references left and no answer: nobody will ever answer.
    if (has_id && !call->done() && call.use_count() <= 2) {
      log(LogLevel::error, "method " + printable(name) + " returned without answering");
      call->error(Errc::internal, "method " + name + " returned without answering");
    }
  }

  void write_line(Conn* c, std::string line) {
    if (c->handles_closing) return;
    auto* s = reinterpret_cast<uv_stream_t*>(&c->pipe);
    const std::size_t unread = uv_stream_get_write_queue_size(s);
    if (unread == 0) {
      uv_buf_t b = uv_buf_init(line.data(), static_cast<unsigned>(line.size()));
      int n = uv_try_write(s, &b, 1);
      if (n == static_cast<int>(line.size())) return;
      if (n > 0) {
        line.erase(0, static_cast<std::size_t>(n));
      } else if (n != UV_EAGAIN) {
        log(LogLevel::debug, "conn=" + std::to_string(c->id) + ": write failed: " + uv_strerror(n));
        begin_close(c, true);
        return;
      }
    } else if (unread > opt.max_queued_bytes) {
      // The output quota: a client that sends calls (or holds a stream)
      // and does not read must not grow our memory. Cut, and free what it held.
      log(LogLevel::warning, "conn=" + std::to_string(c->id) + ": client does not read, " + std::to_string(unread) +
                                 " bytes queued, over the quota of " + std::to_string(opt.max_queued_bytes) +
                                 ", closing");
      c->cut_for_quota = true;
      begin_close(c, true);
      return;
    }
    auto* w = new WriteReq;
    w->data = std::move(line);
    w->req.data = c;
    uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    if (int rc = uv_write(&w->req, s, &b, 1, on_write); rc != 0) {
      delete w;
      begin_close(c, true);
      return;
    }
    queued.fetch_add(w->data.size());
  }

  static void on_write(uv_write_t* req, int status) {
    auto* w = reinterpret_cast<WriteReq*>(req);
    auto* c = static_cast<Conn*>(req->data);
    c->impl->queued.fetch_sub(w->data.size());
    delete w;
    if (status < 0 && status != UV_ECANCELED) {
      c->impl->log(LogLevel::debug, "conn=" + std::to_string(c->id) + ": write failed: " + uv_strerror(status));
      c->impl->begin_close(c, true);
    }
  }

  /// Ends a connection: no more reads, its calls cancelled; with flush,
  /// queued writes go out first (uv_shutdown), else it is closed at once.
  void begin_close(Conn* c, bool hard) {
    if (!c->closing) {
      c->closing = true;
      if (c->counted) active.fetch_sub(1);
      uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->pipe));
      uv_timer_stop(&c->idle);
      auto pending = std::move(c->pending);
      c->pending.clear();
      for (auto& [seq, call] : pending) detail::Core::cancel(*call);
    }
    if (c->handles_closing) return;
    if (!hard) {
      auto* req = new uv_shutdown_t;
      req->data = c;
      if (uv_shutdown(req, reinterpret_cast<uv_stream_t*>(&c->pipe), on_shutdown) == 0) {
        // The shutdown completes once the queued writes are out: a client
        // that never reads would hold its socket and those bytes for ever,
        // outside the connection limit. It gets shutdown_grace, then is cut.
        uv_timer_start(&c->idle, on_close_grace, static_cast<std::uint64_t>(opt.shutdown_grace.count()), 0);
        return;
      }
      delete req;
    }
    close_handles(c);
  }

  static void on_close_grace(uv_timer_t* t) {
    auto* c = static_cast<Conn*>(t->data);
    c->impl->log(LogLevel::debug, "conn=" + std::to_string(c->id) + ": closing without its last messages (not read)");
    c->impl->close_handles(c);
  }

  static void on_shutdown(uv_shutdown_t* req, int) {
    auto* c = static_cast<Conn*>(req->data);
    delete req;
    c->impl->close_handles(c);
  }

  void close_handles(Conn* c) {
    if (c->handles_closing) return;
    c->handles_closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->pipe), on_conn_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->idle), on_conn_closed);
  }

  static void on_conn_closed(uv_handle_t* h) {
    auto* c = static_cast<Conn*>(h->data);
    if (--c->open_handles > 0) return;
    c->impl->log(LogLevel::debug, "conn=" + std::to_string(c->id) + ": closed");
    c->impl->conns.erase(c->id);
    const bool trim = c->cut_for_quota;
    delete c;
    // Its queued answers were freed; give the pages back too.
    if (trim) ::malloc_trim(0);
  }

  // ---- messages from calls

  void deliver(std::uint64_t conn, std::uint64_t seq, std::string& line, bool final) {
    auto it = conns.find(conn);
    if (it == conns.end()) return;
    Conn* c = it->second;
    if (c->closing) return;
    if (!line.empty()) write_line(c, std::move(line));
    if (c->closing) return;
    touch(c);
    if (final) {
      c->pending.erase(seq);
      if (c->read_eof && c->pending.empty()) begin_close(c, false);
    }
  }

  void drain() {
    std::vector<detail::Core::Out> out;
    {
      std::lock_guard lk(core->mu);
      out.swap(core->outbox);
    }
    for (auto& o : out) deliver(o.conn, o.seq, o.line, o.final);
  }

  static void on_async(uv_async_t* a) {
    auto* self = static_cast<Impl*>(a->data);
    self->drain();
    bool stopping;
    {
      std::lock_guard lk(self->core->mu);
      stopping = self->core->stopping;
    }
    if (stopping && !self->shutdown_started) self->shutdown();
  }

  void shutdown() {
    shutdown_started = true;
    log(LogLevel::info, "shutting down: " + std::to_string(active.load()) + " connection(s) open");
    uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
    {
      std::lock_guard lk(core->mu);
      core->open = false;
    }
    drain();
    std::vector<Conn*> all;
    for (auto& [id, c] : conns) all.push_back(c);
    for (Conn* c : all) {
      if (c->closing) continue;
      bool any = false;
      for (auto& [seq, call] : c->pending) {
        if (!detail::Core::claim(*call)) continue;
        any = true;
        write_line(c, error_text_line(call->id_text(), error_object(Errc::shutting_down, "the daemon is stopping")));
      }
      if (!any) write_line(c, error_line(nullptr, error_object(Errc::shutting_down, "the daemon is stopping")));
      begin_close(c, false);
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&async), nullptr);
    // Clients that do not read get shutdown_grace to do so, then are cut.
    uv_timer_start(&grace, on_grace, static_cast<std::uint64_t>(opt.shutdown_grace.count()), 0);
    uv_unref(reinterpret_cast<uv_handle_t*>(&grace));
  }

  static void on_grace(uv_timer_t* t) {
    auto* self = static_cast<Impl*>(t->data);
    std::vector<Conn*> all;
    for (auto& [id, c] : self->conns) all.push_back(c);
    for (Conn* c : all) self->close_handles(c);
  }

  void run() {
    {
      std::lock_guard lk(core->mu);
      core->loop_thread = std::this_thread::get_id();
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_walk(
        &loop,
        [](uv_handle_t* h, void*) {
          // Handles of a connection carry its Conn; the server's own carry the Impl.
          if (!uv_is_closing(h)) uv_close(h, h->data && h->data != h->loop->data ? on_conn_closed : nullptr);
        },
        nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
  }
};

void detail::Core::send(std::uint64_t conn, std::uint64_t seq, std::string line, bool final) {
  std::unique_lock lk(mu);
  if (!open) return;
  if (std::this_thread::get_id() == loop_thread) {
    Server::Impl* i = impl;
    if (outbox.empty()) {
      lk.unlock();
      i->deliver(conn, seq, line, final);
      return;
    }
    outbox.push_back({conn, seq, std::move(line), final});
    lk.unlock();
    i->drain();
    return;
  }
  bool wake = outbox.empty();
  outbox.push_back({conn, seq, std::move(line), final});
  if (wake) uv_async_send(async);
}

// ---------------------------------------------------------------- Server

Server::Server(ServerOptions options, std::vector<Method> methods) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  if (impl_->opt.socket_path.empty()) impl_->opt.socket_path = default_socket_path();
  if (impl_->opt.max_connections == 0) impl_->opt.max_connections = 1;
  Impl* impl = impl_.get();
  impl_->methods.push_back(Method{
      "introspect",
      "list the methods with their parameters, the limits, the errors and the protocol version",
      {},
      "{kind, protocol, limits, methods[], errors[]}",
      false,
      [impl](Call& call) { call.reply(impl->introspect()); },
  });
  for (auto& m : methods) {
    if (m.name.empty() || !m.handler) throw Error("control socket: method '" + m.name + "' needs a name and a handler");
    impl_->methods.push_back(std::move(m));
  }
  for (std::size_t i = 0; i < impl_->methods.size(); ++i) {
    if (!impl_->by_name.emplace(impl_->methods[i].name, i).second)
      throw Error("control socket: method '" + impl_->methods[i].name + "' declared twice");
  }
}

Server::~Server() {
  try {
    stop();
  } catch (...) {
  }
}

Json Server::Impl::introspect() const {
  const Impl& impl = *this;
  Json methods = Json::array();
  for (const Method& m : impl.methods) {
    Json params = Json::array();
    for (const Param& p : m.params)
      params.push_back(Json{{"name", p.name}, {"type", p.type}, {"required", p.required}, {"doc", p.doc}});
    methods.push_back(Json{{"name", m.name},
                           {"description", m.description},
                           {"params", std::move(params)},
                           {"result", m.result},
                           {"streaming", m.streaming}});
  }
  Json errors = Json::array();
  for (const ErrorInfo& e : error_table())
    errors.push_back(Json{{"code", e.code}, {"name", e.name}, {"summary", e.summary}});
  for (const auto& e : impl.opt.method_errors)
    errors.push_back(Json{{"code", e.code}, {"name", e.name}, {"summary", e.summary}});
  Json doc = Json::object();
  doc["kind"] = "ftp.introspect/v1";
  doc["protocol"] = kProtocolVersion;
  doc["limits"] = Json{{"max_message_bytes", impl.opt.max_message_bytes},
                       {"idle_timeout_ms", impl.opt.idle_timeout.count()},
                       {"max_connections", impl.opt.max_connections},
                       {"max_queued_bytes", impl.opt.max_queued_bytes},
                       {"max_depth", json::kMaxDepth},
                       {"max_keys", json::kMaxKeys},
                       {"max_values", json::kMaxValues}};
  doc["stream_notification"] = kStreamNotification;
  doc["methods"] = std::move(methods);
  doc["errors"] = std::move(errors);
  return doc;
}

Json Server::introspect() const { return impl_->introspect(); }

const std::string& Server::socket_path() const noexcept { return impl_->opt.socket_path; }

std::size_t Server::connection_count() const noexcept { return impl_->active.load(); }

std::size_t Server::queued_bytes() const noexcept { return impl_->queued.load(); }

void Server::start() {
  Impl& i = *impl_;
  if (i.started) throw Error("control socket " + i.opt.socket_path + ": server already started");
  int fd = -1;
  i.create_socket(fd);
  uv_loop_init(&i.loop);
  i.loop.data = &i;
  uv_pipe_init(&i.loop, &i.listener, 0);
  i.listener.data = &i;
  int rc = uv_pipe_open(&i.listener, fd);
  if (rc != 0) ::close(fd);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&i.listener), 256, Impl::on_connection);
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&i.listener), nullptr);
    uv_run(&i.loop, UV_RUN_DEFAULT);
    uv_loop_close(&i.loop);
    i.remove_socket();
    throw Error("control socket " + i.opt.socket_path + ": listen: " + uv_strerror(rc));
  }
  uv_async_init(&i.loop, &i.async, Impl::on_async);
  i.async.data = &i;
  uv_timer_init(&i.loop, &i.grace);
  i.grace.data = &i;
  {
    std::lock_guard lk(i.core->mu);
    i.core->open = true;
    i.core->impl = &i;
    i.core->async = &i.async;
  }
  // The loop thread takes no signals: a write to a vanished client gives
  // EPIPE instead of killing the daemon with SIGPIPE, and the daemon's
  // signal handling stays on its main thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  i.thread = std::thread([&i] { i.run(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  i.started = true;
}

void Server::stop() {
  Impl& i = *impl_;
  if (!i.started || i.stopped) return;
  if (std::this_thread::get_id() == i.thread.get_id())
    throw Error("control socket: Server::stop() called from a method handler (the loop thread)");
  i.stopped = true;
  {
    std::lock_guard lk(i.core->mu);
    i.core->stopping = true;
    uv_async_send(&i.async);
  }
  i.thread.join();
  {
    std::lock_guard lk(i.core->mu);
    i.core->open = false;
    i.core->impl = nullptr;
    i.core->async = nullptr;
  }
  uv_loop_close(&i.loop);
  i.remove_socket();
}

}  // namespace ftp::ipc
