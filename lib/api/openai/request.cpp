// SPDX-License-Identifier: Apache-2.0
#include "api/openai/request.hpp"

#include <algorithm>
#include <climits>
#include <random>

#include "api/openai/errors.hpp"
#include "serve/service.hpp"

namespace ftp::api::openai {

using json::Json;

namespace {

const Json* field(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::int64_t get_int(const Json& body, const char* key, std::int64_t dflt, std::int64_t lo, std::int64_t hi) {
  const Json* f = field(body, key);
  if (!f) return dflt;
  if (!f->is_number_integer()) bad(key, std::string(key) + ": expected an integer, got " + f->type_name());
  if (f->is_number_unsigned() && f->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    bad(key, std::string(key) + ": must be at most " + std::to_string(hi));
  std::int64_t v = f->get<std::int64_t>();
  if (v < lo || v > hi)
    bad(key, std::string(key) + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                 std::to_string(v));
  return v;
}

double get_num(const Json& body, const char* key, double dflt, double lo, double hi) {
  const Json* f = field(body, key);
  if (!f) return dflt;
  if (!f->is_number()) bad(key, std::string(key) + ": expected a number, got " + f->type_name());
  double v = f->get<double>();
  if (!(v >= lo && v <= hi))
    bad(key, std::string(key) + ": must be between " + json::dump(Json(lo), json::Style::short_) + " and " +
                 json::dump(Json(hi), json::Style::short_) + ", got " + f->dump());
  return v;
}

bool get_bool(const Json& body, const char* key, bool dflt) {
  const Json* f = field(body, key);
  if (!f) return dflt;
  if (!f->is_boolean()) bad(key, std::string(key) + ": expected a boolean, got " + f->type_name());
  return f->get<bool>();
}

std::vector<int> token_ids(const Json& arr, const std::string& param) {
  std::vector<int> ids;
  for (std::size_t i = 0; i < arr.size(); ++i) {
    if (!arr[i].is_number_integer() || arr[i].get<std::int64_t>() < 0 || arr[i].get<std::int64_t>() > INT_MAX)
      bad(param, param + "[" + std::to_string(i) + "]: expected a token id, got " + arr[i].dump());
    ids.push_back(arr[i].get<int>());
  }
  return ids;
}

/// Refuses a field whose feature this server does not have, where ignoring
/// it would answer something the client did not ask for (a tool call, JSON
/// output, a penalty): a 400 naming it, as for n and logprobs.
void refuse_unsupported(const Json& body) {
  for (const char* key : {"tools", "functions"})
    if (const Json* f = field(body, key); f && !(f->is_array() && f->empty()))
      bad(key, std::string(key) + ": tool and function calling is not supported");
  for (const char* key : {"tool_choice", "function_call"})
    if (const Json* f = field(body, key); f && !(f->is_string() && f->get<std::string>() == "none"))
      bad(key, std::string(key) + ": tool and function calling is not supported");
  if (const Json* f = field(body, "response_format")) {
    if (!f->is_object()) bad("response_format", std::string("response_format: expected an object, got ") + f->type_name());
    const Json* type = field(*f, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      bad("response_format", "response_format: only {\"type\": \"text\"} is supported, got " + f->dump());
  }
  if (const Json* f = field(body, "logit_bias")) {
    if (!f->is_object()) bad("logit_bias", std::string("logit_bias: expected an object, got ") + f->type_name());
    if (!f->empty()) bad("logit_bias", "logit_bias: not supported");
  }
  // vLLM's extra sampling parameters: none is ignored. Those below are
  // not implemented, so refused by name unless the value changes nothing
  // (the penalties, min_tokens, ignore_eos, stop_token_ids and
  // include_stop_str_in_output are applied: parse_vllm_sampling).
  if (get_num(body, "min_p", 0.0, 0.0, 1.0) != 0.0)
    bad("min_p", "min_p: not supported (only 0), got " + field(body, "min_p")->dump());
  if (get_bool(body, "use_beam_search", false)) bad("use_beam_search", "use_beam_search: not supported (only false)");
  for (const char* key : {"bad_words", "allowed_token_ids", "logits_processors"})
    if (const Json* f = field(body, key); f && !(f->is_array() && f->empty()))
      bad(key, std::string(key) + ": not supported (only an empty list), got " + f->dump());
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                          "structured_outputs", "prompt_logprobs", "truncate_prompt_tokens", "length_penalty",
                          "chat_template", "chat_template_kwargs", "documents", "continue_final_message"})
    if (field(body, key)) bad(key, std::string(key) + ": not supported");
  for (const char* key : {"skip_special_tokens", "spaces_between_special_tokens", "add_generation_prompt"})
    if (!get_bool(body, key, true)) bad(key, std::string(key) + ": not supported (only true)");
}


/// vLLM's extra sampling parameters and OpenAI's penalties, each applied
/// (none ignored): penalties as vLLM defines them (engine::apply_penalties),
/// min_tokens, ignore_eos, stop_token_ids, include_stop_str_in_output.
void parse_vllm_sampling(const Json& body, serve::CompletionRequest& r) {
  r.sampling.presence_penalty = static_cast<float>(get_num(body, "presence_penalty", 0.0, -2.0, 2.0));
  r.sampling.frequency_penalty = static_cast<float>(get_num(body, "frequency_penalty", 0.0, -2.0, 2.0));
  r.sampling.repetition_penalty = static_cast<float>(get_num(body, "repetition_penalty", 1.0, 0.0, 1e9));
  if (r.sampling.repetition_penalty <= 0.0f)
    bad("repetition_penalty", "repetition_penalty: must be greater than 0, got " + field(body, "repetition_penalty")->dump());
  r.min_tokens = static_cast<int>(get_int(body, "min_tokens", 0, 0, INT_MAX));
  r.ignore_eos = get_bool(body, "ignore_eos", false);
  r.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output", false);
  if (const Json* f = field(body, "stop_token_ids")) {
    if (!f->is_array()) bad("stop_token_ids", std::string("stop_token_ids: expected an array of token ids, got ") + f->type_name());
    r.stop_token_ids = token_ids(*f, "stop_token_ids");
  }
}

/// n, logprobs and echo: /v1/completions takes logprobs as an integer
/// (0..20, top tokens per position) and echo; a chat takes logprobs as a
/// boolean with top_logprobs (0..20).
void parse_choices_and_logprobs(const Json& body, bool chat, Parsed& p) {
  p.req.n = static_cast<int>(get_int(body, "n", 1, 1, 128));
  if (chat) {
    if (get_bool(body, "logprobs", false)) p.req.logprobs = static_cast<int>(get_int(body, "top_logprobs", 0, 0, 20));
    else if (field(body, "top_logprobs"))
      bad("top_logprobs", "top_logprobs: needs \"logprobs\": true");
    if (field(body, "echo")) bad("echo", "echo: only /v1/completions takes it");
  } else {
    if (const Json* l = field(body, "logprobs"); l && l->is_boolean())
      bad("logprobs", "logprobs: expected an integer (0..20) on /v1/completions, got a boolean");
    p.req.logprobs = static_cast<int>(get_int(body, "logprobs", -1, 0, 20));
    p.echo = get_bool(body, "echo", false);
    p.req.prompt_logprobs = p.echo && p.req.logprobs >= 0;
  }
}

}  // namespace

Json parse_body(const std::string& text) {
  Json body;
  try {
    body = json::parse(text, "request body");
  } catch (const std::exception& e) {
    throw ApiError{400, "invalid_request_error", "", "invalid_json", e.what()};
  }
  if (!body.is_object())
    throw ApiError{400, "invalid_request_error", "", "invalid_json",
                   std::string("request body: expected a JSON object, got ") + body.type_name()};
  return body;
}

Parsed parse_common(const Json& body, const serve::Service& service, const std::vector<std::string>& names,
                    int default_max_tokens, bool chat) {
  Parsed p;
  p.model = names.front();
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", std::string("model: expected a string, got ") + m->type_name());
    const std::string asked = m->get<std::string>();
    if (std::find(names.begin(), names.end(), asked) == names.end())
      throw ApiError{404, "invalid_request_error", "model", "model_not_found",
                     "The model '" + asked + "' does not exist; this server serves '" + names.front() + "'"};
    p.model = asked;
  }
  if (get_int(body, "best_of", 1, INT_MIN, INT_MAX) != 1)
    bad("best_of", "best_of: only 1 is supported, got " + field(body, "best_of")->dump());
  refuse_unsupported(body);
  parse_choices_and_logprobs(body, chat, p);
  parse_vllm_sampling(body, p.req);

