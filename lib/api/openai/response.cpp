// SPDX-License-Identifier: Apache-2.0
#include "api/openai/response.hpp"

#include "api/openai/errors.hpp"

#include <cmath>

namespace ftp::api::openai {

using json::Json;

Json usage_of(const std::vector<serve::CompletionEvent>& last) {
  int prompt = 0, completion = 0;
  for (const auto& e : last) {
    if (e.choice == 0) prompt += e.prompt_tokens;
    completion += e.completion_tokens;
  }
  return Json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

Json whole_answer(const AnswerHead& h, const std::vector<std::string>& text,
                  const std::vector<serve::CompletionEvent>& last, const std::vector<Json>& logprobs) {
  Json choices = Json::array();
  for (std::size_t i = 0; i < last.size(); ++i) {
    const std::string reason(engine::to_string(last[i].finish_reason));
    const Json lp = i < logprobs.size() ? logprobs[i] : Json(nullptr);
    choices.push_back(h.chat ? Json{{"index", i},
                                    {"message", {{"role", "assistant"}, {"content", text[i]}}},
                                    {"logprobs", lp},
                                    {"finish_reason", reason}}
                             : Json{{"text", text[i]}, {"index", i}, {"logprobs", lp}, {"finish_reason", reason}});
  }
  return Json{{"id", h.id},
              {"object", h.chat ? "chat.completion" : "text_completion"},
              {"created", h.created},
              {"model", h.model},
              {"choices", choices},
              {"usage", usage_of(last)}};
}

Json chunk(const AnswerHead& h, std::size_t index, const std::string* text, const std::string* finish,
           bool include_usage) {
  Json choice{{"index", index}};
  if (h.chat)
    choice["delta"] = text ? Json{{"content", *text}} : Json::object();
  else
    choice["text"] = text ? *text : "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish ? Json(*finish) : Json(nullptr);
  Json j{{"id", h.id},
         {"object", h.chat ? "chat.completion.chunk" : "text_completion"},
         {"created", h.created},
         {"model", h.model},
         {"choices", Json::array({choice})}};
  // With include_usage every chunk carries "usage": null but the last.
  if (include_usage) j["usage"] = nullptr;
  return j;
}

Json role_chunk(const AnswerHead& h, bool include_usage) {
  Json first = chunk(h, 0, nullptr, nullptr, include_usage);
  first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
  return first;
}

Json usage_chunk(const AnswerHead& h, const std::vector<serve::CompletionEvent>& last) {
  Json u = chunk(h, 0, nullptr, nullptr, true);
  u["choices"] = Json::array();
  u["usage"] = usage_of(last);
  return u;
}

namespace {

/// JSON has no -inf: vLLM's stand-in for a token of probability 0.
double json_logprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

Json utf8_bytes(const std::string& t) {
  Json b = Json::array();
  for (unsigned char c : t) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

Json chat_logprobs_json(const std::vector<serve::TokenLogprobText>& toks) {
  Json content = Json::array();
  for (const auto& t : toks) {
    Json top = Json::array();
    for (const auto& [text, lp] : t.top)
      top.push_back(Json{{"token", text}, {"logprob", json_logprob(lp)}, {"bytes", utf8_bytes(text)}});
    content.push_back(Json{{"token", t.text},
                           {"logprob", json_logprob(t.logprob.value_or(0.0f))},
                           {"bytes", utf8_bytes(t.text)},
                           {"top_logprobs", top}});
  }
  return Json{{"content", content}};
}

Json completion_logprobs_json(const std::vector<serve::TokenLogprobText>& toks, std::size_t& offset) {
  Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const auto& t : toks) {
    tokens.push_back(t.text);
    if (t.logprob) {
      lps.push_back(json_logprob(*t.logprob));
      Json top = Json::object();
      for (const auto& [text, lp] : t.top)
        if (!top.contains(text)) top[text] = json_logprob(lp);
      tops.push_back(top);
    } else {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
    }
    offsets.push_back(offset);
    offset += t.text.size();
  }
  return Json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::string sse(const Json& j) { return "data: " + dumps(j) + "\n\n"; }

}  // namespace ftp::api::openai
