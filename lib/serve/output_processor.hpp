// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/domain.hpp"
#include "model/tokenizer.hpp"
#include "serve/generate.hpp"
#include "serve/request.hpp"
#include "serve/telemetry.hpp"

namespace ftp::serve {

class DomainRunner;

/// Turns a domain's typed outputs (token ids, finish reasons) into what a
/// client gets (as vLLM's output processor does): it detokenizes into whole
/// UTF-8 text (TextStream), applies stop strings in the domain's stop
/// check, and records each request's timings in the telemetry and in the
/// numbers of the domain that served it (its E2E window and error count,
/// which a shift's ramp checks read). The engine and the domain know
/// nothing of text or metrics.
class OutputProcessor {
 public:
  /// `now_us`: the service's clock. All must outlive the processor.
  OutputProcessor(const model::Tokenizer& tokenizer, const EndOfGeneration& eog, Telemetry& telemetry,
                  std::function<std::int64_t()> now_us);

  /// The engine request for `request` over its tokenised `prompt`: its stop
  /// check and events go through this processor, which calls the request's
  /// on_event with text and one finished event. `*where` must name the
  /// domain that takes it before the domain runs it. `arrival_us`: when
  /// the request arrived on the service's clock (a request run again after
  /// its domain failed keeps its first arrival); -1: now.
  engine::GenerationRequest prepare(const CompletionRequest& request, std::vector<int> prompt,
                                    std::shared_ptr<DomainRunner*> where, std::int64_t arrival_us = -1) const;

 private:
  const model::Tokenizer& tok_;
  const EndOfGeneration& eog_;
  Telemetry& telemetry_;
  std::function<std::int64_t()> now_us_;
};

}  // namespace ftp::serve
