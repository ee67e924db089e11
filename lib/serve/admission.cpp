// SPDX-License-Identifier: Apache-2.0
#include "serve/admission.hpp"

namespace ftp::serve {

std::string_view to_string(RefusalReason r) noexcept {
  switch (r) {
    case RefusalReason::service_queue_requests: return "service_queue_requests";
    case RefusalReason::service_queue_tokens: return "service_queue_tokens";
    case RefusalReason::domain_queue_requests: return "domain_queue_requests";
    case RefusalReason::domain_queue_tokens: return "domain_queue_tokens";
    case RefusalReason::draining: return "draining";
    case RefusalReason::no_domain: return "no_domain";
  }
  return "";
}

Admission::Admission(AdmissionLimits limits) : limits_(limits) {
  if (limits_.service_requests < 1 || limits_.domain_requests < 1 || limits_.service_tokens < 1 ||
      limits_.domain_tokens < 1)
    throw InputError("admission: the waiting queue's bounds must be positive");
}

void Admission::Ticket::release() {
  std::call_once(once_, [this] { a_->release(domain_, tokens_); });
}

std::shared_ptr<Admission::Ticket> Admission::admit(const std::string& domain, int prompt_tokens, int retry_after_s) {
  const std::int64_t t = prompt_tokens;
  std::lock_guard lk(mu_);
  Queue& d = domains_[domain];
  auto refuse = [&](RefusalReason why, const std::string& what) {
    if (d.requests == 0) domains_.erase(domain);
    throw Refused(why, retry_after_s, what + "; retry after " + std::to_string(retry_after_s) + " s");
  };
  // A request larger than a whole bound is admitted into an empty queue:
  // it is served alone rather than refused forever.
  if (service_.requests + 1 > limits_.service_requests)
    refuse(RefusalReason::service_queue_requests,
           "the service's waiting queue is full (" + std::to_string(service_.requests) + " requests)");
  if (service_.requests > 0 && service_.tokens + t > limits_.service_tokens)
    refuse(RefusalReason::service_queue_tokens, "the service's waiting queue is full (" +
                                                    std::to_string(service_.tokens) + " prompt tokens)");
  if (d.requests + 1 > limits_.domain_requests)
    refuse(RefusalReason::domain_queue_requests,
           "domain " + domain + "'s waiting queue is full (" + std::to_string(d.requests) + " requests)");
  if (d.requests > 0 && d.tokens + t > limits_.domain_tokens)
    refuse(RefusalReason::domain_queue_tokens,
           "domain " + domain + "'s waiting queue is full (" + std::to_string(d.tokens) + " prompt tokens)");
  ++service_.requests;
  service_.tokens += t;
  ++d.requests;
  d.tokens += t;
  return std::make_shared<Ticket>(*this, domain, t);
}

std::shared_ptr<Admission::Ticket> Admission::carry(const std::string& domain, int prompt_tokens) {
  const std::int64_t t = prompt_tokens;
  std::lock_guard lk(mu_);
  Queue& d = domains_[domain];
  ++service_.requests;
  service_.tokens += t;
  ++d.requests;
  d.tokens += t;
  return std::make_shared<Ticket>(*this, domain, t);
}

void Admission::release(const std::string& domain, std::int64_t tokens) {
  std::lock_guard lk(mu_);
  --service_.requests;
  service_.tokens -= tokens;
  auto it = domains_.find(domain);
  if (it == domains_.end()) return;
  --it->second.requests;
  it->second.tokens -= tokens;
  if (it->second.requests <= 0) domains_.erase(it);
}

int Admission::waiting_requests() const {
  std::lock_guard lk(mu_);
  return service_.requests;
}

std::int64_t Admission::waiting_tokens() const {
  std::lock_guard lk(mu_);
  return service_.tokens;
}

}  // namespace ftp::serve
