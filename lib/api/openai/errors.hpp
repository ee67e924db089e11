// SPDX-License-Identifier: Apache-2.0
#pragma once

// OpenAI's error answers: {"error": {"message", "type", "param", "code"}}
// with their HTTP status. The only place where the service's refusals
// (serve::Refusal) become HTTP statuses and OpenAI error types.

#include <string>

#include "core/json.hpp"
#include "serve/request.hpp"

namespace ftp::api::openai {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string param, code, message;
  int retry_after_s = 0;  ///< > 0: a Retry-After header (a request refused for now)
};

/// A 400 invalid_request_error naming `param`.
[[noreturn]] void bad(std::string param, std::string message, std::string code = "");

/// The answer to a refusal of the service: invalid_input 400, context
/// exceeded 400 with code context_length_exceeded, a full waiting queue 429
/// (rate_limit_error), draining and no domain 503 (type unavailable_error);
/// the last three with Retry-After when the service gives one
/// (serve::Refused). `param` is the name the client used.
ApiError from_refusal(const serve::RequestError& e, std::string param);

/// An answer of the transport itself (431, 413, 408, 503, 400): the reason
/// as the message, code from the status (e.g. "request_too_large").
ApiError from_transport(int status, const std::string& reason);

json::Json error_json(const ApiError& e);
/// Invalid UTF-8 from a model must not break an answer: replaced.
std::string dumps(const json::Json& j);

}  // namespace ftp::api::openai
