// SPDX-License-Identifier: Apache-2.0
#include "hub/http_client.hpp"

#include <curl/curl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>

#include "core/error.hpp"

namespace ftp::hub {

namespace {

constexpr std::size_t kMaxBody = std::size_t{64} << 20;

using Clock = std::chrono::steady_clock;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("libcurl: global init failed");
  });
}

struct Headers {
  curl_slist* list = nullptr;
  ~Headers() { curl_slist_free_all(list); }
  void add(const std::string& h) { list = curl_slist_append(list, h.c_str()); }
};

std::string status_hint(long code) {
  if (code == 401 || code == 403) return " (a gated or private repository: set HF_TOKEN to a token that may read it)";
  if (code == 404) return " (no such repository or file)";
  return "";
}

/// The URL of `rel="next"` in a Link header line, or "".
std::string next_link(std::string_view line) {
  const std::string_view key = "link:";
  if (line.size() < key.size()) return "";
  for (std::size_t i = 0; i < key.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(line[i])) != key[i]) return "";
  if (line.find("rel=\"next\"") == std::string_view::npos) return "";
  const auto a = line.find('<'), b = line.find('>');
  if (a == std::string_view::npos || b == std::string_view::npos || b < a) return "";
  return std::string(line.substr(a + 1, b - a - 1));
}

struct GetState {
  Page page;
  bool too_big = false;
};

std::size_t on_body(char* p, std::size_t size, std::size_t n, void* user) {
  auto* s = static_cast<GetState*>(user);
  if (s->page.body.size() + size * n > kMaxBody) {
    s->too_big = true;
    return 0;
  }
  s->page.body.append(p, size * n);
  return size * n;
}

std::size_t on_header(char* p, std::size_t size, std::size_t n, void* user) {
  auto* s = static_cast<GetState*>(user);
  std::string link = next_link(std::string_view(p, size * n));
  if (!link.empty()) s->page.next = std::move(link);
  return size * n;
}

struct DownloadState {
  CURL* curl = nullptr;
  std::FILE* out = nullptr;
  std::uint64_t start = 0;  // bytes in the part file before this request
  std::uint64_t written = 0;
  bool checked = false;     // the status seen at the first byte
  std::uint64_t expected = 0;
  bool progress = false;
  std::string label;
  Clock::time_point t0 = Clock::now(), last{};
};

std::size_t on_file(char* p, std::size_t size, std::size_t n, void* user) {
  auto* s = static_cast<DownloadState*>(user);
  if (!s->checked) {
    s->checked = true;
    long code = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code == 200 && s->start > 0) {  // the server ignored the range: start over
      if (std::fflush(s->out) != 0 || ftruncate(fileno(s->out), 0) != 0 || std::fseek(s->out, 0, SEEK_SET) != 0) return 0;
      s->start = 0;
    }
  }
  if (std::fwrite(p, size, n, s->out) != n) return 0;
  s->written += size * n;
  return size * n;
}

void draw_bar(DownloadState& s, bool final) {
  const auto now = Clock::now();
  if (!final && now - s.last < std::chrono::milliseconds(100)) return;
  s.last = now;
  const double have = static_cast<double>(s.start + s.written), total = static_cast<double>(s.expected);
  const double frac = total > 0 ? std::min(1.0, have / total) : 0.0;
  const double secs = std::chrono::duration<double>(now - s.t0).count();
  const double rate = secs > 0 ? static_cast<double>(s.written) / secs : 0.0;
  constexpr int width = 30;
  std::string bar(width, ' ');
  for (int i = 0; i < static_cast<int>(frac * width); ++i) bar[static_cast<std::size_t>(i)] = '#';
  char line[512];
  std::snprintf(line, sizeof line, "\r%-.40s [%s] %3d%% %.1f/%.1f MB %.1f MB/s", s.label.c_str(), bar.c_str(),
                static_cast<int>(frac * 100), have / 1e6, total / 1e6, rate / 1e6);
  std::cerr << line << (final ? "\n" : "") << std::flush;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* s = static_cast<DownloadState*>(user);
  if (s->progress) draw_bar(*s, false);
  return 0;
}

}  // namespace

HttpClient::HttpClient(std::string token, bool progress) : token_(std::move(token)), progress_(progress) {
  global_init();
  curl_ = curl_easy_init();
  if (!curl_) throw Error("libcurl: cannot make a handle");
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

namespace {

void common_options(CURL* c, const std::string& url, Headers& h, const std::string& token) {
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "flextp");
  if (!token.empty()) h.add("Authorization: Bearer " + token);  // libcurl keeps it off other hosts
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h.list);
}

void check(CURL* c, CURLcode rc, const std::string& url, const char* err, bool too_big = false) {
  if (too_big) throw Error("GET " + url + ": the answer is over 64 MiB");
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  if (code >= 400) throw Error("GET " + url + ": HTTP " + std::to_string(code) + status_hint(code));
  if (rc != CURLE_OK) throw Error("GET " + url + ": " + (err[0] ? std::string(err) : curl_easy_strerror(rc)));
}

}  // namespace

Page HttpClient::get(const std::string& url) {
  auto* c = static_cast<CURL*>(curl_);
  Headers h;
  common_options(c, url, h, token_);
  h.add("Accept: application/json");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h.list);
  GetState s;
  char err[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &s);
  const CURLcode rc = curl_easy_perform(c);
  check(c, rc, url, err, s.too_big);
  return std::move(s.page);
}

void HttpClient::download(const std::string& url, const std::filesystem::path& part, std::uint64_t expected_size,
                          const std::string& label) {
  auto* c = static_cast<CURL*>(curl_);
  std::error_code ec;
  std::uint64_t have = std::filesystem::exists(part, ec) ? std::filesystem::file_size(part, ec) : 0;
  if (have > expected_size) {  // not a prefix of this file: start over
    std::filesystem::remove(part, ec);
    have = 0;
  }
  if (have == expected_size && expected_size > 0) return;  // complete; the caller verifies it
  std::FILE* out = std::fopen(part.c_str(), have > 0 ? "r+b" : "wb");
  if (!out) throw Error(part.string() + ": cannot open for writing");
  fseeko(out, static_cast<off_t>(have), SEEK_SET);
  Headers h;
  common_options(c, url, h, token_);
  DownloadState s;
  s.curl = c;
  s.out = out;
  s.start = have;
  s.expected = expected_size;
  s.progress = progress_;
  s.label = label;
  char err[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  if (have > 0) curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(have));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_file);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &s);
  const CURLcode rc = curl_easy_perform(c);
  const bool closed = std::fclose(out) == 0;
  if (progress_) draw_bar(s, true);
  check(c, rc, url, err);
  if (!closed) throw Error(part.string() + ": write error");
}

}  // namespace ftp::hub
