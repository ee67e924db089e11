// SPDX-License-Identifier: Apache-2.0
#include "api/openai/server.hpp"

#include <strings.h>

#include <algorithm>
#include <ctime>
#include <functional>
#include <mutex>

#include "api/openai/errors.hpp"
#include "api/openai/request.hpp"
#include "api/openai/request_ids.hpp"
#include "api/openai/response.hpp"
#include "core/error.hpp"
#include "core/escape.hpp"
#include "http/server.hpp"
#include "serve/chat.hpp"
#include "serve/service.hpp"

namespace ftp::api::openai {

using json::Json;
using serve::CompletionEvent;
using serve::CompletionRequest;

namespace {

/// A value for the log: bare when it is a plain word, quoted otherwise.
std::string logval(std::string_view v) {
  bool plain = !v.empty();
  for (char c : v)
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) >= 0x7f) plain = false;
  if (plain) return std::string(v);
  return "\"" + log_escape(v) + "\"";
}

/// The log callback, shared with the requests still running in domains, so
/// that an event after the server is gone never touches a dead object.
struct Logger {
  std::mutex mu;
  std::function<void(std::string_view)> fn;
  void operator()(const std::string& line) {
    if (!fn) return;
    std::lock_guard lk(mu);
    try {
      fn(line);
    } catch (...) {
      // A failing log sink must not fail a request, nor a domain's thread.
    }
  }
};

bool const_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

/// application/json, whatever its parameters (charset) and case.
bool is_json_type(const std::string* ct) {
  if (!ct) return false;
  std::string t = ct->substr(0, ct->find(';'));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  std::size_t b = t.find_first_not_of(" \t");
  return b != std::string::npos && strcasecmp(t.c_str() + b, "application/json") == 0;
}

/// The choices of one HTTP request (one service request each), between
/// their domains' threads and the exchange that answers.
struct Pending {
  explicit Pending(std::size_t n) : ids(n), domain_id(n, "-"), text(n), last(n) {}
  std::mutex mu;
  std::shared_ptr<http::Exchange> ex;
  AnswerHead head;
  std::vector<http::Header> headers;
  bool stream = false, include_usage = false;
  std::string client_id;               // the x-request-id answered (the client's, or the one made up)
  std::vector<std::string> ids;        // each choice's request_id
  std::vector<std::string> domain_id;  // each choice's domain, once known
  std::vector<std::string> text;       // whole answers: each choice's text so far
  std::vector<CompletionEvent> last;   // each choice's finish event
  std::size_t finished = 0;
  bool opened = false;   // every choice is submitted; the answer may go out
  bool started = false;  // a stream's first chunk is out
  bool done = false;     // answered (or the client is gone): later events are dropped
  std::string backlog;   // stream bytes made before the stream was opened
  // Logprobs and echo (set before the requests are submitted):
  int logprobs = -1;                   // -1: none asked; else the top count
  std::vector<std::string> echo;       // each choice's echoed prompt text (/v1/completions echo)
  std::vector<std::size_t> text_offset;  // each choice's next token offset (completions' text_offset)
  std::vector<char> echoed;            // the stream sent the choice's echo
  std::vector<std::vector<serve::TokenLogprobText>> lps;  // whole answers: each choice's tokens so far
  bool all_finished() const { return finished == ids.size(); }
  // The service id stays claimed (RequestIds) until the last choice that was
  // submitted has finished: a cancelled one is still in its domain until then.
  std::size_t expected = 0;       // finish events to come: every choice, or those submitted before a refusal
  bool submitting = true;         // the prompts are still being submitted
  std::function<void()> release;  // gives the id back; called once, under mu
  void release_when_done() {
    if (release && !submitting && finished >= expected) {
      release();
      release = nullptr;
    }
  }
};

