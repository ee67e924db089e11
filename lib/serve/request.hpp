// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <optional>
#include <utility>
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

/// One token's log-probability as a client reads it: the token's own text
/// (Tokenizer::token_to_piece) with the most likely tokens of its position.
struct TokenLogprobText {
  int token = -1;
  std::string text;
  std::optional<float> logprob;        ///< none for the prompt's first token (echo)
  std::vector<std::pair<std::string, float>> top;  ///< (text, logprob), most likely first
  std::vector<int> top_ids;            ///< their ids, in the same order
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
