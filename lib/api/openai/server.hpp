// SPDX-License-Identifier: Apache-2.0
#pragma once

// The OpenAI-compatible API of the daemon over the HTTP transport
// (http::Server). Routes:
//
//   POST /v1/completions        text completion; "stream": true for SSE
//   POST /v1/chat/completions   chat completion (serve/chat.hpp); SSE too
//   GET  /v1/models             the served names (--served-model-name), with max_model_len
//   GET  /v1/models/{id}        one of them, or 404 model_not_found
//   POST /tokenize              vLLM's: {"prompt"} or {"messages"} -> {"count", "max_model_len", "tokens"}
//   POST /detokenize            vLLM's: {"tokens"} -> {"prompt"}
//   GET  /health                200 {"status":"ok"} while the process runs
//   GET  /ready                 200 when the service is ready and accepting, else 503
//   GET  /metrics               Service::prometheus(), Prometheus text format
//
// Errors use OpenAI's shape (api/openai/errors.hpp). A POST must say
// Content-Type: application/json (415 otherwise, before its body is read).
// Every answer carries x-request-id: the client's (at most 128 characters
// of A-Z a-z 0-9 . _ : -, else 400) or a new one; it is the request_id of
// the log lines and the service's events, with a suffix when a request in
// flight holds it (api/openai/request_ids.hpp).
//
// Streams send "data: {json}\n\n" per event and "data: [DONE]\n\n" at the
// end. A client that goes away, or stops reading past the transport's
// stream buffer, has its request cancelled (it leaves its domain's batch
// at the next step and its KV pages return); so has the client of a whole
// answer that closes its connection.

#include <memory>

#include "serve/http.hpp"

namespace ftp::api::openai {

class Server final : public serve::HttpFront {
 public:
  Server(serve::Service& service, serve::HttpOptions options);
  ~Server() override;
  /// Binds and starts serving. Throws ftp::Error naming host:port and the
  /// reason ("http: cannot listen on 127.0.0.1:8080: address already in use").
  void start();
  int port() const override;
  void stop(int grace_ms = 1000) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// serve::HttpFrontFactory: a started Server.
std::unique_ptr<serve::HttpFront> make_front(serve::Service& service, const serve::HttpOptions& options);

}  // namespace ftp::api::openai
