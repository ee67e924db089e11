// SPDX-License-Identifier: Apache-2.0
#include "api/openai/response.hpp"

#include "api/openai/errors.hpp"

namespace ftp::api::openai {

using json::Json;

Json usage_of(const std::vector<serve::CompletionEvent>& last) {
  int prompt = 0, completion = 0;
  for (const auto& e : last) {
    prompt += e.prompt_tokens;
    completion += e.completion_tokens;
  }
  return Json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

Json whole_answer(const AnswerHead& h, const std::vector<std::string>& text,
                  const std::vector<serve::CompletionEvent>& last) {
  Json choices = Json::array();
  for (std::size_t i = 0; i < last.size(); ++i) {
    const std::string reason(engine::to_string(last[i].finish_reason));
    choices.push_back(h.chat ? Json{{"index", i},
                                    {"message", {{"role", "assistant"}, {"content", text[i]}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", reason}}
                             : Json{{"text", text[i]}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", reason}});
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

std::string sse(const Json& j) { return "data: " + dumps(j) + "\n\n"; }

}  // namespace ftp::api::openai
