// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "serve/request.hpp"

namespace ftp::serve {

/// The bounds of the waiting queue: requests admitted that have no output
/// yet, and their prompt tokens, for the whole service and for each domain.
struct AdmissionLimits {
  int service_requests = 512;
  std::int64_t service_tokens = 524288;
  int domain_requests = 256;
  std::int64_t domain_tokens = 262144;
};

/// Admission control (issue 20, item 2): a request is admitted only while
/// the waiting queue stays within its bounds; past them it is refused
/// (Refused, with a Retry-After), never queued without bound and never
/// dropped. A request waits from its admission until its first output or
/// its end, whichever comes first (Ticket::release). Thread-safe.
class Admission {
 public:
  explicit Admission(AdmissionLimits limits);

  /// A place in the waiting queue; release() (or the destructor) gives it back once.
  class Ticket {
   public:
    Ticket(Admission& a, std::string domain, std::int64_t tokens) : a_(&a), domain_(std::move(domain)), tokens_(tokens) {}
    ~Ticket() { release(); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    void release();

   private:
    Admission* a_;
    std::string domain_;
    std::int64_t tokens_;
    std::once_flag once_;
  };

  /// Admits a request of `prompt_tokens` to `domain`, or throws Refused
  /// naming the bound it would pass, with `retry_after_s`. The ticket must
  /// not outlive this Admission.
  std::shared_ptr<Ticket> admit(const std::string& domain, int prompt_tokens, int retry_after_s);
  /// Counts a request that was admitted before (moved off a draining
  /// domain, or run again after its domain failed) in `domain`'s queue and
  /// the service's, past the bounds if need be: it was accepted once and is
  /// never refused now, but the requests that arrive after it see it waiting.
  std::shared_ptr<Ticket> carry(const std::string& domain, int prompt_tokens);

  const AdmissionLimits& limits() const noexcept { return limits_; }
  /// Requests and prompt tokens waiting now (the service's).
  int waiting_requests() const;
  std::int64_t waiting_tokens() const;

 private:
  void release(const std::string& domain, std::int64_t tokens);
  struct Queue {
    int requests = 0;
    std::int64_t tokens = 0;
  };
  AdmissionLimits limits_;
  mutable std::mutex mu_;
  Queue service_;
  std::map<std::string, Queue> domains_;
};

}  // namespace ftp::serve
