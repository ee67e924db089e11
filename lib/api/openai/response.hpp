// SPDX-License-Identifier: Apache-2.0
#pragma once

// OpenAI response bodies: whole completions and chat completions, their
// SSE chunks, usage.

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "serve/request.hpp"

namespace ftp::api::openai {

/// What every body of one answer carries.
struct AnswerHead {
  std::string id;           ///< "cmpl-..." / "chatcmpl-..."
  bool chat = false;
  std::int64_t created = 0;
  std::string model;        ///< the served name the client asked for
};

/// Usage summed over the choices' finish events (a prompt counted once,
/// on its choice 0: the n choices of a prompt share it).
json::Json usage_of(const std::vector<serve::CompletionEvent>& last);

/// A whole answer: choice i has text[i], last[i]'s finish reason and
/// logprobs[i] (null or absent: none asked).
json::Json whole_answer(const AnswerHead& h, const std::vector<std::string>& text,
                        const std::vector<serve::CompletionEvent>& last, const std::vector<json::Json>& logprobs = {});

/// A chat choice's logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}.
json::Json chat_logprobs_json(const std::vector<serve::TokenLogprobText>& toks);
/// A completion choice's logprobs, OpenAI's legacy shape: tokens,
/// token_logprobs, top_logprobs (text -> logprob) and text_offset, the
/// offsets counting from `offset` (advanced past these tokens). The prompt's
/// first token (echo) has null for its logprob and top.
json::Json completion_logprobs_json(const std::vector<serve::TokenLogprobText>& toks, std::size_t& offset);

/// One stream chunk of choice `index`: new text, or (text null) a finish
/// reason or nothing. With include_usage every chunk has "usage": null.
json::Json chunk(const AnswerHead& h, std::size_t index, const std::string* text, const std::string* finish,
                 bool include_usage);
/// A chat stream's first chunk: the role.
json::Json role_chunk(const AnswerHead& h, bool include_usage);
/// The last chunk of a stream with include_usage: no choices, the usage.
json::Json usage_chunk(const AnswerHead& h, const std::vector<serve::CompletionEvent>& last);

/// "data: {json}\n\n".
std::string sse(const json::Json& j);
inline const char* sse_done() { return "data: [DONE]\n\n"; }

}  // namespace ftp::api::openai