/// Sets st's logprobs and echo from the parsed request (before submitting):
/// each choice of a prompt echoes the prompt's text (a prompt of token ids,
/// decoded) with /v1/completions' echo; a whole answer's text starts with it.
void prepare_logprobs(Pending& st, const Parsed& p, const model::Tokenizer& tok) {
  st.logprobs = p.prompts.empty() ? -1 : p.prompts[0].logprobs;
  const std::size_t slots = st.ids.size();
  st.echo.assign(slots, "");
  st.text_offset.assign(slots, 0);
  st.echoed.assign(slots, 0);
  st.lps.assign(slots, {});
  if (p.echo && !p.prompts.empty()) {
    const std::size_t per = slots / p.prompts.size();
    for (std::size_t i = 0; i < p.prompts.size(); ++i) {
      const CompletionRequest& r = p.prompts[i];
      const std::string text = r.prompt_tokens.empty() ? r.prompt : tok.decode(r.prompt_tokens, true, false, false);
      for (std::size_t c = 0; c < per; ++c) st.echo[i * per + c] = text;
    }
  }
  st.text = st.echo;
}

/// An event's log-probabilities (prompt first) for choice `i` of `st`, in
/// the endpoint's shape; null when none were asked. Under st.mu.
Json event_logprobs_json(Pending& st, std::size_t i, const std::vector<serve::TokenLogprobText>& toks) {
  if (st.logprobs < 0) return nullptr;
  return st.head.chat ? chat_logprobs_json(toks) : completion_logprobs_json(toks, st.text_offset[i]);
}

/// The tokens of an event that carry log-probabilities: the prompt's (echo), then the new ones.
std::vector<serve::TokenLogprobText> event_tokens(const CompletionEvent& e) {
  std::vector<serve::TokenLogprobText> all = e.prompt_logprobs;
  all.insert(all.end(), e.logprobs.begin(), e.logprobs.end());
  return all;
}

/// The whole answer of st, every choice finished. Under st.mu.
Json whole_of(Pending& st) {
  std::vector<Json> lp;
  for (std::size_t i = 0; i < st.ids.size(); ++i) lp.push_back(event_logprobs_json(st, i, st.lps[i]));
  return whole_answer(st.head, st.text, st.last, lp);
}

/// A stream's chunk of new text and log-probabilities for choice i (the
/// echo first, once), or null when the event has neither. Under st.mu.
Json stream_text_chunk(Pending& st, std::size_t i, const CompletionEvent& e) {
  std::string text = e.text;
  if (!st.echoed[i]) {
    st.echoed[i] = 1;
    text = st.echo[i] + text;
  }
  const auto toks = st.logprobs >= 0 ? event_tokens(e) : std::vector<serve::TokenLogprobText>{};
  if (text.empty() && toks.empty()) return nullptr;
  Json c = chunk(st.head, i, &text, nullptr, st.include_usage);
  if (st.logprobs >= 0) c["choices"][0]["logprobs"] = event_logprobs_json(st, i, toks);
  return c;
}

/// A choice that failed in its domain: the error answered for the request.
ApiError failed_choice(const CompletionEvent& e) {
  return {500, "server_error", "", "", e.error.empty() ? "the request failed in domain " + e.domain_id : e.error};
}

}  // namespace

struct Server::Impl {
  serve::Service& service;
  serve::HttpOptions opts;
  std::vector<std::string> names;
  std::shared_ptr<Logger> log = std::make_shared<Logger>();
  serve::ChatTemplate chat_template;
  std::int64_t created = 0;
  std::unique_ptr<http::Server> transport;
  /// The service ids in flight (shared with the requests' events, which may
  /// come after the server is gone).
  std::shared_ptr<RequestIds> live_ids = std::make_shared<RequestIds>();

  Impl(serve::Service& s, serve::HttpOptions o) : service(s), opts(std::move(o)) {
    log->fn = opts.log;
    chat_template = serve::detect_chat_template(opts.chat_template);
    created = static_cast<std::int64_t>(std::time(nullptr));
    names = opts.served_model_names;
    if (names.empty()) names.push_back(service.config().model_name);
  }

