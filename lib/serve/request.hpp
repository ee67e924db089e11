// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "engine/domain.hpp"
#include "engine/sampler.hpp"

namespace ftp::serve {

/// Why the service refuses a request. The API layer (lib/api) maps each
/// to its protocol's answer; the service knows no HTTP status.
enum class Refusal {
  invalid_input,     ///< a field is out of range or malformed (param names it)
  context_exceeded,  ///< the prompt, or prompt + max_tokens, is over the context
  draining,          ///< the service is stopping and accepts no new request
  no_domain,         ///< no domain serves now (between gears)
};

/// A request the service refuses: the kind, the field at fault (empty:
/// none) and a message that names it.
class RequestError : public InputError {
 public:
  RequestError(Refusal kind, std::string param, std::string message)
      : InputError(std::move(message)), kind_(kind), param_(std::move(param)) {}
  Refusal kind() const noexcept { return kind_; }
  const std::string& param() const noexcept { return param_; }

 private:
  Refusal kind_;
  std::string param_;
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
