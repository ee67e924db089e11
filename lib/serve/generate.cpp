// SPDX-License-Identifier: Apache-2.0
#include "serve/generate.hpp"

#include <algorithm>
#include <charconv>

#include "core/error.hpp"
#include "engine/rank_backend.hpp"
#include "engine/weight_store.hpp"

namespace ftp::serve {

GearSpec parse_gear_spec(std::string_view text) {
  GearSpec g;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(pos, end - pos);
    auto eq = part.find('=');
    std::string_view key = part.substr(0, eq), val = eq == std::string_view::npos ? "" : part.substr(eq + 1);
    int v = 0;
    auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
    if (eq == std::string_view::npos || ec != std::errc() || p != val.data() + val.size() || v < 1)
      throw InputError("--gear: " + std::string(part) + ": expected tp=N, pp=N or dp=N with N a positive integer");
    if (key == "tp")
      g.tp = v;
    else if (key == "pp")
      g.pp = v;
    else if (key == "dp")
      g.dp = v;
    else
      throw InputError("--gear: " + std::string(part) + ": unknown key \"" + std::string(key) + "\" (tp, pp, dp)");
    pos = end + 1;
  }
  return g;
}

std::vector<engine::StageLayout> even_stages(int n_layer, int tp, int pp) {
  if (pp < 1 || pp > n_layer)
    throw InputError("pp " + std::to_string(pp) + " must be between 1 and the model's " + std::to_string(n_layer) +
                     " layers");
  std::vector<engine::StageLayout> st;
  int first = 0;
  for (int s = 0; s < pp; ++s) {
    int n = n_layer / pp + (s < n_layer % pp ? 1 : 0);
    st.push_back(engine::StageLayout{first, n, tp});
    first += n;
  }
  return st;
}

TextStream::TextStream(const model::Tokenizer& tok, std::vector<int> context, std::vector<std::string> stop,
                       bool include_stop, int min_tokens)
    : tok_(tok), context_(std::move(context)), stop_(std::move(stop)), include_stop_(include_stop),
      min_tokens_(min_tokens) {}

std::string TextStream::decoded() const {
  // Decode with the prompt in front so that rules that depend on the
  // previous token (a leading space after BOS) apply as they would in one
  // pass, then cut the prompt's text off.
  // SentencePiece drops the dummy-prefix space of the first piece; llama.cpp
  // only does so without a leading BOS, so decode without it (run.c's rule
  // for llama2.c tokenizers needs the BOS and keeps it).
  std::vector<int> head_ids = context_;
  if (tok_.kind() != model::Tokenizer::Kind::llama2c && !head_ids.empty() && head_ids[0] == tok_.bos())
    head_ids.erase(head_ids.begin());
  std::vector<int> all = head_ids;
  all.insert(all.end(), out_.begin(), out_.end());
  // Without the BPE clean-up of spaces: it would rewrite text already
  // sent (" " then "." becomes "."), and the stream would lose bytes.
  std::string full = tok_.decode(all, true, false, false);
  std::string head = tok_.decode(head_ids, true, false, false);
  return full.compare(0, head.size(), head) == 0 ? full.substr(head.size()) : tok_.decode(out_, true, false, false);
}

namespace {

/// Length of the longest prefix of s that ends on a whole UTF-8 character.
std::size_t utf8_complete(const std::string& s) {
  std::size_t n = s.size(), i = n;
  for (int back = 0; back < 4 && i > 0; ++back) {
    unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) {
      std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
      return (n - (i - 1) >= len) ? n : i - 1;
    }
    --i;
  }
  return n;
}

}  // namespace

