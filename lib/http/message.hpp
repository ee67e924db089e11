// SPDX-License-Identifier: Apache-2.0
#pragma once

// One HTTP request as the transport read it, and one whole answer.

#include <string>
#include <string_view>
#include <vector>

namespace ftp::http {

struct Header {
  std::string name;   ///< lower case as read (HTTP names are case-insensitive)
  std::string value;
};

struct Request {
  std::string method;  ///< "GET", "POST", ...
  std::string target;  ///< as sent: path and query
  std::string path;    ///< target up to '?'
  std::string query;   ///< after '?', without it
  int version_minor = 1;
  std::vector<Header> headers;
  std::string body;
  std::string peer;    ///< the client's address

  /// The first header of that name (lower case), or nullptr.
  const std::string* header(std::string_view lower_name) const {
    for (const auto& h : headers)
      if (h.name == lower_name) return &h.value;
    return nullptr;
  }
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<Header> headers;  ///< more headers (names as they are to be sent)
  std::string body;
};

/// The reason phrase of a status ("Payload Too Large"), "Unknown" for others.
const char* reason_phrase(int status);

}  // namespace ftp::http
