// SPDX-License-Identifier: Apache-2.0
// The HTTP load generator of ftp-gear-bench, on cpp-httplib's client.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "bench/bench.hpp"
#include "core/error.hpp"

namespace ftp::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// "http://h:p/prefix" -> ("http://h:p", "/prefix").
std::pair<std::string, std::string> split_url(const std::string& url) {
  const auto scheme = url.find("://");
  if (scheme == std::string::npos || url.compare(0, scheme, "http") != 0)
    throw InputError("url: expected http://HOST:PORT, got \"" + url + "\"");
  const auto slash = url.find('/', scheme + 3);
  // The authority: a host (a bracketed IPv6 address) and an optional port
  // of 1-65535, checked here so that a typo is a usage error, not an
  // "unreachable" daemon.
  const std::string authority = url.substr(scheme + 3, slash == std::string::npos ? std::string::npos : slash - scheme - 3);
  const auto bad_url = [&](const std::string& why) {
    throw InputError("url: " + why + " in \"" + url + "\" (expected http://HOST:PORT)");
  };
  std::size_t host_end = 0;
  if (!authority.empty() && authority[0] == '[') {
    host_end = authority.find(']');
    if (host_end == std::string::npos) bad_url("an IPv6 address without its ']'");
    ++host_end;
  } else {
    host_end = authority.find(':');
    if (host_end == std::string::npos) host_end = authority.size();
  }
  if (host_end == 0 || (authority[0] == '[' && host_end <= 2)) bad_url("no host");
  if (host_end < authority.size()) {
    const std::string port = authority.substr(host_end + (authority[host_end] == ':' ? 1 : 0));
    const bool digits = authority[host_end] == ':' && !port.empty() && port.size() <= 5 &&
                        port.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) bad_url("port '" + port + "' is not 1-65535");
  }
  if (slash == std::string::npos) return {url, ""};
  std::string prefix = url.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {url.substr(0, slash), prefix};
}

httplib::Headers headers_for(const Target& t) {
  httplib::Headers h;
  if (!t.api_key.empty()) h.emplace("Authorization", "Bearer " + t.api_key);
  return h;
}

/// One streamed completion, timed chunk by chunk.
void one_request(const Target& t, const Planned& p, Sample& s, Clock::time_point run_start) {
  json::Json j{{"prompt", synthetic_prompt(p.prompt_tokens)}, {"max_tokens", p.output_tokens}, {"temperature", 0},
               {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (!t.model.empty()) j["model"] = t.model;
  const std::string body = j.dump();
  auto [base, prefix] = split_url(t.url);
  httplib::Client cli(base);
  cli.set_connection_timeout(5, 0);
  {
    // Seconds and microseconds: a fraction of a second is a timeout too.
    const auto us = static_cast<long long>(t.timeout_s * 1e6);
    cli.set_read_timeout(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
  }
  const auto sent = Clock::now();
  s.sent_s = ms_between(run_start, sent) / 1000.0;
  Clock::time_point last{};
  bool got_first = false, done = false;
  int chunks = 0;
  std::string buf, failure;
  httplib::Request req;
  req.method = "POST";
  req.path = prefix + "/v1/completions";
  req.headers = headers_for(t);
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    const auto now = Clock::now();
    buf.append(data, n);
    std::size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json::Json j = json::Json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        failure = j["error"].value("message", std::string("server error"));
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        s.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        s.output_tokens = j["usage"].value("completion_tokens", 0);
      }
      const auto& ch = j.value("choices", json::Json::array());
      if (ch.empty() || !ch[0].contains("text") || !ch[0]["text"].is_string() || ch[0]["text"].get<std::string>().empty())
        continue;
      ++chunks;
      if (!got_first) {
        got_first = true;
        s.ttft_ms = ms_between(sent, now);
      } else {
        s.itl_ms.push_back(ms_between(last, now));
      }
      last = now;
    }
    return true;
  };
  auto res = cli.send(req);
  s.e2e_ms = ms_between(sent, Clock::now());
  if (!res) {
    s.error = "http: " + httplib::to_string(res.error());
    return;
  }
  if (res->status != 200) {
    json::Json j = json::Json::parse(buf, nullptr, false);
    std::string msg = !j.is_discarded() && j.contains("error") ? j["error"].value("message", buf) : buf;
    s.error = "HTTP " + std::to_string(res->status) + ": " + msg;
    return;
  }
  if (!failure.empty()) {
    s.error = failure;
    return;
  }
  if (!done) {
    s.error = "stream ended without [DONE]";
    return;
  }
  if (s.output_tokens == 0) s.output_tokens = chunks;
  if (!got_first) s.ttft_ms = s.e2e_ms;  // no text at all: the first token is the end
  s.ok = true;
}

}  // namespace

std::string probe(const Target& t) {
  auto [base, prefix] = split_url(t.url);
  httplib::Client cli(base);
  cli.set_connection_timeout(3, 0);
  cli.set_read_timeout(10, 0);
  auto h = cli.Get((prefix + "/health").c_str());
  if (!h) throw Error(t.url + ": daemon unreachable: " + httplib::to_string(h.error()), Exit::unreachable);
  if (h->status != 200)
    throw Error(t.url + "/health: HTTP " + std::to_string(h->status), Exit::unreachable);
  auto m = cli.Get((prefix + "/v1/models").c_str(), headers_for(t));
  if (!m) return "";
  if (m->status == 401) throw InputError(t.url + ": the API key was refused (HTTP 401)");
  json::Json j = json::Json::parse(m->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) return "";
  return j["data"][0].value("id", std::string());
}

std::vector<Sample> run_load(const Target& t, const std::vector<Planned>& plan, int run_index, double& duration_s,
                             const std::function<void(int, int)>& progress) {
  const int n = static_cast<int>(plan.size());
  std::vector<Sample> samples(plan.size());
  std::vector<Clock::time_point> finished(plan.size());
  std::vector<std::thread> threads;
  threads.reserve(plan.size());
  std::atomic<int> n_done{0};
  const auto start = Clock::now();
  auto last_report = start;
  auto report = [&] {
    if (!progress) return;
    const auto now = Clock::now();
    if (now - last_report < std::chrono::seconds(1)) return;
    last_report = now;
    progress(n_done.load(), n);
  };
  for (int i = 0; i < n; ++i) {
    const auto at = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(plan[i].at_s));
    // Sleep in short steps so progress keeps flowing at low rates.
    while (Clock::now() < at) {
      std::this_thread::sleep_until(std::min(at, Clock::now() + std::chrono::milliseconds(200)));
      report();
    }
    samples[i].run = run_index;
    samples[i].id = i;
    samples[i].scheduled_s = plan[i].at_s;
    threads.emplace_back([&, i] {
      try {
        one_request(t, plan[i], samples[i], start);
      } catch (const std::exception& e) {
        samples[i].ok = false;
        samples[i].error = e.what();
      }
      finished[i] = Clock::now();
      ++n_done;
    });
  }
  while (n_done.load() < n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    report();
  }
  for (auto& th : threads) th.join();
  auto end = start;
  for (const auto& f : finished) end = std::max(end, f);
  duration_s = ms_between(start, end) / 1000.0;
  if (progress) progress(n, n);
  return samples;
}

}  // namespace ftp::bench
