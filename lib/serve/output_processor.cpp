// SPDX-License-Identifier: Apache-2.0
#include "serve/output_processor.hpp"

#include "serve/domain_runner.hpp"

namespace ftp::serve {

OutputProcessor::OutputProcessor(const model::Tokenizer& tokenizer, const EndOfGeneration& eog, Telemetry& telemetry,
                                 std::function<std::int64_t()> now_us)
    : tok_(tokenizer), eog_(eog), telemetry_(telemetry), now_us_(std::move(now_us)) {}

engine::GenerationRequest OutputProcessor::prepare(const CompletionRequest& r, std::vector<int> prompt,
                                                   std::shared_ptr<DomainRunner*> where) const {
  // One request's output: its clock stamps and text.
  struct Track {
    std::int64_t arrival_us, first_us = -1;  // microseconds: sub-ms TTFTs are not 0
    int tokens = 0;
    std::unique_ptr<TextStream> text;
  };
  auto tr = std::make_shared<Track>();
  tr->arrival_us = now_us_();
  tr->text = std::make_unique<TextStream>(tok_, prompt, r.stop);
  const int n = static_cast<int>(prompt.size());

  engine::GenerationRequest g;
  g.id = r.id;
  g.prompt = std::move(prompt);
  g.sampling = r.sampling;
  g.max_tokens = r.max_tokens;
  g.eos = eog_.eos;
  g.stop_tokens = eog_.stop_tokens;
  TextStream* ts = tr->text.get();
  // The text stream sees each token in the stop check (before its event),
  // so a stop string ends the request at the token that made it.
  g.stop_check = [ts](const std::vector<int>& out) {
    ts->feed(out.back());
    return ts->stopped();
  };
  g.on_event = [this, tr, on_event = r.on_event, where, n](const engine::GenerationEvent& e) {
    DomainRunner* dom = *where;
    CompletionEvent ce;
    ce.request_id = e.request_id;
    ce.domain_id = e.domain_id;
    ce.prompt_tokens = n;
    const std::int64_t t_us = now_us_(), t = t_us / 1000;
    auto ms_since = [t_us](std::int64_t us) { return static_cast<double>(t_us - us) / 1000.0; };
    if (e.token >= 0) {
      ++tr->tokens;
      telemetry_.token(t);
      if (tr->first_us < 0) {
        tr->first_us = t_us;
        telemetry_.first_token(t, ms_since(tr->arrival_us));
      }
      if (!eog_.ends(e.token)) ce.text = tr->text->take();
    }
    ce.completion_tokens = tr->tokens;
    if (e.finished) {
      ce.text += tr->text->finish();
      ce.finished = true;
      ce.finish_reason = e.finish_reason;
      ce.error = e.error;
      const double e2e = ms_since(tr->arrival_us);
      const bool failed = e.finish_reason == engine::FinishReason::error;
      std::optional<double> tpot;
      if (tr->tokens > 1 && tr->first_us >= 0) tpot = ms_since(tr->first_us) / (tr->tokens - 1);
      telemetry_.request_finished(t, n, tr->tokens, e2e, tpot, e.finish_reason);
      dom->e2e.add(e2e, t);
      ++dom->served;
      if (failed) ++dom->errors;
    }
    if (on_event && (ce.finished || !ce.text.empty())) on_event(ce);
  };
  return g;
}

}  // namespace ftp::serve
