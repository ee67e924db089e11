// SPDX-License-Identifier: Apache-2.0
#include "serve/http.hpp"

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include <strings.h>

#include "core/error.hpp"
#include "core/escape.hpp"
#include "core/json.hpp"
#include "serve/chat.hpp"
#include "serve/service.hpp"

namespace ftp::serve {

using json::Json;

namespace {

/// An answer in OpenAI's error format.
struct ApiError {
  int status;
  std::string type, param, code, message;
  int retry_after_s = 0;  ///< > 0: a Retry-After header (a Refused request)
};

[[noreturn]] void bad(std::string param, std::string message, std::string code = "") {
  throw ApiError{400, "invalid_request_error", std::move(param), std::move(code), std::move(message)};
}

/// Invalid UTF-8 from a model must not break an answer: replace it.
std::string dumps(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json error_json(const ApiError& e) {
  return Json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}}}};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(dumps(error_json(e)), "application/json");
}

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

// --- request fields ------------------------------------------------------

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

/// What both endpoints share; the prompt is set by each.
struct Parsed {
  CompletionRequest req;
  /// /v1/completions: each prompt of the request, one choice each (text in
  /// `prompt`, or token ids); empty for a chat, whose prompt is in `req`.
  std::vector<CompletionRequest> prompts;
  bool stream = false;
  bool include_usage = false;
  bool max_tokens_given = false;
  const char* max_tokens_key = "max_tokens";  ///< the key the client sent (or max_tokens)
};

/// Most prompts in one /v1/completions request (each is a request of its own).
constexpr std::size_t kMaxPrompts = 128;
/// Most stop strings of a request, and their longest, bytes: each is looked
/// for at every token on the domain's thread (OpenAI takes 4).
constexpr std::size_t kMaxStops = 16, kMaxStopBytes = 512;

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
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (get_num(body, key, 0.0, -2.0, 2.0) != 0.0)
      bad(key, std::string(key) + ": not supported (only 0), got " + field(body, key)->dump());
}

Parsed parse_common(const Json& body, const Service& service, int default_max_tokens) {
  Parsed p;
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) bad("model", std::string("model: expected a string, got ") + m->type_name());
    if (m->get<std::string>() != service.config().model_name)
      throw ApiError{404, "invalid_request_error", "model", "model_not_found",
                     "The model '" + m->get<std::string>() + "' does not exist; this server serves '" +
                         service.config().model_name + "'"};
  }
  if (get_int(body, "n", 1, INT_MIN, INT_MAX) != 1) bad("n", "n: only 1 is supported, got " + field(body, "n")->dump());
  if (get_int(body, "best_of", 1, INT_MIN, INT_MAX) != 1)
    bad("best_of", "best_of: only 1 is supported, got " + field(body, "best_of")->dump());
  if (get_bool(body, "echo", false)) bad("echo", "echo: not supported");
  if (const Json* l = field(body, "logprobs"); l && !(l->is_boolean() && !l->get<bool>()))
    bad("logprobs", "logprobs: not supported");
  refuse_unsupported(body);

  const int limit = service.config().max_tokens_limit;
  const char* mt_key = field(body, "max_completion_tokens") && !field(body, "max_tokens") ? "max_completion_tokens" : "max_tokens";
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

