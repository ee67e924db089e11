// SPDX-License-Identifier: Apache-2.0
#pragma once

// One request's answer, given from any thread: a whole response, or a
// stream (head, chunks, end). The connection's event loop writes it; the
// connection answers its pipelined requests in order, one exchange at a time.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "http/message.hpp"

namespace ftp::http {

namespace detail {
struct Core;
}

class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  /// The whole answer; the exchange ends. Later calls do nothing.
  void respond(const Response& r);
  /// Starts a stream (chunked on HTTP/1.1, close-delimited on 1.0).
  void start_stream(int status, const std::string& content_type, const std::vector<Header>& headers);
  /// One piece of a started stream. False when the client is gone or has
  /// left more than Limits::stream_buffer_bytes unread: the stream is then
  /// over (the connection closes) and the caller cancels what feeds it.
  bool write(std::string data);
  /// Ends a started stream; the connection takes its next request.
  void end();
  /// True once the client has gone (closed, reset, stopped reading).
  bool gone() const { return gone_.load(); }
  /// Called once when the client goes before the exchange has ended (on the
  /// event loop's thread); at once when it is gone already.
  void on_gone(std::function<void()> fn);

  // For the transport.
  Exchange(std::weak_ptr<detail::Core> core, std::uint64_t conn, bool keep_alive, bool chunked, bool head,
           std::size_t stream_limit);
  void mark_gone();
  void sent(std::size_t n) { buffered_ -= n; }
  bool keep_alive() const { return keep_alive_; }

 private:
  void push(std::string bytes, bool final, bool close);

  std::weak_ptr<detail::Core> core_;
  std::uint64_t conn_;
  bool keep_alive_, chunked_, head_;
  std::size_t stream_limit_;
  std::atomic<std::size_t> buffered_{0};
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  bool started_ = false, ended_ = false;
  std::function<void()> on_gone_;
};

}  // namespace ftp::http
