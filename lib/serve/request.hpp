// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "engine/domain.hpp"
#include "engine/sampler.hpp"

namespace ftp::serve {

/// A request the service refuses, with what an HTTP or RPC answer needs:
/// status 400 "invalid_request_error" for bad input, 503 when not serving;
/// `code` as OpenAI's ("context_length_exceeded" for a request longer than
/// the context allows; empty: none).
class RequestError : public InputError {
 public:
  RequestError(int status, std::string type, std::string param, std::string message, std::string code = "")
      : InputError(std::move(message)), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const noexcept { return status_; }
  const std::string& type() const noexcept { return type_; }
  const std::string& param() const noexcept { return param_; }
  const std::string& code() const noexcept { return code_; }

 private:
  int status_;
  std::string type_, param_, code_;
};

/// Why admission control refused a request that was well formed.
enum class RefusalReason {
  service_queue_requests,  ///< the service's waiting queue holds its most requests
  service_queue_tokens,    ///< ... or its most prompt tokens
  domain_queue_requests,   ///< the routed domain's waiting queue holds its most requests
  domain_queue_tokens,     ///< ... or its most prompt tokens
  draining,                ///< the service is draining (shutdown) and takes no new request
  no_domain,               ///< no domain is serving
};
/// "service_queue_requests", ...: the metric's reason label.
std::string_view to_string(RefusalReason r) noexcept;
/// Every reason, in declaration order (metrics list each, zero or not).
inline constexpr RefusalReason kRefusalReasons[] = {
    RefusalReason::service_queue_requests, RefusalReason::service_queue_tokens, RefusalReason::domain_queue_requests,
    RefusalReason::domain_queue_tokens,    RefusalReason::draining,             RefusalReason::no_domain};

/// A well-formed request that the service cannot take now: try again after
/// retry_after_s seconds. Status 429 for a full queue, 503 while draining
/// or with no serving domain (the HTTP mapping reads reason()).
class Refused : public RequestError {
 public:
  Refused(RefusalReason reason, int retry_after_s, std::string message)
      : RequestError(reason == RefusalReason::draining || reason == RefusalReason::no_domain ? 503 : 429,
                     reason == RefusalReason::draining || reason == RefusalReason::no_domain ? "unavailable_error"
                                                                                            : "rate_limit_error",
                     "", std::move(message)),
        reason_(reason), retry_after_s_(retry_after_s) {}
  RefusalReason reason() const noexcept { return reason_; }
  int retry_after_s() const noexcept { return retry_after_s_; }

 private:
  RefusalReason reason_;
  int retry_after_s_;
};

/// What the output processor tells a request's client: new text, then one
/// finished event.
struct CompletionEvent {
  std::string request_id;
  std::string domain_id;
  std::string text;                    ///< new text (may be empty)
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::none;
  std::string error;                   ///< with FinishReason::error
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

/// A completion to serve (already validated for shape by the API layer).
struct CompletionRequest {
  std::string id;                      ///< request_id, on every log line and event
  /// The client request it is part of (the prompts of one batched
  /// completion share it): fair scheduling's unit (engine::GenerationRequest::group).
  std::string group;
  std::string prompt;                  ///< text; tokenised with BOS per the tokenizer
  std::vector<int> prompt_tokens;      ///< used instead of `prompt` when not empty
  int max_tokens = 16;
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  int priority = 0;                    ///< higher may go to the larger-TP domain
  /// Text deltas, then one finished event. Called on a domain's thread.
  std::function<void(const CompletionEvent&)> on_event;
};

}  // namespace ftp::serve
