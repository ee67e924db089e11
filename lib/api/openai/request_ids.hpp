// SPDX-License-Identifier: Apache-2.0
#pragma once

// The service ids of the HTTP requests in flight. A client's x-request-id
// names its request in the logs and the response headers, but two clients
// (or one, twice) may send the same one; the service cancels and routes by
// id, so each request in flight gets an id of its own: the client's when no
// request in flight holds it, else the client's with a suffix (":2", ":3",
// ...). The ids of a request's prompts ("id-0", "id-1", ... when there are
// several) are claimed with it.

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_set>

namespace ftp::api::openai {

/// At most 128 characters of A-Z a-z 0-9 . _ : - (what x-request-id may hold).
bool valid_request_id(const std::string& s);

/// 24 random hexadecimal digits: the id of a request that brought none.
std::string made_up_request_id();

class RequestIds {
 public:
  /// The id of a new request of `prompts` prompts that asks for `wanted`:
  /// `wanted` itself when neither it nor its prompts' ids are in flight,
  /// else `wanted`:N for the smallest N >= 2 that is free. Held until release().
  std::string claim(const std::string& wanted, std::size_t prompts);
  /// Gives back what claim(id, prompts) took.
  void release(const std::string& id, std::size_t prompts);
  /// Ids held now, the prompts' included (tests).
  std::size_t held() const;

  /// The service id of prompt i of a request `id` of `prompts` prompts.
  static std::string prompt_id(const std::string& id, std::size_t prompts, std::size_t i);

 private:
  bool free_locked(const std::string& id, std::size_t prompts) const;
  mutable std::mutex mu_;
  std::unordered_set<std::string> held_;
};

}  // namespace ftp::api::openai
