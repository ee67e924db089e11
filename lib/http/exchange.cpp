// SPDX-License-Identifier: Apache-2.0
#include "http/exchange.hpp"

#include <cstdio>

#include "http/connection.hpp"

namespace ftp::http {

Exchange::Exchange(std::weak_ptr<detail::Core> core, std::uint64_t conn, bool keep_alive, bool chunked, bool head,
                   std::size_t stream_limit)
    : core_(std::move(core)), conn_(conn), keep_alive_(keep_alive), chunked_(chunked), head_(head),
      stream_limit_(stream_limit) {}

void Exchange::push(std::string bytes, bool final, bool close) {
  auto core = core_.lock();
  if (!core) return;
  buffered_ += bytes.size();
  detail::Op op;
  op.conn = conn_;
  op.ex = shared_from_this();
  op.bytes = std::move(bytes);
  op.final = final;
  op.close = close;
  core->post(std::move(op));
}

void Exchange::respond(const Response& r) {
  {
    std::lock_guard lk(mu_);
    if (started_ || ended_) return;
    ended_ = true;
  }
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& h : r.headers) out += h.name + ": " + h.value + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (!keep_alive_) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head_) out += r.body;
  push(std::move(out), true, !keep_alive_);
}

void Exchange::start_stream(int status, const std::string& content_type, const std::vector<Header>& headers) {
  {
    std::lock_guard lk(mu_);
    if (started_ || ended_) return;
    started_ = true;
  }
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\n";
  for (const auto& h : headers) out += h.name + ": " + h.value + "\r\n";
  out += chunked_ ? "Transfer-Encoding: chunked\r\n" : "Connection: close\r\n";
  out += "\r\n";
  push(std::move(out), false, false);
}

bool Exchange::write(std::string data) {
  std::lock_guard lk(mu_);
  if (!started_ || ended_ || gone_) return false;
  if (buffered_.load() > stream_limit_) {
    // The client does not read: the stream ends here, unsent bytes dropped.
    ended_ = true;
    gone_ = true;
    auto core = core_.lock();
    if (core) {
      detail::Op op;
      op.conn = conn_;
      op.ex = shared_from_this();
      op.final = true;
      op.close = true;
      op.abort = true;
      core->post(std::move(op));
    }
    return false;
  }
  if (data.empty()) return true;
  if (chunked_) {
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    data = size + data + "\r\n";
  }
  push(std::move(data), false, false);
  return true;
}

void Exchange::end() {
  {
    std::lock_guard lk(mu_);
    if (ended_) return;
    ended_ = true;
    if (!started_) return;
  }
  push(chunked_ ? "0\r\n\r\n" : "", true, !keep_alive_ || !chunked_);
}

void Exchange::on_gone(std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    if (!gone_) {
      on_gone_ = std::move(fn);
      return;
    }
  }
  if (fn) fn();
}

void Exchange::mark_gone() {
  std::function<void()> fn;
  {
    std::lock_guard lk(mu_);
    if (gone_ && !on_gone_) return;
    gone_ = true;
    if (ended_) return;
    fn = std::move(on_gone_);
    on_gone_ = nullptr;
  }
  if (fn) fn();
}

}  // namespace ftp::http
