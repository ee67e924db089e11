// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
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
  queue_full,        ///< admission control: a waiting queue is at its bound (Refused says which)
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

/// One token's log-probability as a client reads it: the token's own text
/// (Tokenizer::token_to_piece) with the most likely tokens of its position.
struct TokenLogprobText {
  int token = -1;
  std::string text;
  std::optional<float> logprob;        ///< none for the prompt's first token (echo)
  std::vector<std::pair<std::string, float>> top;  ///< (text, logprob), most likely first
  std::vector<int> top_ids;            ///< their ids, in the same order
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
/// retry_after_s seconds (the API layer answers 429 for a full queue, 503
/// while draining or with no serving domain, with Retry-After).
class Refused : public RequestError {
 public:
  Refused(RefusalReason reason, int retry_after_s, std::string message)
      : RequestError(reason == RefusalReason::draining    ? Refusal::draining
                     : reason == RefusalReason::no_domain ? Refusal::no_domain
                                                          : Refusal::queue_full,
                     "", std::move(message)),
        reason_(reason), retry_after_s_(retry_after_s) {}
  RefusalReason reason() const noexcept { return reason_; }
  int retry_after_s() const noexcept { return retry_after_s_; }

 private:
  RefusalReason reason_;
  int retry_after_s_;
};

/// What the output processor tells a request's client: new text, then one
/// finished event, for each of its choices.
struct CompletionEvent {
  std::string request_id;
  std::string domain_id;
  int choice = 0;                      ///< which of the request's n choices
  std::string text;                    ///< new text (may be empty)
  /// With CompletionRequest::logprobs: each token generated since the last
  /// event (its text may still be held back in a later event's `text`).
  std::vector<TokenLogprobText> logprobs;
  /// With echo and logprobs, on the first event of each choice: the prompt's
  /// tokens, the first without a log-probability.
  std::vector<TokenLogprobText> prompt_logprobs;
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
  engine::SamplingParams sampling;     ///< with vLLM's penalties
  std::vector<std::string> stop;
  int priority = 0;                    ///< higher may go to the larger-TP domain
  /// Choices from the one prompt, sharing its KV (engine::GenerationRequest::n);
  /// choice c samples with seed sampling.seed + c.
  int n = 1;
  int min_tokens = 0;                  ///< no end-of-generation token or stop string before this many tokens
  bool ignore_eos = false;             ///< the model's end-of-generation tokens do not end it (stop_token_ids still do)
  std::vector<int> stop_token_ids;     ///< more tokens that end it ("stop"); their text is not in the output
  /// The stop string or stop token that ended the choice is in its text.
  bool include_stop_str_in_output = false;
  int logprobs = -1;                   ///< -1: none; k in 0..20: each token's and the top k (CompletionEvent::logprobs)
  /// The prompt's log-probabilities too (with logprobs >= 0): the prompt is
  /// then computed one token a step.
  bool prompt_logprobs = false;
  /// Text deltas, then one finished event. Called on a domain's thread.
  std::function<void(const CompletionEvent&)> on_event;
};

}  // namespace ftp::serve
