// SPDX-License-Identifier: Apache-2.0
#pragma once

// OpenAI request bodies (/v1/completions, /v1/chat/completions, vLLM's
// /tokenize and /detokenize) as the service's typed requests. Every error
// is an ApiError naming the field.

#include <string>
#include <vector>

#include "core/json.hpp"
#include "serve/chat.hpp"
#include "serve/request.hpp"

namespace ftp::serve {
class Service;
}

namespace ftp::api::openai {

/// What both endpoints share; the prompts are set by each.
struct Parsed {
  serve::CompletionRequest req;  ///< the fields of every prompt (chat: its one prompt)
  /// /v1/completions: each prompt of the request, one choice each (text in
  /// `prompt`, or token ids); a chat: its one request.
  std::vector<serve::CompletionRequest> prompts;
  std::string model;             ///< the name the client gave (an alias), or the first served name
  bool stream = false;
  bool include_usage = false;
  bool echo = false;             ///< /v1/completions: the prompt's text (and logprobs) before each choice's
  bool max_tokens_given = false;
  const char* max_tokens_key = "max_tokens";  ///< the key that set max_tokens
};

/// Most prompts in one /v1/completions request (each is a request of its own).
constexpr std::size_t kMaxPrompts = 128;
/// Most stop strings of a request, and their longest, bytes: each is looked
/// for at every token on the domain's thread (OpenAI takes 4).
constexpr std::size_t kMaxStops = 16, kMaxStopBytes = 512;

/// The request body as a JSON object (400 invalid_json otherwise).
json::Json parse_body(const std::string& text);

/// The fields both endpoints have. `names`: the served model names (a
/// "model" not among them: 404 model_not_found). max_completion_tokens wins
/// over max_tokens, as in vLLM. `chat`: logprobs is a boolean with
/// top_logprobs (a chat), else an integer, with echo.
Parsed parse_common(const json::Json& body, const serve::Service& service, const std::vector<std::string>& names,
                    int default_max_tokens, bool chat);

/// The prompts of /v1/completions: a string, an array of token ids, or an
/// array of either (one choice each, in order).
void parse_prompt(const json::Json& body, Parsed& p);

/// The messages of /v1/chat/completions.
std::vector<serve::ChatMessage> parse_messages(const json::Json& body);

/// vLLM's /tokenize: {"prompt": text} or {"messages": [...]} (rendered with
/// the chat template), "add_special_tokens" (default true). The tokens.
std::vector<int> parse_tokenize(const json::Json& body, const serve::Service& service,
                                const serve::ChatTemplate& chat_template);

/// vLLM's /detokenize: {"tokens": [ids]}; ids outside the vocabulary: 400.
std::vector<int> parse_detokenize(const json::Json& body, int vocab_size);

}  // namespace ftp::api::openai