  std::vector<http::Header> base_headers(const std::string& rid) const {
    std::vector<http::Header> h;
    if (!rid.empty()) h.push_back({"x-request-id", rid});
    if (!opts.cors_origin.empty()) {
      h.push_back({"Access-Control-Allow-Origin", opts.cors_origin});
      h.push_back({"Vary", "Origin"});
    }
    return h;
  }

  http::Response json_response(int status, const Json& j, const std::string& rid) const {
    return http::Response{status, "application/json", base_headers(rid), dumps(j)};
  }

  http::Response error_response(const ApiError& e, const std::string& rid) const {
    http::Response r = json_response(e.status, error_json(e), rid);
    if (e.status == 401) r.headers.push_back({"WWW-Authenticate", "Bearer"});
    if (e.retry_after_s > 0) r.headers.push_back({"Retry-After", std::to_string(e.retry_after_s)});
    return r;
  }

  void refused(const std::string& id, const ApiError& e) {
    (*log)("request_id=" + id + " domain_id=- event=refused status=" + std::to_string(e.status) + " type=" + e.type +
           (e.param.empty() ? "" : " param=" + logval(e.param)) + " message=" + logval(e.message));
  }

  /// Paths that need the API key (when one is set).
  static bool guarded(const std::string& path) {
    return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
  }

  std::optional<ApiError> check_key(const http::Request& req) const {
    if (opts.api_key.empty() || !guarded(req.path)) return std::nullopt;
    if (!opts.cors_origin.empty() && req.method == "OPTIONS") return std::nullopt;  // a preflight carries none
    const std::string* h = req.header("authorization");
    const std::string auth = h ? *h : "";
    // The scheme is case-insensitive (RFC 7235 section 2.1), the key is not;
    // one or more spaces after it (1*SP).
    const bool bearer = auth.size() > 7 && strncasecmp(auth.c_str(), "bearer ", 7) == 0;
    const std::size_t key_at = bearer ? auth.find_first_not_of(' ', 7) : std::string::npos;
    if (key_at != std::string::npos && const_time_equal(std::string_view(auth).substr(key_at), opts.api_key))
      return std::nullopt;
    return ApiError{401, "invalid_request_error", "", "invalid_api_key",
                    auth.empty() ? "Missing API key: send the header 'Authorization: Bearer <key>'"
                                 : "Incorrect API key provided"};
  }

  static bool known_post(const std::string& path) {
    return path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
           path == "/detokenize";
  }

  /// Before the body is read: a POST that is not JSON (415), without the
  /// key (401), or to no route (404) is answered without reading it.
  std::optional<http::Response> on_headers(const http::Request& req) {
    if (req.method != "POST") return std::nullopt;
    std::optional<ApiError> e;
    if (auto k = check_key(req))
      e = k;
    else if (!known_post(req.path))
      e = ApiError{404, "invalid_request_error", "", "not_found", "Unknown path: POST " + req.path};
    else if (!is_json_type(req.header("content-type")))
      e = ApiError{415, "invalid_request_error", "", "unsupported_media_type",
                   "Content-Type must be application/json, got " +
                       (req.header("content-type") ? "'" + *req.header("content-type") + "'" : std::string("none"))};
    if (!e) return std::nullopt;
    refused("-", *e);
    return error_response(*e, "");
  }

  void handle(http::Request&& req, const std::shared_ptr<http::Exchange>& ex);
  void completion(const http::Request& req, const std::shared_ptr<http::Exchange>& ex, bool chat,
                  const std::string* client_id);
  void on_event(const std::shared_ptr<Pending>& st, std::size_t i, const CompletionEvent& e);
  void open(const std::shared_ptr<Pending>& st);
  void cancel_all(const std::shared_ptr<Pending>& st);
};