  const int limit = service.config().max_tokens_limit;
  // vLLM's order: max_completion_tokens (OpenAI's current name) wins.
  const char* mt_key = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens_given = field(body, mt_key) != nullptr;
  p.max_tokens_key = mt_key;
  // A request that names no max_tokens gets the default, within the limit:
  // only a value the client sends can be over it.
  const int fallback = limit > 0 ? std::min(default_max_tokens, limit) : default_max_tokens;
  std::int64_t mt = get_int(body, mt_key, fallback, 1, INT_MAX);
  if (limit > 0 && mt > limit)
    bad(mt_key, std::string(mt_key) + ": " + std::to_string(mt) + " is over this server's limit of " + std::to_string(limit));
  p.req.max_tokens = static_cast<int>(mt);

  p.req.sampling.temperature = static_cast<float>(get_num(body, "temperature", 1.0, 0.0, 2.0));
  p.req.sampling.top_p = static_cast<float>(get_num(body, "top_p", 1.0, 0.0, 1.0));
  if (p.req.sampling.top_p <= 0.0f) bad("top_p", "top_p: must be greater than 0, got " + field(body, "top_p")->dump());
  p.req.sampling.top_k = static_cast<int>(get_int(body, "top_k", 0, -1, INT_MAX));
  if (p.req.sampling.top_k < 0) p.req.sampling.top_k = 0;  // -1: off, as vLLM
  if (const Json* s = field(body, "seed")) {
    if (!s->is_number_integer()) bad("seed", std::string("seed: expected an integer, got ") + s->type_name());
    p.req.sampling.seed = s->is_number_unsigned() ? s->get<std::uint64_t>()
                                                  : static_cast<std::uint64_t>(s->get<std::int64_t>());
  } else {
    p.req.sampling.seed = std::random_device{}();
  }
  if (const Json* s = field(body, "stop")) {
    auto add = [&](const std::string& text, const std::string& at) {
      if (text.size() > kMaxStopBytes)
        bad("stop", at + ": at most " + std::to_string(kMaxStopBytes) + " bytes, got " + std::to_string(text.size()));
      if (!text.empty()) p.req.stop.push_back(text);
    };
    if (s->is_string()) {
      add(s->get<std::string>(), "stop");
    } else if (s->is_array()) {
      if (s->size() > kMaxStops)
        bad("stop", "stop: at most " + std::to_string(kMaxStops) + " strings, got " + std::to_string(s->size()));
      for (std::size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string())
          bad("stop", "stop[" + std::to_string(i) + "]: expected a string, got " + (*s)[i].type_name());
        add((*s)[i].get<std::string>(), "stop[" + std::to_string(i) + "]");
      }
    } else {
      bad("stop", std::string("stop: expected a string or an array of strings, got ") + s->type_name());
    }
  }
  p.stream = get_bool(body, "stream", false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", std::string("stream_options: expected an object, got ") + so->type_name());
    p.include_usage = get_bool(*so, "include_usage", false);
  }
  p.req.priority = static_cast<int>(get_int(body, "priority", 0, INT_MIN, INT_MAX));
  return p;
}

