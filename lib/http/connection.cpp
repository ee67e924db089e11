// SPDX-License-Identifier: Apache-2.0
#include "http/connection.hpp"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <climits>

namespace ftp::http::detail {

namespace {

Connection* conn_of(http_parser* p) { return static_cast<Connection*>(p->data); }

int over(Connection* c, int status, std::string reason) {
  c->refuse = status;
  c->refuse_reason = std::move(reason);
  return -1;
}

int count_header_bytes(Connection* c, std::size_t n) {
  c->header_bytes += n;
  if (c->header_bytes > c->core.opts.limits.max_header_bytes)
    return over(c, 431, "request line and headers over " + std::to_string(c->core.opts.limits.max_header_bytes) + " bytes");
  return 0;
}

int on_message_begin(http_parser* p) {
  Connection* c = conn_of(p);
  c->req = Request{};
  c->req.peer = c->peer;
  c->in_value = false;
  c->header_bytes = 0;
  c->state = Connection::State::headers;
  c->set_timer(c->core.opts.limits.header_timeout_ms);
  return 0;
}

int on_url(http_parser* p, const char* at, std::size_t n) {
  Connection* c = conn_of(p);
  c->req.target.append(at, n);
  return count_header_bytes(c, n);
}

int on_header_field(http_parser* p, const char* at, std::size_t n) {
  Connection* c = conn_of(p);
  if (c->req.headers.empty() || c->in_value) {
    if (static_cast<int>(c->req.headers.size()) >= c->core.opts.limits.max_headers)
      return over(c, 431, "more than " + std::to_string(c->core.opts.limits.max_headers) + " header fields");
    c->req.headers.emplace_back();
    c->in_value = false;
    c->header_bytes += 4;  // ": " and CRLF
  }
  std::string& name = c->req.headers.back().name;
  for (std::size_t i = 0; i < n; ++i) name += static_cast<char>(std::tolower(static_cast<unsigned char>(at[i])));
  return count_header_bytes(c, n);
}

int on_header_value(http_parser* p, const char* at, std::size_t n) {
  Connection* c = conn_of(p);
  if (c->req.headers.empty()) return 0;
  c->in_value = true;
  c->req.headers.back().value.append(at, n);
  return count_header_bytes(c, n);
}

int on_headers_complete(http_parser* p) {
  Connection* c = conn_of(p);
  Request& r = c->req;
  r.method = http_method_str(static_cast<http_method>(p->method));
  r.version_minor = p->http_minor;
  const auto q = r.target.find('?');
  r.path = r.target.substr(0, q);
  r.query = q == std::string::npos ? "" : r.target.substr(q + 1);
  const Limits& L = c->core.opts.limits;
  // A Content-Length is known now: a body over the limit is refused before
  // a byte of it is read (the parser itself refuses a negative one: 400).
  if (p->content_length != ULLONG_MAX && p->content_length > L.max_body_bytes)
    return over(c, 413, "body of " + std::to_string(p->content_length) + " bytes over the limit of " +
                            std::to_string(L.max_body_bytes));
  if (c->core.opts.on_headers) {
    if (auto res = c->core.opts.on_headers(r)) {
      c->early = std::move(*res);
      return -1;
    }
  }
  if (const std::string* e = r.header("expect"); e && strcasecmp(e->c_str(), "100-continue") == 0 &&
                                                 r.version_minor >= 1)
    c->write("HTTP/1.1 100 Continue\r\n\r\n", nullptr);
  c->state = Connection::State::body;
  c->set_timer(L.body_timeout_ms);
  return 0;
}

int on_body(http_parser* p, const char* at, std::size_t n) {
  Connection* c = conn_of(p);
  const std::size_t limit = c->core.opts.limits.max_body_bytes;
  if (c->req.body.size() + n > limit)
    return over(c, 413, "body over the limit of " + std::to_string(limit) + " bytes");
  c->req.body.append(at, n);
  return 0;
}

int on_message_complete(http_parser* p) {
  Connection* c = conn_of(p);
  c->complete = true;
  http_parser_pause(p, 1);
  return 0;
}

const http_parser_settings& settings() {
  static const http_parser_settings s = [] {
    http_parser_settings x{};
    x.on_message_begin = on_message_begin;
    x.on_url = on_url;
    x.on_header_field = on_header_field;
    x.on_header_value = on_header_value;
    x.on_headers_complete = on_headers_complete;
    x.on_body = on_body;
    x.on_message_complete = on_message_complete;
    return x;
  }();
  return s;
}

struct WriteReq {
  uv_write_t req;
  std::string bytes;
  Connection* conn;
  std::shared_ptr<Exchange> ex;
};

void on_alloc(uv_handle_t*, std::size_t suggested, uv_buf_t* buf) {
  buf->base = new char[suggested];
  buf->len = suggested;
}

void on_read(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(s->data);
  if (n > 0) c->on_data(buf->base, static_cast<std::size_t>(n));
  delete[] buf->base;
  if (n < 0) c->close();  // EOF or an error: the client is gone
}

}  // namespace

Connection::Connection(Core& core_, std::uint64_t id_) : core(core_), id(id_) {
  http_parser_init(&parser, HTTP_REQUEST);
  parser.data = this;
  tcp.data = this;
  timer.data = this;
}

void Connection::start() {
  reading = uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp), on_alloc, on_read) == 0;
  set_timer(core.opts.limits.idle_timeout_ms);
}