void Server::Impl::handle(http::Request&& req, const std::shared_ptr<http::Exchange>& ex) {
  const std::string* given = req.header("x-request-id");
  if (given && !valid_request_id(*given)) {
    ApiError e{400, "invalid_request_error", "x-request-id", "",
               "x-request-id: at most 128 characters of A-Z a-z 0-9 . _ : -"};
    refused("-", e);
    return ex->respond(error_response(e, ""));
  }
  if (auto e = check_key(req)) {
    refused(given ? *given : "-", *e);
    return ex->respond(error_response(*e, given ? *given : ""));
  }
  const std::string& path = req.path;
  if (req.method == "OPTIONS" && !opts.cors_origin.empty() && path.rfind("/v1/", 0) == 0) {
    http::Response r{204, "text/plain", base_headers(""), ""};
    r.headers.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
    r.headers.push_back({"Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id"});
    r.headers.push_back({"Access-Control-Max-Age", "600"});
    return ex->respond(r);
  }
  const std::string rid = given ? *given : made_up_request_id();
  try {
    if (req.method == "POST" && path == "/v1/completions") return completion(req, ex, false, given);
    if (req.method == "POST" && path == "/v1/chat/completions") return completion(req, ex, true, given);
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (get && path == "/v1/models") {
      Json data = Json::array();
      for (const auto& n : names)
        data.push_back(Json{{"id", n},
                            {"object", "model"},
                            {"created", created},
                            {"owned_by", "flextp"},
                            {"root", service.config().model_name},
                            {"parent", nullptr},
                            {"max_model_len", service.context_length()}});
      return ex->respond(json_response(200, Json{{"object", "list"}, {"data", data}}, rid));
    }
    if (get && path.rfind("/v1/models/", 0) == 0) {
      const std::string id = path.substr(11);
      if (std::find(names.begin(), names.end(), id) == names.end())
        throw ApiError{404, "invalid_request_error", "model", "model_not_found", "The model '" + id + "' does not exist"};
      return ex->respond(json_response(200,
                                       Json{{"id", id},
                                            {"object", "model"},
                                            {"created", created},
                                            {"owned_by", "flextp"},
                                            {"root", service.config().model_name},
                                            {"parent", nullptr},
                                            {"max_model_len", service.context_length()}},
                                       rid));
    }
    if (req.method == "POST" && path == "/tokenize") {
      std::vector<int> ids = parse_tokenize(parse_body(req.body), service, chat_template);
      return ex->respond(json_response(200,
                                       Json{{"count", ids.size()},
                                            {"max_model_len", service.context_length()},
                                            {"tokens", ids},
                                            {"token_strs", nullptr}},
                                       rid));
    }
    if (req.method == "POST" && path == "/detokenize") {
      std::vector<int> ids = parse_detokenize(parse_body(req.body), service.tokenizer().n_vocab());
      return ex->respond(json_response(200, Json{{"prompt", service.tokenizer().decode(ids)}}, rid));
    }
    if (get && path == "/health") return ex->respond(json_response(200, Json{{"status", "ok"}}, rid));
    if (get && path == "/ready") {
      const bool ok = service.ready() && service.accepting();
      Json body{{"status", ok ? "ready" : "unavailable"}};
      // Devices of members that left (issue 16): why a gear may not serve.
      if (auto lost = service.device_pool().lost(); !lost.empty()) body["lost_devices"] = lost;
      return ex->respond(json_response(ok ? 200 : 503, body, rid));
    }
    if (get && path == "/metrics")
      return ex->respond(
          http::Response{200, "text/plain; version=0.0.4; charset=utf-8", base_headers(rid), service.prometheus()});
    throw ApiError{404, "invalid_request_error", "", "not_found", "Unknown path: " + req.method + " " + path};
  } catch (const ApiError& e) {
    refused(rid, e);
    ex->respond(error_response(e, rid));
  } catch (const serve::RequestError& e) {
    ApiError ae = from_refusal(e, e.param());
    refused(rid, ae);
    ex->respond(error_response(ae, rid));
  } catch (const InputError& e) {
    ApiError ae{400, "invalid_request_error", "", "", e.what()};
    refused(rid, ae);
    ex->respond(error_response(ae, rid));
  } catch (const std::exception& e) {
    ApiError ae{500, "server_error", "", "", e.what()};
    refused(rid, ae);
    ex->respond(error_response(ae, rid));
  }
}

