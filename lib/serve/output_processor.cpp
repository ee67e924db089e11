// SPDX-License-Identifier: Apache-2.0
#include "serve/output_processor.hpp"

#include <algorithm>

#include "serve/domain_runner.hpp"

namespace ftp::serve {

OutputProcessor::OutputProcessor(const model::Tokenizer& tokenizer, const EndOfGeneration& eog, Telemetry& telemetry,
                                 std::function<std::int64_t()> now_us)
    : tok_(tokenizer), eog_(eog), telemetry_(telemetry), now_us_(std::move(now_us)) {}

namespace {

TokenLogprobText logprob_text(const model::Tokenizer& tok, const engine::TokenLogprobs& lp, bool has_logprob = true) {
  TokenLogprobText t;
  t.token = lp.chosen.token;
  t.text = lp.chosen.token >= 0 ? tok.token_to_piece(lp.chosen.token) : "";
  if (has_logprob) t.logprob = lp.chosen.logprob;
  for (const auto& o : lp.top) {
    t.top.emplace_back(tok.token_to_piece(o.token), o.logprob);
    t.top_ids.push_back(o.token);
  }
  return t;
}

}  // namespace

engine::GenerationRequest OutputProcessor::prepare(const CompletionRequest& r, std::vector<int> prompt,
                                                   std::shared_ptr<DomainRunner*> where, std::int64_t arrival_us) const {
  // One choice's output: its token count and text.
  struct Choice {
    int tokens = 0;
    bool finished = false;
    std::unique_ptr<TextStream> text;
  };
  // One request's output: its clock stamps and choices.
  struct Track {
    std::int64_t arrival_us, first_us = -1;  // microseconds: sub-ms TTFTs are not 0
    int tokens = 0, finished = 0;
    bool failed = false;
    std::vector<Choice> choices;
  };
  auto tr = std::make_shared<Track>();
  tr->arrival_us = arrival_us >= 0 ? arrival_us : now_us_();
  const int n_choices = std::max(1, r.n);
  tr->choices.resize(static_cast<std::size_t>(n_choices));
  for (auto& c : tr->choices)
    c.text = std::make_unique<TextStream>(tok_, prompt, r.stop, r.include_stop_str_in_output, r.min_tokens);
  const int n = static_cast<int>(prompt.size());

  engine::GenerationRequest g;
  g.id = r.id;
  g.prompt = std::move(prompt);
  g.sampling = r.sampling;
  g.max_tokens = r.max_tokens;
  g.n = n_choices;
  g.min_tokens = r.min_tokens;
  g.logprobs = r.logprobs;
  g.prompt_logprobs = r.prompt_logprobs && r.logprobs >= 0;
  // ignore_eos: the model's end-of-generation tokens do not end the
  // choice; the request's stop_token_ids still do.
  g.eos = r.ignore_eos ? -1 : eog_.eos;
  if (!r.ignore_eos) g.stop_tokens = eog_.stop_tokens;
  g.stop_tokens.insert(g.stop_tokens.end(), r.stop_token_ids.begin(), r.stop_token_ids.end());
  // A token that ends the choice by its id has no text in the output,
  // unless include_stop_str_in_output asks for a stop token's text.
  auto hidden = [eog = &eog_, ids = r.stop_token_ids, ignore = r.ignore_eos,
                 keep = r.include_stop_str_in_output](int token) {
    if (!ignore && eog->ends(token)) return true;
    return !keep && std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  // Each choice's text stream sees its token in the stop check (before its
  // event), so a stop string ends the choice at the token that made it.
  g.stop_check = [tr, hidden](int choice, const std::vector<int>& out) {
    TextStream& ts = *tr->choices[static_cast<std::size_t>(choice)].text;
    if (!hidden(out.back())) ts.feed(out.back());
    return ts.stopped();
  };
  const bool echo_lp = g.prompt_logprobs;
  const int first_token = g.prompt.empty() ? -1 : g.prompt[0];
  g.on_event = [this, tr, on_event = r.on_event, where, n, hidden, echo_lp,
                first_token](const engine::GenerationEvent& e) {
    DomainRunner* dom = *where;
    Choice& ch = tr->choices[static_cast<std::size_t>(e.choice)];
    CompletionEvent ce;
    ce.request_id = e.request_id;
    ce.domain_id = e.domain_id;
    ce.choice = e.choice;
    ce.prompt_tokens = n;
    const std::int64_t t_us = now_us_(), t = t_us / 1000;
    auto ms_since = [t_us](std::int64_t us) { return static_cast<double>(t_us - us) / 1000.0; };
    if (e.token >= 0) {
      ++ch.tokens;
      ++tr->tokens;
      telemetry_.token(t);
      if (tr->first_us < 0) {
        tr->first_us = t_us;
        telemetry_.first_token(t, ms_since(tr->arrival_us));
      }
      if (!hidden(e.token)) ce.text = ch.text->take();
      if (e.logprobs) ce.logprobs.push_back(logprob_text(tok_, *e.logprobs));
      if (echo_lp && e.index == 0) {
        engine::TokenLogprobs head;
        head.chosen.token = first_token;
        ce.prompt_logprobs.push_back(logprob_text(tok_, head, false));
        for (const auto& lp : e.prompt_logprobs) ce.prompt_logprobs.push_back(logprob_text(tok_, lp));
      }
    }
    ce.completion_tokens = ch.tokens;
    if (e.finished) {
      ce.text += ch.text->finish();
      ce.finished = true;
      ce.finish_reason = e.finish_reason;
      ce.error = e.error;
      ch.finished = true;
      const bool failed = e.finish_reason == engine::FinishReason::error;
      tr->failed = tr->failed || failed;
      if (++tr->finished == static_cast<int>(tr->choices.size())) {
        // The request's numbers once, when its last choice ends (its finish
        // reason: error if a choice failed, else the last choice's).
        const double e2e = ms_since(tr->arrival_us);
        std::optional<double> tpot;
        if (tr->tokens > 1 && tr->first_us >= 0) tpot = ms_since(tr->first_us) / (tr->tokens - 1);
        telemetry_.request_finished(t, n, tr->tokens, e2e, tpot,
                                    tr->failed ? engine::FinishReason::error : e.finish_reason);
        dom->e2e.add(e2e, t);
        ++dom->served;
        if (tr->failed) ++dom->errors;
      }
    }
    if (on_event && (ce.finished || !ce.text.empty() || !ce.logprobs.empty() || !ce.prompt_logprobs.empty()))
      on_event(ce);
  };
  return g;
}

}  // namespace ftp::serve
