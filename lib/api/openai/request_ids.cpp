// SPDX-License-Identifier: Apache-2.0
#include "api/openai/request_ids.hpp"

#include <cctype>
#include <random>

namespace ftp::api::openai {

bool valid_request_id(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-')) return false;
  return true;
}

std::string made_up_request_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::lock_guard lk(mu);
  std::string s;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
}

std::string RequestIds::prompt_id(const std::string& id, std::size_t prompts, std::size_t i) {
  return prompts <= 1 ? id : id + "-" + std::to_string(i);
}

bool RequestIds::free_locked(const std::string& id, std::size_t prompts) const {
  if (held_.count(id)) return false;
  for (std::size_t i = 0; prompts > 1 && i < prompts; ++i)
    if (held_.count(prompt_id(id, prompts, i))) return false;
  return true;
}

std::string RequestIds::claim(const std::string& wanted, std::size_t prompts) {
  std::lock_guard lk(mu_);
  std::string id = wanted;
  for (std::size_t n = 2; !free_locked(id, prompts); ++n) id = wanted + ":" + std::to_string(n);
  held_.insert(id);
  for (std::size_t i = 0; prompts > 1 && i < prompts; ++i) held_.insert(prompt_id(id, prompts, i));
  return id;
}

void RequestIds::release(const std::string& id, std::size_t prompts) {
  std::lock_guard lk(mu_);
  held_.erase(id);
  for (std::size_t i = 0; prompts > 1 && i < prompts; ++i) held_.erase(prompt_id(id, prompts, i));
}

std::size_t RequestIds::held() const {
  std::lock_guard lk(mu_);
  return held_.size();
}

}  // namespace ftp::api::openai