void Server::Impl::completion(const http::Request& req, const std::shared_ptr<http::Exchange>& ex, bool chat,
                              const std::string* client_id) {
  // The client's x-request-id is the request's id; else one is made up.
  const std::string id = client_id ? *client_id : (chat ? "chatcmpl-" : "cmpl-") + made_up_request_id();
  const auto created_s = static_cast<std::int64_t>(std::time(nullptr));
  std::shared_ptr<Pending> st;
  // However this ends, the service id is given back once the choices that
  // were submitted have finished (Pending::release_when_done).
  struct Submitted {
    std::shared_ptr<Pending>& st;
    ~Submitted() {
      if (!st) return;
      std::lock_guard lk(st->mu);
      st->submitting = false;
      st->release_when_done();
    }
  } submitted{st};
  std::string sid = id;  // the service's id: the client's unless in use (RequestIds)
  Parsed p;
  try {
    Json body = parse_body(req.body);
    if (chat) {
      p = parse_common(body, service, names, opts.chat_max_tokens, true);
      std::vector<serve::ChatMessage> msgs = parse_messages(body);
      std::string text = serve::render_chat(chat_template, msgs);
      try {
        service.check_prompt_bytes(text.size());
      } catch (const serve::RequestError& e) {
        throw from_refusal(e, "messages");
      }
      // Markers such as <|im_start|> are control tokens: parse them.
      p.req.prompt_tokens = service.tokenizer().encode(text, true, true);
      for (auto& s : serve::chat_stop_strings(chat_template)) p.req.stop.push_back(std::move(s));
      if (!p.max_tokens_given) {
        // A chat that names no max_tokens may use what the context has left.
        int left = service.context_length() - static_cast<int>(p.req.prompt_tokens.size());
        p.req.max_tokens = std::max(1, std::min(p.req.max_tokens, left));
      }
      p.prompts.push_back(std::move(p.req));
    } else {
      p = parse_common(body, service, names, opts.completion_max_tokens, false);
      parse_prompt(body, p);
    }

    // One service request per prompt: request `id` (one prompt) or `id`-i
    // (several), with p.req.n choices each; choice c of prompt i is choice
    // i x n + c of the answer, as OpenAI orders them.
    const std::size_t n = p.prompts.size();
    const std::size_t per = static_cast<std::size_t>(std::max(1, p.prompts.empty() ? 1 : p.prompts[0].n));
    st = std::make_shared<Pending>(n * per);
    // Two requests in flight never share a service id (a cancel of one
    // would cancel both): a client's x-request-id in use gets a suffix; the
    // answer's header still echoes the client's.
    sid = live_ids->claim(id, n);
    st->release = [ids = live_ids, sid, n] { ids->release(sid, n); };
    if (sid != id)
      (*log)("request_id=" + sid + " domain_id=- event=renamed client_request_id=" + id +
             " detail=\"a request in flight has this x-request-id\"");
    st->ex = ex;
    st->head = AnswerHead{client_id ? (chat ? "chatcmpl-" : "cmpl-") + sid : sid, chat, created_s, p.model};
    st->client_id = id;
    st->headers = base_headers(id);
    st->stream = p.stream;
    st->include_usage = p.include_usage;
    prepare_logprobs(*st, p, service.tokenizer());
    for (std::size_t i = 0; i < n; ++i) {
      const std::string rid = RequestIds::prompt_id(sid, n, i);
      for (std::size_t c = 0; c < per; ++c) st->ids[i * per + c] = rid;
      CompletionRequest& r = p.prompts[i];
      r.id = rid;
      r.group = sid;  // the prompts of one request share the scheduler's fair share
      r.on_event = [this, st, first = i * per, log = log](const CompletionEvent& e) {
        const std::size_t i = first + static_cast<std::size_t>(std::max(0, e.choice));
        if (e.finished) {
          bool gone;
          {
            std::lock_guard lk(st->mu);
            gone = st->done && !st->all_finished() && st->ex->gone();
          }
          (*log)("request_id=" + st->ids[i] + " domain_id=" + logval(e.domain_id.empty() ? "-" : e.domain_id) +
                 " event=finished finish_reason=" + logval(std::string(engine::to_string(e.finish_reason))) +
                 " prompt_tokens=" + std::to_string(e.prompt_tokens) +
                 " completion_tokens=" + std::to_string(e.completion_tokens) + (gone ? " client=gone" : "") +
                 (e.error.empty() ? "" : " error=" + logval(e.error)));
        }
        on_event(st, i, e);
      };
    }
    for (std::size_t i = 0; i < n; ++i) {
      try {
        service.submit(std::move(p.prompts[i]));
        std::lock_guard lk(st->mu);
        st->expected += per;
      } catch (const InputError& e) {
        // All or nothing: the prompts already accepted are cancelled.
        {
          std::lock_guard lk(st->mu);
          st->done = true;
        }
        for (std::size_t j = 0; j < i; ++j) service.cancel(st->ids[j * per]);
        const auto* re = dynamic_cast<const serve::RequestError*>(&e);
        std::string param = re ? re->param() : "";
        // The names the client used: a chat has messages, not a prompt, and
        // max_tokens may have come as max_completion_tokens.
        if (param == "prompt" && chat) param = "messages";
        if (param == "max_tokens") param = p.max_tokens_key;
        ApiError ae = re ? from_refusal(*re, param) : ApiError{400, "invalid_request_error", param, "", e.what()};
        if (n > 1) ae.message = "prompt[" + std::to_string(i) + "]: " + ae.message;
        throw ae;
      }
    }
  } catch (const ApiError& e) {
    refused(sid, e);
    return ex->respond(error_response(e, id));
  } catch (const InputError& e) {  // e.g. a bad role from render_chat
    ApiError ae{400, "invalid_request_error", "", "", e.what()};
    refused(sid, ae);
    return ex->respond(error_response(ae, id));
  }
  open(st);
}

