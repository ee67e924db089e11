// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>
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