void parse_prompt(const Json& body, Parsed& p) {
  const Json* f = field(body, "prompt");
  if (!f) bad("prompt", "prompt: missing required field");
  auto add = [&](const Json& one, const std::string& at) {
    serve::CompletionRequest r = p.req;
    if (one.is_string()) {
      r.prompt = one.get<std::string>();
    } else if (one.is_array() && !one.empty()) {
      r.prompt_tokens = token_ids(one, at);
    } else {
      bad("prompt", at + ": expected a string or a non-empty array of token ids, got " +
                        (one.is_array() ? std::string("an empty array") : one.type_name()));
    }
    p.prompts.push_back(std::move(r));
  };
  if (f->is_string() || (f->is_array() && !f->empty() && (*f)[0].is_number())) {
    add(*f, "prompt");
  } else if (f->is_array() && !f->empty()) {
    if (f->size() > kMaxPrompts)
      bad("prompt", "prompt: at most " + std::to_string(kMaxPrompts) + " prompts per request, got " +
                        std::to_string(f->size()));
    for (std::size_t i = 0; i < f->size(); ++i) add((*f)[i], "prompt[" + std::to_string(i) + "]");
  } else {
    bad("prompt", std::string("prompt: expected a string, an array of token ids or an array of prompts, got ") +
                      (f->is_array() ? "an empty array" : f->type_name()));
  }
}

