// SPDX-License-Identifier: Apache-2.0
#pragma once

// The limits of the HTTP transport (lib/http), each answered with its own
// status; ftp-serve(1) documents them as flags.

#include <cstddef>

namespace ftp::http {

struct Limits {
  std::size_t max_header_bytes = 16 * 1024;  ///< request line + headers; over: 431
  int max_headers = 100;                     ///< header fields of a request; over: 431
  std::size_t max_body_bytes = 16 << 20;     ///< Content-Length or chunked body; over: 413 (a Content-Length before reading)
  int header_timeout_ms = 10000;             ///< first byte of a request to the end of its headers; over: 408
  int body_timeout_ms = 60000;               ///< end of the headers to the end of the body; over: 408
  int idle_timeout_ms = 30000;               ///< a connection's wait for its (next) request; over: closed without an answer
  int max_connections = 16384;               ///< open connections in all; over: 503, closed
  int max_connections_per_address = 1024;    ///< open connections of one client address; over: 503, closed
  /// Bytes of a streamed answer written but not yet taken by the client;
  /// past it the stream ends and its request is cancelled.
  std::size_t stream_buffer_bytes = 1 << 20;
  /// Input read ahead of the request being answered (pipelined requests);
  /// past it reading pauses until the answer ends.
  std::size_t pipeline_buffer_bytes = 64 * 1024;
  int backlog = 0;                           ///< listen backlog; 0: SOMAXCONN
};

}  // namespace ftp::http
