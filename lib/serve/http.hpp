// SPDX-License-Identifier: Apache-2.0
#pragma once

// The daemon's OpenAI-compatible HTTP API, on cpp-httplib (as llama.cpp's
// server). Routes:
//
//   POST /v1/completions        text completion; "stream": true for SSE
//   POST /v1/chat/completions   chat completion (serve/chat.hpp); SSE too
//   GET  /v1/models             the served model (config().model_name)
//   GET  /v1/models/{id}        one model, or 404 model_not_found
//   GET  /health                200 {"status":"ok"} while the process runs
//   GET  /ready                 200 when the service is ready and accepting, else 503
//   GET  /metrics               Service::prometheus(), Prometheus text format
//
// Errors use OpenAI's shape, {"error": {"message", "type", "param", "code"}}:
// 400 invalid_request_error (malformed JSON: code "invalid_json"; a bad
// field: param names it; limits on prompt length and max_tokens, checked by
// the Service), 401 invalid_api_key, 404 model_not_found / not_found,
// 413 body too large, 503 when the service is not accepting.
//
// Streams send "data: {json}\n\n" per event and "data: [DONE]\n\n" at the
// end. A client that goes away mid-stream affects no other request: its
// request is cancelled (it leaves its domain's batch at the next step and
// its KV pages return).

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace ftp::serve {

class Service;

struct HttpOptions {
  std::string host = "127.0.0.1";     ///< address to bind; loopback by default
  int port = 8080;                    ///< 0 picks a free port (see HttpServer::port())
  /// When set, /v1/* requires "Authorization: Bearer <api_key>" (401
  /// otherwise); /health, /ready and /metrics stay open for probes and scrapers.
  std::string api_key;
  /// Browser clients of another origin (CORS): "*" or one origin
  /// ("https://ui.example"); empty (the default): none, no CORS headers. When
  /// set, every answer carries Access-Control-Allow-Origin and an OPTIONS
  /// preflight of /v1/* is answered 204 without the API key (a preflight
  /// carries none; the request that follows still needs it).
  std::string cors_origin;
  /// One line per request event (finished, failed, client gone, refused),
  /// each with request_id= and domain_id=. Called from server and domain
  /// threads, never concurrently. Library code never prints.
  std::function<void(std::string_view)> log;
  int max_body_bytes = 16 << 20;      ///< larger bodies get 413; bytes
  /// tokenizer.chat_template of the model (model::TokenizerData); empty: the
  /// documented plain default of serve/chat.hpp.
  std::string chat_template;
  int chat_max_tokens = 256;          ///< max_tokens of a chat completion that names none (capped to the context)
  int completion_max_tokens = 16;     ///< max_tokens of a completion that names none (OpenAI's default)
  int threads = 0;                    ///< connection threads; 0: cpp-httplib's default (max(8, cores - 1))
};

/// The HTTP front of a Service. The service must outlive the server.
class HttpServer {
 public:
  HttpServer(Service& service, HttpOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds and starts serving on a thread of its own. Throws ftp::Error
  /// naming host:port and the reason ("http: cannot listen on
  /// 127.0.0.1:8080: Address already in use").
  void start();
  /// The bound port (the chosen one when options.port was 0); 0 before start().
  int port() const;
  /// Connections accepted and waiting for a connection thread (all busy).
  int queued_connections() const;
  /// Answers the connections waiting for a thread (at most 10 s), then
  /// stops accepting, ends open streams, waits for the server thread.
  /// Idempotent; the destructor calls it.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ftp::serve
