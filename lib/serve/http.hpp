// SPDX-License-Identifier: Apache-2.0
#pragma once

// The daemon's HTTP front as the service sees it: its options and an
// interface. The front itself is the OpenAI API layer
// (api/openai/server.hpp) over the HTTP transport (http/server.hpp); the
// daemon gets it from a factory (DaemonOptions::http_front), since the API
// layer sits above the service.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/limits.hpp"

namespace ftp::serve {

class Service;

struct HttpOptions {
  std::string host = "127.0.0.1";     ///< address to bind; loopback by default
  int port = 8080;                    ///< 0 picks a free port (see HttpFront::port())
  /// When set, /v1/* (and /tokenize, /detokenize) require "Authorization:
  /// Bearer <api_key>" (401 otherwise); /health, /ready and /metrics stay
  /// open for probes and scrapers.
  std::string api_key;
  /// Browser clients of another origin (CORS): "*" or one origin
  /// ("https://ui.example"); empty (the default): none, no CORS headers. When
  /// set, every answer carries Access-Control-Allow-Origin and an OPTIONS
  /// preflight of /v1/* is answered 204 without the API key (a preflight
  /// carries none; the request that follows still needs it).
  std::string cors_origin;
  /// One line per request event (finished, failed, client gone, refused),
  /// each with request_id= and domain_id=. Called from the transport's and
  /// domains' threads, never concurrently. Library code never prints.
  std::function<void(std::string_view)> log;
  /// The transport's limits (header bytes and count, body, timeouts,
  /// connections, stream buffer); limits.max_body_bytes is --max-body-bytes.
  http::Limits limits;
  /// tokenizer.chat_template of the model (model::TokenizerData); empty: the
  /// documented plain default of serve/chat.hpp.
  std::string chat_template;
  int chat_max_tokens = 256;          ///< max_tokens of a chat completion that names none (capped to the context)
  int completion_max_tokens = 16;     ///< max_tokens of a completion that names none (OpenAI's default)
  int threads = 0;                    ///< threads that parse requests (handlers); 0: 2. Connections take none
  /// The names a request's "model" may give (--served-model-name); the
  /// first is the one answers carry. Empty: the service's model_name.
  std::vector<std::string> served_model_names;
};

/// A running HTTP front.
class HttpFront {
 public:
  virtual ~HttpFront() = default;
  /// The bound port (the chosen one when options.port was 0).
  virtual int port() const = 0;
  /// Stops listening and ends the connections (answers in progress get up
  /// to grace_ms to finish). Idempotent.
  virtual void stop(int grace_ms = 1000) = 0;
};

/// Makes and starts the front of a service (throws ftp::Error naming
/// host:port when it cannot listen).
using HttpFrontFactory = std::function<std::unique_ptr<HttpFront>(Service&, const HttpOptions&)>;

}  // namespace ftp::serve