/// The prompts of /v1/completions, as OpenAI takes them: a string, an array
/// of token ids, or an array of either (one choice each, in order).
void parse_prompt(const Json& body, Parsed& p) {
  const Json* f = field(body, "prompt");
  if (!f) bad("prompt", "prompt: missing required field");
  auto add = [&](const Json& one, const std::string& at) {
    CompletionRequest r = p.req;
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

std::vector<ChatMessage> parse_messages(const Json& body) {
  const Json* f = field(body, "messages");
  if (!f) bad("messages", "messages: missing required field");
  if (!f->is_array() || f->empty()) bad("messages", "messages: expected a non-empty array");
  std::vector<ChatMessage> out;
  for (std::size_t i = 0; i < f->size(); ++i) {
    const Json& m = (*f)[i];
    std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(at, at + ": expected an object, got " + m.type_name());
    const Json* role = field(m, "role");
    if (!role || !role->is_string()) bad(at + ".role", at + ".role: expected a string");
    ChatMessage cm;
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

// --- requests in flight --------------------------------------------------

/// The events of one HTTP request's choices (one service request each),
/// between their domains' threads and the HTTP thread that answers.
struct Pending {
  explicit Pending(std::size_t n) : ids(n), domain_id(n, "-"), last(n) {}
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::size_t, CompletionEvent>> events;  // (choice, event)
  std::vector<std::string> ids;        // each choice's request_id
  std::vector<std::string> domain_id;  // each choice's domain, once known
  std::vector<CompletionEvent> last;   // each choice's finish event
  std::size_t finished = 0;            // choices whose finish event is queued (or was consumed)
  bool gone = false;                   // the client went away: events are dropped, the requests cancelled
  bool all_finished() const { return finished == ids.size(); }
};

/// Usage summed over the choices' finish events.
Json usage_of(const std::vector<CompletionEvent>& last) {
  int prompt = 0, completion = 0;
  for (const auto& e : last) {
    prompt += e.prompt_tokens;
    completion += e.completion_tokens;
  }
  return Json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

std::string id_suffix() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::lock_guard lk(mu);
  std::string s;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
}

std::string sse(const Json& j) { return "data: " + dumps(j) + "\n\n"; }

bool const_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

/// cpp-httplib's thread pool, counting the connections that wait for a
/// thread: stop() answers them before it closes the listening socket.
class CountingPool final : public httplib::TaskQueue {
 public:
  CountingPool(std::size_t threads, std::atomic<int>& queued) : pool_(threads), queued_(queued) {}
  void enqueue(std::function<void()> fn) override {
    ++queued_;
    pool_.enqueue([this, fn = std::move(fn)] {
      --queued_;
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  std::atomic<int>& queued_;
};

}  // namespace

struct HttpServer::Impl {
  Service& service;
  HttpOptions opts;
  std::shared_ptr<Logger> log = std::make_shared<Logger>();
  ChatTemplate chat_template;
  httplib::Server svr;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::atomic<int> queued{0};  // connections waiting for a thread (CountingPool)
  int port = 0;
  std::int64_t created = 0;

  Impl(Service& s, HttpOptions o) : service(s), opts(std::move(o)) {
    log->fn = opts.log;
    chat_template = detect_chat_template(opts.chat_template);
    created = static_cast<std::int64_t>(std::time(nullptr));
    routes();
  }

  void refused(const std::string& id, const ApiError& e) {
    (*log)("request_id=" + id + " domain_id=- event=refused status=" + std::to_string(e.status) + " type=" + e.type +
           (e.param.empty() ? "" : " param=" + logval(e.param)) + " message=" + logval(e.message));
  }

  void routes();
  void completion(const std::string& body_text, httplib::Response& res, bool chat);
  void answer_whole(httplib::Response& res, const std::shared_ptr<Pending>& st, const std::string& id, bool chat,
                    std::int64_t created_s);
  void answer_stream(httplib::Response& res, const std::shared_ptr<Pending>& st, const std::string& id, bool chat,
                     bool include_usage, std::int64_t created_s);
};

void HttpServer::Impl::routes() {
  const std::size_t n = opts.threads > 0 ? static_cast<std::size_t>(opts.threads) : CPPHTTPLIB_THREAD_POOL_COUNT;
  svr.new_task_queue = [this, n] { return new CountingPool(n, queued); };
  // A connection holds its thread while it is kept alive: an idle one lets
  // the thread go after 1 s (cpp-httplib's default is 5 s), so that idle
  // pooled connections do not keep new clients waiting for long.
  svr.set_keep_alive_timeout(1);
  svr.set_payload_max_length(static_cast<std::size_t>(opts.max_body_bytes));
  // cpp-httplib's default also sets SO_REUSEPORT, which lets a second daemon
  // bind the same port and silently share its traffic: keep SO_REUSEADDR only.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  if (!opts.cors_origin.empty()) {
    svr.set_default_headers({{"Access-Control-Allow-Origin", opts.cors_origin}, {"Vary", "Origin"}});
    svr.Options(R"(/v1/.*)", [](const httplib::Request&, httplib::Response& res) {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
    });
  }
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    // A CORS preflight carries no credentials by design.
    if (!opts.cors_origin.empty() && req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 7235 section 2.1), the key is not.
    const bool bearer = auth.size() > 7 && strncasecmp(auth.c_str(), "bearer ", 7) == 0;
    // One or more spaces after the scheme (RFC 7235's 1*SP).
    const std::size_t key_at = bearer ? auth.find_first_not_of(' ', 7) : std::string::npos;
    if (key_at != std::string::npos && const_time_equal(std::string_view(auth).substr(key_at), opts.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, {401, "invalid_request_error", "", "invalid_api_key",
                     auth.empty() ? "Missing API key: send the header 'Authorization: Bearer <key>'"
                                  : "Incorrect API key provided"});
    return httplib::Server::HandlerResponse::Handled;
  });

  // Answers of httplib itself (unknown path, body too large) in OpenAI's
  // format; answers of the handlers already carry their body.
  // The one answer to a body over --max-body-bytes, whoever notices it.
  const auto too_large = [this] {
    return ApiError{413, "invalid_request_error", "", "request_too_large",
                    "The request body is over the limit of " + std::to_string(opts.max_body_bytes) + " bytes"};
  };
  svr.set_error_handler([this, too_large](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "invalid_request_error", "", "", "HTTP " + std::to_string(res.status)};
    if (res.status == 404) {
      e.code = "not_found";
      e.message = "Unknown path: " + req.method + " " + req.path;
    } else if (res.status == 413) {
      e = too_large();
    } else if (res.status >= 500) {
      e.type = "server_error";
    }
    send_error(res, e);
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    send_error(res, {500, "server_error", "", "", what});
  });

  // The body is read here rather than by httplib: its own reading has no
  // limit on chunked bodies and a fixed 8 KiB one on form-encoded ones (the
  // type curl -d sends), while a completion body is JSON whatever the type.
  auto post = [this, too_large](bool chat) {
    return [this, chat, too_large](const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader) {
      if (req.is_multipart_form_data()) {
        // httplib would hand the parts to a reader of its own.
        ApiError e{400, "invalid_request_error", "", "invalid_body",
                   "a multipart/form-data body is not a completion request: send JSON"};
        refused("-", e);
        return send_error(res, e);
      }
      std::string body;
      bool over = false;
      std::size_t seen = 0;
      const auto limit = static_cast<std::size_t>(opts.max_body_bytes);
      const bool read = reader([&](const char* data, std::size_t n) {
        seen += n;
        // Over the limit: read on, keeping nothing, so that the client gets
        // its 413 rather than a reset; past twice the limit, hang up.
        if (seen > limit) {
          over = true;
          body.clear();
          return seen <= 2 * limit;
        }
        body.append(data, n);
        return true;
      });
      over = over || res.status == 413;  // httplib's check of a Content-Length
      if (over || !read) {
        ApiError e = over ? too_large()
                          : ApiError{400, "invalid_request_error", "", "invalid_body", "the request body could not be read"};
        refused("-", e);
        return send_error(res, e);
      }
      completion(body, res, chat);
    };
  };
  svr.Post("/v1/completions", post(false));
  svr.Post("/v1/chat/completions", post(true));

  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Json m{{"id", service.config().model_name}, {"object", "model"}, {"created", created}, {"owned_by", "flextp"}};
    res.set_content(dumps(Json{{"object", "list"}, {"data", Json::array({m})}}), "application/json");
  });
  svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != service.config().model_name)
      return send_error(res, {404, "invalid_request_error", "model", "model_not_found",
                              "The model '" + id + "' does not exist"});
    res.set_content(dumps(Json{{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "flextp"}}),
                    "application/json");
  });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
    bool ok = service.ready() && service.accepting();
    res.status = ok ? 200 : 503;
    res.set_content(dumps(Json{{"status", ok ? "ready" : "unavailable"}}), "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(service.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

void HttpServer::Impl::completion(const std::string& body_text, httplib::Response& res, bool chat) {
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + id_suffix();
  const auto created_s = static_cast<std::int64_t>(std::time(nullptr));
  try {
    Json body;
    try {
      body = json::parse(body_text, "request body");
    } catch (const std::exception& e) {
      throw ApiError{400, "invalid_request_error", "", "invalid_json", e.what()};
    }
    if (!body.is_object()) throw ApiError{400, "invalid_request_error", "", "invalid_json",
                                          std::string("request body: expected a JSON object, got ") + body.type_name()};

    Parsed p;
    if (chat) {
      p = parse_common(body, service, opts.chat_max_tokens);
      std::vector<ChatMessage> msgs = parse_messages(body);
      std::string text = render_chat(chat_template, msgs);
      try {
        service.check_prompt_bytes(text.size());
      } catch (const RequestError& e) {
        throw ApiError{e.status(), e.type(), "messages", e.code(), e.what()};
      }
      // Markers such as <|im_start|> are control tokens: parse them.
      p.req.prompt_tokens = service.tokenizer().encode(text, true, true);
      for (auto& s : chat_stop_strings(chat_template)) p.req.stop.push_back(std::move(s));
      if (!p.max_tokens_given) {
        // A chat that names no max_tokens may use what the context has left.
        int left = service.context_length() - static_cast<int>(p.req.prompt_tokens.size());
        p.req.max_tokens = std::max(1, std::min(p.req.max_tokens, left));
      }
      p.prompts.push_back(std::move(p.req));
    } else {
      p = parse_common(body, service, opts.completion_max_tokens);
      parse_prompt(body, p);
    }

    // One service request per prompt: choice i is request `id` (one prompt)
    // or `id`-i (several).
    const std::size_t n = p.prompts.size();
    auto st = std::make_shared<Pending>(n);
    for (std::size_t i = 0; i < n; ++i) {
      st->ids[i] = n == 1 ? id : id + "-" + std::to_string(i);
      CompletionRequest& r = p.prompts[i];
      r.id = st->ids[i];
      r.group = id;
      r.on_event = [st, log = log, i, rid = st->ids[i]](const CompletionEvent& e) {
        bool gone;
        {
          std::lock_guard lk(st->mu);
          st->domain_id[i] = e.domain_id.empty() ? "-" : e.domain_id;
          gone = st->gone;
          if (!gone) st->events.emplace_back(i, e);
          if (e.finished) {
            st->last[i] = e;
            ++st->finished;
          }
        }
        st->cv.notify_all();
        if (e.finished)
          (*log)("request_id=" + rid + " domain_id=" + logval(e.domain_id.empty() ? "-" : e.domain_id) +
                 " event=finished finish_reason=" + logval(std::string(engine::to_string(e.finish_reason))) +
                 " prompt_tokens=" + std::to_string(e.prompt_tokens) +
                 " completion_tokens=" + std::to_string(e.completion_tokens) + (gone ? " client=gone" : "") +
                 (e.error.empty() ? "" : " error=" + logval(e.error)));
      };
    }
    for (std::size_t i = 0; i < n; ++i) {
      try {
        service.submit(std::move(p.prompts[i]));
      } catch (const InputError& e) {
        // All or nothing: the prompts already accepted are cancelled.
        {
          std::lock_guard lk(st->mu);
          st->gone = true;
          st->events.clear();
        }
        for (std::size_t j = 0; j < i; ++j) service.cancel(st->ids[j]);
        const auto* re = dynamic_cast<const RequestError*>(&e);
        std::string param = re ? re->param() : "";
        // The names the client used: a chat has messages, not a prompt, and
        // max_tokens may have come as max_completion_tokens.
        if (param == "prompt" && chat) param = "messages";
        if (param == "max_tokens") param = p.max_tokens_key;
        std::string message = e.what();
        if (n > 1) message = "prompt[" + std::to_string(i) + "]: " + message;
        const auto* rf = dynamic_cast<const Refused*>(&e);
        throw ApiError{re ? re->status() : 400, re ? re->type() : "invalid_request_error", param, re ? re->code() : "",
                       message, rf ? rf->retry_after_s() : 0};
      }
    }
    if (p.stream)
      answer_stream(res, st, id, chat, p.include_usage, created_s);
    else
      answer_whole(res, st, id, chat, created_s);
  } catch (const ApiError& e) {
    refused(id, e);
    send_error(res, e);
  } catch (const InputError& e) {  // e.g. a bad role from render_chat
    ApiError ae{400, "invalid_request_error", "", "", e.what()};
    refused(id, ae);
    send_error(res, ae);
  } catch (const std::exception& e) {
    ApiError ae{500, "server_error", "", "", e.what()};
    refused(id, ae);
    send_error(res, ae);
  }
}

namespace {

/// A choice that failed in its domain: the error answered for the request.
ApiError failed_choice(const CompletionEvent& e) {
  return {500, "server_error", "", "", e.error.empty() ? "the request failed in domain " + e.domain_id : e.error};
}

}  // namespace

void HttpServer::Impl::answer_whole(httplib::Response& res, const std::shared_ptr<Pending>& st, const std::string& id,
                                    bool chat, std::int64_t created_s) {
  // The service promises a finish event for every submitted request.
  std::vector<std::string> text(st->ids.size());
  std::vector<CompletionEvent> last;
  {
    std::unique_lock lk(st->mu);
    st->cv.wait(lk, [&] { return st->all_finished(); });
    for (auto& [i, e] : st->events) text[i] += e.text;
    st->events.clear();
    last = st->last;
  }
  for (const auto& e : last)
    if (e.finish_reason == engine::FinishReason::error) return send_error(res, failed_choice(e));
  Json choices = Json::array();
  for (std::size_t i = 0; i < last.size(); ++i)
    choices.push_back(chat ? Json{{"index", i},
                                  {"message", {{"role", "assistant"}, {"content", text[i]}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", std::string(engine::to_string(last[i].finish_reason))}}
                           : Json{{"text", text[i]},
                                  {"index", i},
                                  {"logprobs", nullptr},
                                  {"finish_reason", std::string(engine::to_string(last[i].finish_reason))}});
  Json out{{"id", id},
           {"object", chat ? "chat.completion" : "text_completion"},
           {"created", created_s},
           {"model", service.config().model_name},
           {"choices", choices},
           {"usage", usage_of(last)}};
  res.set_content(dumps(out), "application/json");
}

void HttpServer::Impl::answer_stream(httplib::Response& res, const std::shared_ptr<Pending>& st, const std::string& id,
                                     bool chat, bool include_usage, std::int64_t created_s) {
  const std::string model = service.config().model_name;
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [=](std::size_t index, const std::string* text, const std::string* finish) {
    Json choice{{"index", index}};
    if (chat) {
      choice["delta"] = text ? Json{{"content", *text}} : Json::object();
    } else {
      choice["text"] = text ? *text : "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish ? Json(*finish) : Json(nullptr);
    Json j{{"id", id}, {"object", object}, {"created", created_s}, {"model", model}, {"choices", Json::array({choice})}};
    // With include_usage every chunk carries "usage": null but the last.
    if (include_usage) j["usage"] = nullptr;
    return j;
  };
  auto started = std::make_shared<bool>(false);
  auto log = this->log;
  // Cancels the choices still running (the client left, or one failed).
  auto cancel_all = [this](const std::shared_ptr<Pending>& p) {
    std::vector<std::string> ids;
    {
      std::lock_guard lk(p->mu);
      p->gone = true;
      p->events.clear();
      for (std::size_t i = 0; i < p->ids.size(); ++i)
        if (!p->last[i].finished) ids.push_back(p->ids[i]);
    }
    for (const auto& rid : ids) service.cancel(rid);
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, this](std::size_t, httplib::DataSink& sink) {
        std::deque<std::pair<std::size_t, CompletionEvent>> batch;
        bool all = false;
        std::vector<CompletionEvent> last;
        {
          std::unique_lock lk(st->mu);
          // Wake now and then to notice a server stop.
          st->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return !st->events.empty(); });
          batch.swap(st->events);
          all = st->all_finished();
          if (all) last = st->last;
        }
        if (batch.empty() && !all) return !stopping.load();
        std::string out;
        bool done = false;
        if (chat && !*started) {
          // OpenAI opens a chat stream with the role.
          Json first = chunk(0, nullptr, nullptr);
          first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
          out += sse(first);
        }
        *started = true;
        for (const auto& [i, e] : batch) {
          if (done) break;
          if (!e.text.empty()) out += sse(chunk(i, &e.text, nullptr));
          if (!e.finished) continue;
          if (e.finish_reason == engine::FinishReason::error) {
            // One failed choice ends the stream: the others are cancelled.
            out += sse(error_json(failed_choice(e)));
            out += "data: [DONE]\n\n";
            done = true;
            cancel_all(st);
            continue;
          }
          const std::string reason(engine::to_string(e.finish_reason));
          out += sse(chunk(i, nullptr, &reason));
        }
        if (!done && all) {
          // The last finish event of all the choices closes the stream.
          if (include_usage) {
            Json u = chunk(0, nullptr, nullptr);
            u["choices"] = Json::array();
            u["usage"] = usage_of(last);
            out += sse(u);
          }
          out += "data: [DONE]\n\n";
          done = true;
        }
        if (!sink.write(out.data(), out.size())) {
          std::string dom;
          {
            std::lock_guard lk(st->mu);
            dom = st->domain_id[0];
          }
          (*log)("request_id=" + id + " domain_id=" + logval(dom) +
                 " event=client_gone detail=\"write failed; the request is cancelled\"");
          cancel_all(st);
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [st, cancel_all](bool success) {
        if (success) return;
        {
          std::lock_guard lk(st->mu);
          if (st->all_finished()) return;
        }
        cancel_all(st);  // the stream ended early (the client left, the server stops)
      });
}

HttpServer::HttpServer(Service& service, HttpOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  if (m.thread.joinable()) throw Error("http: already started on port " + std::to_string(m.port));
  const std::string where =
      (m.opts.host.find(':') != std::string::npos ? "[" + m.opts.host + "]" : m.opts.host) + ":" + std::to_string(m.opts.port);
  if (m.opts.port < 0 || m.opts.port > 65535) throw InputError("http: " + where + ": port must be 0..65535");
  // Writing to a socket whose client went away must fail with EPIPE, not
  // end the process (cpp-httplib does this too; it is the daemon's rule).
  std::signal(SIGPIPE, SIG_IGN);
  errno = 0;
  int port = m.opts.port == 0 ? m.svr.bind_to_any_port(m.opts.host)
                              : (m.svr.bind_to_port(m.opts.host, m.opts.port) ? m.opts.port : -1);
  if (port < 0) {
    int err = errno;
    throw Error("http: cannot listen on " + where + ": " +
                (err ? std::string(std::strerror(err)) : std::string("cannot resolve or bind the address")));
  }
  m.port = port;
  m.stopping = false;
  m.thread = std::thread([&m] { m.svr.listen_after_bind(); });
}

int HttpServer::port() const { return impl_->port; }

int HttpServer::queued_connections() const { return impl_->queued.load(); }

void HttpServer::stop() {
  Impl& m = *impl_;
  if (!m.thread.joinable()) return;
  // Connections accepted and waiting for a thread are answered first (a
  // completion with 503: the service no longer accepts): once the listening
  // socket closes, cpp-httplib would close them unanswered. Bounded: new
  // connections may keep arriving.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (m.queued.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.stopping = true;
  m.svr.stop();
  m.thread.join();
}

}  // namespace ftp::serve