void Server::Impl::open(const std::shared_ptr<Pending>& st) {
  bool gone_now = false;
  {
    std::lock_guard lk(st->mu);
    st->opened = true;
    if (st->stream) {
      std::vector<http::Header> h = st->headers;
      h.push_back({"Cache-Control", "no-cache"});
      h.push_back({"X-Accel-Buffering", "no"});
      st->ex->start_stream(200, "text/event-stream", h);
      if (!st->backlog.empty() && !st->ex->write(std::move(st->backlog))) gone_now = true;
      st->backlog.clear();
      if (st->done && !gone_now) st->ex->end();
    } else if (st->all_finished() && !st->done) {
      st->done = true;
      for (const auto& e : st->last)
        if (e.finish_reason == engine::FinishReason::error)
          return st->ex->respond(error_response(failed_choice(e), st->client_id));
      st->ex->respond(json_response(200, whole_of(*st), st->client_id));
    }
  }
  if (gone_now) cancel_all(st);
  // A client that leaves before its answer ends: its choices are cancelled
  // (a stream's at its next write too; a whole answer's only so).
  std::weak_ptr<Pending> w = st;
  st->ex->on_gone([this, w] {
    if (auto s = w.lock()) {
      {
        std::lock_guard lk(s->mu);
        if (s->all_finished()) return;
      }
      (*log)("request_id=" + s->ids[0] + " domain_id=" + logval(s->domain_id[0]) +
             " event=client_gone detail=\"connection closed; the request is cancelled\"");
      cancel_all(s);
    }
  });
}

void Server::Impl::cancel_all(const std::shared_ptr<Pending>& st) {
  std::vector<std::string> ids;
  {
    std::lock_guard lk(st->mu);
    st->done = true;
    for (std::size_t i = 0; i < st->ids.size(); ++i)
      if (!st->last[i].finished && std::find(ids.begin(), ids.end(), st->ids[i]) == ids.end()) ids.push_back(st->ids[i]);
  }
  for (const auto& rid : ids) service.cancel(rid);
}