void Connection::set_timer(int ms) {
  if (closed) return;
  uv_timer_stop(&timer);
  if (ms > 0)
    uv_timer_start(
        &timer, [](uv_timer_t* t) { static_cast<Connection*>(t->data)->on_timer(); }, static_cast<std::uint64_t>(ms),
        0);
}

void Connection::on_timer() {
  switch (state) {
    case State::idle:
      // A kept-alive connection with no new request; nothing of one was read.
      close();
      return;
    case State::headers:
      return refuse_now(408, "the request headers did not arrive within " +
                                 std::to_string(core.opts.limits.header_timeout_ms) + " ms");
    case State::body:
      return refuse_now(408, "the request body did not arrive within " +
                                 std::to_string(core.opts.limits.body_timeout_ms) + " ms");
    case State::answering:
      return;
    case State::closing:
      close();
      return;
  }
}

void Connection::on_data(const char* data, std::size_t n) {
  switch (state) {
    case State::closing:
      return;  // discarded: the answer is out, the connection is closing
    case State::answering:
      // Pipelined input, parsed once the answer ends; a bounded amount.
      pending.append(data, n);
      if (pending.size() > core.opts.limits.pipeline_buffer_bytes && reading) {
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&tcp));
        reading = false;
      }
      return;
    default:
      feed(data, n);
  }
}

void Connection::feed(const char* data, std::size_t n) {
  std::size_t used = http_parser_execute(&parser, &settings(), data, n);
  if (early) return refuse_with(std::move(*early));
  if (refuse) return refuse_now(refuse, refuse_reason);
  const auto err = HTTP_PARSER_ERRNO(&parser);
  if (complete) {
    // One request is whole; what follows waits for its answer.
    pending.append(data + used, n - used);
    return dispatch();
  }
  if (err != HPE_OK) {
    const int status = err == HPE_HEADER_OVERFLOW ? 431 : 400;
    return refuse_now(status, std::string("malformed request: ") + http_errno_description(err));
  }
  if (parser.upgrade) return refuse_now(400, "protocol upgrades are not supported");
}

void Connection::refuse_now(int status, const std::string& reason) {
  core.log("peer=" + peer + " event=refused status=" + std::to_string(status) + " detail=\"" + reason + "\"");
  refuse_with(core.error_response(status, reason));
}

void Connection::refuse_with(Response r) {
  // The connection closes after the answer: its input is not parsed further.
  if (state == State::closing || closed) return;
  std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  head += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& h : r.headers) head += h.name + ": " + h.value + "\r\n";
  head += "Content-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n";
  if (ex) {
    ex->mark_gone();
    ex.reset();
  }
  state = State::closing;
  write(head + r.body, nullptr);
  close_when_flushed = true;
  if (unsent == 0) linger();
}

void Connection::dispatch() {
  complete = false;
  state = State::answering;
  uv_timer_stop(&timer);
  const bool keep = http_should_keep_alive(&parser) != 0 && !core.stopping;
  const bool chunked = req.version_minor >= 1;
  ex = std::make_shared<Exchange>(core.weak_from_this(), id, keep, chunked, req.method == "HEAD",
                                  core.opts.limits.stream_buffer_bytes);
  auto handler = core.opts.handler;
  core.submit([handler, r = std::move(req), e = ex]() mutable {
    if (handler)
      handler(std::move(r), e);
    else
      e->respond(Response{404, "text/plain", {}, "no handler\n"});
  });
  req = Request{};
}