std::string TextStream::push(int token) {
  if (stopped_) return "";
  out_.push_back(token);
  std::string text = decoded();
  const bool may_stop = static_cast<int>(out_.size()) > min_tokens_;
  // Before min_tokens nothing is held back, so the search starts at the
  // text not yet released (a stop string inside released text cannot end it).
  for (const auto& s : may_stop ? stop_ : std::vector<std::string>{}) {
    auto at = s.empty() ? std::string::npos : text.find(s, std::min(search_from_, text.size()));
    if (at != std::string::npos) {
      stopped_ = true;
      const std::size_t end = include_stop_ ? at + s.size() : at;
      std::string rest = end > emitted_ ? text.substr(emitted_, end - emitted_) : "";
      emitted_ = end;
      return rest;
    }
  }
  // Hold back what could still become the start of a stop string.
  std::size_t safe = utf8_complete(text);
  if (!may_stop) {
    if (safe <= emitted_) return "";
    std::string piece = text.substr(emitted_, safe - emitted_);
    emitted_ = search_from_ = safe;
    return piece;
  }
  for (const auto& s : stop_)
    for (std::size_t k = std::min(s.size() - 1, safe); k > 0; --k)
      if (text.compare(safe - k, k, s, 0, k) == 0) {
        safe -= k;
        break;
      }
  if (safe <= emitted_) return "";
  std::string piece = text.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return piece;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  std::string text = decoded();
  std::string rest = text.size() > emitted_ ? text.substr(emitted_) : "";
  emitted_ = text.size();
  return rest;
}

bool EndOfGeneration::ends(int token) const {
  return token == eos || std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end();
}

EndOfGeneration end_of_generation(const model::Model& model, const model::Tokenizer& tok) {
  EndOfGeneration e;
  e.eos = model.format == "llama2c" ? tok.bos() : tok.eos();
  for (int id = 0; id < tok.n_vocab(); ++id)
    if (tok.is_eog(id) && id != e.eos) e.stop_tokens.push_back(id);
  return e;
}

std::string generate_once(const model::Model& model, const GenerateOptions& o,
                          const std::function<void(std::string_view)>& on_text) {
  if (o.gear.dp != 1) throw InputError("--gear: dp=" + std::to_string(o.gear.dp) + ": one-shot generation runs one replica (dp=1)");
  if (o.max_tokens < 1) throw InputError("--max-tokens: must be positive, got " + std::to_string(o.max_tokens));
  const std::shared_ptr<const model::Tokenizer> tok_of = model::tokenizer_of(model);
  const model::Tokenizer& tok = *tok_of;
  std::vector<int> prompt;
  try {
    prompt = tok.encode_prompt(o.prompt);
  } catch (const InputError& e) {
    throw InputError(std::string("--prompt: ") + e.what() + "; give a prompt");
  }
  engine::WeightStore store(model);
  engine::DomainConfig cfg;
  cfg.id = "oneshot";
  cfg.stages = even_stages(model.hparams.n_layer, o.gear.tp, o.gear.pp);
  cfg.micro_batches = 1;
  cfg.backend = &engine::backend_named(o.backend);
  const int positions =
      engine::peak_kv_tokens(static_cast<std::int64_t>(prompt.size()), o.max_tokens, model.hparams.n_ctx_train);
  cfg.kv_blocks = (positions + cfg.block_tokens - 1) / cfg.block_tokens;
  engine::Domain domain(store, cfg);

  TextStream stream(tok, prompt, o.stop);
  std::string text, error;
  engine::GenerationRequest r;
  r.id = "oneshot";
  r.prompt = prompt;
  r.sampling = o.sampling;
  r.max_tokens = std::min(o.max_tokens, model.hparams.n_ctx_train - static_cast<int>(prompt.size()));
  if (r.max_tokens < 1)
    throw InputError("--prompt: " + std::to_string(prompt.size()) + " tokens fill the model's context of " +
                     std::to_string(model.hparams.n_ctx_train));
  const EndOfGeneration eog = end_of_generation(model, tok);
  r.eos = eog.eos;
  r.stop_tokens = eog.stop_tokens;
  // Every token that does not end the generation passes the stop check
  // first (on the domain's thread, before its event): the text stream sees
  // it there, so a stop string ends the request at the token that made it.
  r.stop_check = [&](int, const std::vector<int>& out) {
    stream.feed(out.back());
    return stream.stopped();
  };
  r.on_event = [&](const engine::GenerationEvent& e) {
    if (e.token >= 0 && !eog.ends(e.token)) {
      std::string piece = stream.take();
      text += piece;
      if (!piece.empty()) on_text(piece);
    }
    if (e.finished) {
      if (e.finish_reason == engine::FinishReason::error) error = e.error;
      std::string rest = stream.finish();
      text += rest;
      if (!rest.empty()) on_text(rest);
    }
  };
  domain.submit(std::move(r));
  while (!domain.idle()) domain.step();
  if (!error.empty()) throw Error(error);
  return text;
}

}  // namespace ftp::serve