std::vector<serve::ChatMessage> parse_messages(const Json& body) {
  const Json* f = field(body, "messages");
  if (!f) bad("messages", "messages: missing required field");
  if (!f->is_array() || f->empty()) bad("messages", "messages: expected a non-empty array");
  std::vector<serve::ChatMessage> out;
  for (std::size_t i = 0; i < f->size(); ++i) {
    const Json& m = (*f)[i];
    std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(at, at + ": expected an object, got " + m.type_name());
    const Json* role = field(m, "role");
    if (!role || !role->is_string()) bad(at + ".role", at + ".role: expected a string");
    serve::ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";
    if (cm.role == "tool" || cm.role == "function")
      bad(at + ".role", at + ".role: '" + cm.role + "': tool and function calling is not supported");
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
      bad(at + ".role", at + ".role: expected system, developer, user or assistant, got '" + cm.role + "'");
    const Json* c = field(m, "content");
    if (!c) {
      if (cm.role != "assistant") bad(at + ".content", at + ".content: missing required field");
    } else if (c->is_string()) {
      cm.content = c->get<std::string>();
    } else if (c->is_array()) {
      // Content parts: only text is served; parts are joined by a newline,
      // as vLLM joins them (they are separate pieces of text).
      for (std::size_t k = 0; k < c->size(); ++k) {
        const Json& part = (*c)[k];
        std::string pat = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad(pat, pat + ": only {\"type\": \"text\", \"text\": ...} parts are supported");
        if (k > 0) cm.content += "\n";
        cm.content += part["text"].get<std::string>();
      }
    } else {
      bad(at + ".content", at + ".content: expected a string or an array of text parts, got " + c->type_name());
    }
    out.push_back(std::move(cm));
  }
  return out;
}


std::vector<int> parse_tokenize(const Json& body, const serve::Service& service, const serve::ChatTemplate& tmpl) {
  const bool special = get_bool(body, "add_special_tokens", true);
  const Json* prompt = field(body, "prompt");
  const Json* messages = field(body, "messages");
  if (prompt && messages) bad("messages", "give either prompt or messages, not both");
  if (messages) {
    std::string text = serve::render_chat(tmpl, parse_messages(body));
    service.check_prompt_bytes(text.size());
    return service.tokenizer().encode(text, special, true);
  }
  if (!prompt) bad("prompt", "prompt: missing required field");
  if (!prompt->is_string()) bad("prompt", std::string("prompt: expected a string, got ") + prompt->type_name());
  const std::string text = prompt->get<std::string>();
  service.check_prompt_bytes(text.size());
  return service.tokenizer().encode(text, special);
}

std::vector<int> parse_detokenize(const Json& body, int vocab_size) {
  const Json* f = field(body, "tokens");
  if (!f) bad("tokens", "tokens: missing required field");
  if (!f->is_array()) bad("tokens", std::string("tokens: expected an array of token ids, got ") + f->type_name());
  std::vector<int> ids = token_ids(*f, "tokens");
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab_size)
      bad("tokens", "tokens[" + std::to_string(i) + "]: " + std::to_string(ids[i]) + " is not in the vocabulary of " +
                        std::to_string(vocab_size) + " tokens");
  return ids;
}

}  // namespace ftp::api::openai