void Server::Impl::on_event(const std::shared_ptr<Pending>& st, std::size_t i, const CompletionEvent& e) {
  bool cancel = false;
  {
    std::lock_guard lk(st->mu);
    st->domain_id[i] = e.domain_id.empty() ? "-" : e.domain_id;
    if (e.finished) {
      st->last[i] = e;
      ++st->finished;
      st->release_when_done();
    }
    if (st->done) return;
    if (!st->stream) {
      st->text[i] += e.text;
      if (st->logprobs >= 0)
        for (auto& t : event_tokens(e)) st->lps[i].push_back(std::move(t));
      if (!st->opened || !st->all_finished()) return;
      st->done = true;
      for (const auto& l : st->last)
        if (l.finish_reason == engine::FinishReason::error)
          return st->ex->respond(error_response(failed_choice(l), st->client_id));
      return st->ex->respond(json_response(200, whole_of(*st), st->client_id));
    }
    std::string out;
    if (st->head.chat && !st->started) out += sse(role_chunk(st->head, st->include_usage));  // OpenAI opens with the role
    st->started = true;
    if (Json c = stream_text_chunk(*st, i, e); !c.is_null()) out += sse(c);
    if (e.finished) {
      if (e.finish_reason == engine::FinishReason::error) {
        // One failed choice ends the stream: its last chunk says
        // finish_reason "error", an error event says why (the SDKs raise
        // it), and the others are cancelled.
        const std::string reason(engine::to_string(e.finish_reason));
        out += sse(chunk(st->head, i, nullptr, &reason, st->include_usage));
        out += sse(error_json(failed_choice(e)));
        out += sse_done();
        st->done = true;
        cancel = true;
      } else {
        const std::string reason(engine::to_string(e.finish_reason));
        out += sse(chunk(st->head, i, nullptr, &reason, st->include_usage));
      }
    }
    if (!st->done && st->all_finished()) {
      // The last finish event of all the choices closes the stream.
      if (st->include_usage) out += sse(usage_chunk(st->head, st->last));
      out += sse_done();
      st->done = true;
    }
    if (!st->opened) {
      st->backlog += out;
    } else if (!st->ex->write(std::move(out))) {
      if (!st->done)
        (*log)("request_id=" + st->ids[0] + " domain_id=" + logval(st->domain_id[0]) +
               " event=client_gone detail=\"" + (st->ex->gone() ? "write failed" : "client not reading") +
               "; the request is cancelled\"");
      st->done = true;
      cancel = true;
    } else if (st->done) {
      st->ex->end();
    }
  }
  if (cancel) cancel_all(st);
}

Server::Server(serve::Service& service, serve::HttpOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {}

Server::~Server() { stop(0); }

void Server::start() {
  Impl& m = *impl_;
  http::ServerOptions so;
  so.host = m.opts.host;
  so.port = m.opts.port;
  so.limits = m.opts.limits;
  so.workers = m.opts.threads > 0 ? m.opts.threads : 2;
  so.on_headers = [&m](const http::Request& r) { return m.on_headers(r); };
  so.handler = [&m](http::Request&& r, std::shared_ptr<http::Exchange> ex) { m.handle(std::move(r), ex); };
  so.error_body = [&m](int status, const std::string& reason) {
    return m.error_response(from_transport(status, reason), "");
  };
  so.log = [log = m.log](const std::string& line) { (*log)("request_id=- domain_id=- " + line); };
  m.transport = std::make_unique<http::Server>(std::move(so));
  m.transport->start();
}

int Server::port() const { return impl_->transport ? impl_->transport->port() : 0; }

void Server::stop(int grace_ms) {
  if (impl_->transport) impl_->transport->stop(grace_ms);
}

std::unique_ptr<serve::HttpFront> make_front(serve::Service& service, const serve::HttpOptions& options) {
  auto s = std::make_unique<Server>(service, options);
  s->start();
  return s;
}

}  // namespace ftp::api::openai