void Connection::write(std::string bytes, const std::shared_ptr<Exchange>& by) {
  if (closed || bytes.empty()) return;
  auto* w = new WriteReq{};
  w->bytes = std::move(bytes);
  w->conn = this;
  w->ex = by;
  w->req.data = w;
  unsent += w->bytes.size();
  uv_buf_t buf = uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
  int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&tcp), &buf, 1, [](uv_write_t* req, int status) {
    auto* w = static_cast<WriteReq*>(req->data);
    Connection* c = w->conn;
    if (w->ex) w->ex->sent(w->bytes.size());
    const bool was_closed = c->closed;
    if (!was_closed) c->unsent -= w->bytes.size();
    delete w;
    if (was_closed) return;
    if (status < 0) return c->close();
    if (c->unsent == 0 && c->close_when_flushed) c->linger();
  });
  if (rc != 0) {
    if (by) by->sent(w->bytes.size());
    unsent -= w->bytes.size();
    delete w;
    close();
  }
}

void Connection::finish_exchange(bool close_after) {
  ex.reset();
  if (close_after || core.stopping) {
    state = State::closing;
    close_when_flushed = true;
    if (unsent == 0) linger();
    return;
  }
  state = State::idle;
  set_timer(core.opts.limits.idle_timeout_ms);
  http_parser_pause(&parser, 0);
  if (!pending.empty()) {
    std::string in;
    in.swap(pending);
    feed(in.data(), in.size());
  }
  if (!reading && !closed && state != State::closing) {
    reading = uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp), on_alloc, on_read) == 0;
  }
}

void Connection::linger() {
  // The answer is out: half-close, then read and discard what the client
  // still sends (a refused body) for a moment, so that it sees the answer
  // rather than a reset.
  close_when_flushed = false;
  if (closed) return;
  auto* sd = new uv_shutdown_t{};
  if (uv_shutdown(sd, reinterpret_cast<uv_stream_t*>(&tcp), [](uv_shutdown_t* r, int) { delete r; }) != 0) {
    delete sd;
    return close();
  }
  if (!reading) reading = uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp), on_alloc, on_read) == 0;
  set_timer(core.stopping ? 100 : 2000);
}

void Connection::close() {
  if (closed) return;
  closed = true;
  if (ex) {
    ex->mark_gone();  // the client left before its answer ended
    ex.reset();
  }
  core.conns.erase(id);
  if (counted) {
    auto it = core.per_address.find(peer);
    if (it != core.per_address.end() && --it->second <= 0) core.per_address.erase(it);
  }
  --core.open;
  auto done = [](uv_handle_t* h) {
    auto* c = static_cast<Connection*>(h->data);
    if (--c->open_handles > 0) return;
    Core& core = c->core;
    delete c;
    if (core.stopping && core.conns.empty()) core.shutdown_loop();
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp), done);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer), done);
}

void on_connection(uv_stream_t* server, int status) {
  auto* core = static_cast<Core*>(server->data);
  if (status < 0) return;
  auto* c = new Connection(*core, core->next_id++);
  uv_tcp_init(&core->loop, &c->tcp);
  uv_timer_init(&core->loop, &c->timer);
  c->open_handles = 2;
  core->conns[c->id] = c;
  ++core->open;
  if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0) return c->close();
  uv_tcp_nodelay(&c->tcp, 1);
  sockaddr_storage ss{};
  int len = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = "?";
  if (uv_tcp_getpeername(&c->tcp, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET6)
      uv_ip6_name(reinterpret_cast<sockaddr_in6*>(&ss), ip, sizeof ip);
    else
      uv_ip4_name(reinterpret_cast<sockaddr_in*>(&ss), ip, sizeof ip);
  }
  c->peer = ip;
  c->counted = true;
  const int from_peer = ++core->per_address[c->peer];
  const Limits& L = core->opts.limits;
  c->start();
  if (core->stopping) return c->refuse_now(503, "the server is stopping");
  if (L.max_connections > 0 && core->open > L.max_connections)
    return c->refuse_now(503, "more than " + std::to_string(L.max_connections) + " connections open");
  if (L.max_connections_per_address > 0 && from_peer > L.max_connections_per_address)
    return c->refuse_now(503, "more than " + std::to_string(L.max_connections_per_address) +
                                  " connections open from " + c->peer);
}

}  // namespace ftp::http::detail
