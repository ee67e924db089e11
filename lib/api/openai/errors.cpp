// SPDX-License-Identifier: Apache-2.0
#include "api/openai/errors.hpp"

namespace ftp::api::openai {

using json::Json;

void bad(std::string param, std::string message, std::string code) {
  throw ApiError{400, "invalid_request_error", std::move(param), std::move(code), std::move(message)};
}

ApiError from_refusal(const serve::RequestError& e, std::string param) {
  const auto* later = dynamic_cast<const serve::Refused*>(&e);
  const int retry = later ? later->retry_after_s() : 0;
  switch (e.kind()) {
    case serve::Refusal::invalid_input:
      return {400, "invalid_request_error", std::move(param), "", e.what()};
    case serve::Refusal::context_exceeded:
      return {400, "invalid_request_error", std::move(param), "context_length_exceeded", e.what()};
    case serve::Refusal::queue_full:
      return {429, "rate_limit_error", "", "", e.what(), retry};
    case serve::Refusal::draining:
    case serve::Refusal::no_domain:
      return {503, "unavailable_error", "", "", e.what(), retry};
  }
  return {500, "server_error", "", "", e.what()};
}

ApiError from_transport(int status, const std::string& reason) {
  ApiError e{status, status >= 500 ? "server_error" : "invalid_request_error", "", "", reason};
  switch (status) {
    case 408: e.code = "request_timeout"; break;
    case 413: e.code = "request_too_large"; break;
    case 431: e.code = "request_header_fields_too_large"; break;
    case 503: e.type = "unavailable_error"; break;
    default: break;
  }
  return e;
}

Json error_json(const ApiError& e) {
  return Json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}}}};
}

std::string dumps(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace ftp::api::openai
