// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace ftp::hub {

/// A page of a GET: its body and the URL of the next page, from a
/// `Link: <URL>; rel="next"` header (the hub's tree listing pages), or "".
struct Page {
  std::string body;
  std::string next;
};

/// HTTP(S) through libcurl, the way the hub's clients talk to it:
/// redirects followed (the file store is another host; the token is not
/// sent there), `Authorization: Bearer TOKEN` when a token is given,
/// connect timeout 30 s, a transfer that moves nothing for 60 s fails.
/// Errors (Error, exit 1) name the URL and the HTTP status or curl's
/// reason; 401 and 403 say to set HF_TOKEN.
class HttpClient {
 public:
  /// progress: draw a bar on stderr while downloading (a terminal).
  HttpClient(std::string token, bool progress);
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;
  ~HttpClient();

  /// GET url; the body up to 64 MiB.
  Page get(const std::string& url);

  /// GET url into `part`, resuming from the bytes it already holds (a
  /// Range request; a server that answers 200 instead restarts it).
  /// `label` names the file on the bar. After it returns, `part` holds
  /// the whole body.
  void download(const std::string& url, const std::filesystem::path& part, std::uint64_t expected_size,
                const std::string& label);

 private:
  void* curl_;  // CURL*
  std::string token_;
  bool progress_;
};

}  // namespace ftp::hub
