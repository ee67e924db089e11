// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "engine/domain.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"

namespace ftp::serve {

/// A gear as given on the command line: "tp=2,pp=1,dp=1" (any order, each
/// optional, default 1).
struct GearSpec {
  int tp = 1, pp = 1, dp = 1;
};

/// Parses "tp=T,pp=P,dp=D"; errors name the bad part ("--gear: pp=x: expected a positive integer").
GearSpec parse_gear_spec(std::string_view text);

/// Pipeline stages of one replica: `pp` contiguous layer ranges as even as
/// possible (earlier stages one layer larger when pp does not divide).
std::vector<engine::StageLayout> even_stages(int n_layer, int tp, int pp);

/// How generation ends for a model: `eos` (BOS for llama2.c models, as in
/// run.c; the tokenizer's EOS otherwise) and the other end-of-generation
/// tokens of the vocabulary. Scans the vocabulary: compute it once per model.
struct EndOfGeneration {
  int eos = -1;
  std::vector<int> stop_tokens;
  bool ends(int token) const;
};
EndOfGeneration end_of_generation(const model::Model& model, const model::Tokenizer& tok);

/// One completion without a daemon: what `ftp-serve --prompt` does.
struct GenerateOptions {
  GearSpec gear;
  std::string backend = "cpu";     ///< "cpu" or "cuda" (all ranks on CUDA device 0)
  std::string prompt;              ///< "" means BOS only
  int max_tokens = 256;
  engine::SamplingParams sampling;
  std::vector<std::string> stop;   ///< stop strings; the text ends before the first one
};

/// Text that a stream of tokens decodes to, released as it becomes final:
/// whole UTF-8 characters only, and never past a possible stop string.
class TextStream {
 public:
  /// `include_stop`: the text goes on through the stop string that ends it
  /// (vLLM's include_stop_str_in_output). `min_tokens`: stop strings count
  /// only once more than this many tokens were pushed (as vLLM), and only in
  /// text after what was released by then.
  TextStream(const model::Tokenizer& tok, std::vector<int> context, std::vector<std::string> stop,
             bool include_stop = false, int min_tokens = 0);
  /// Adds a token; returns the newly final text (maybe empty). Sets stopped()
  /// when the text reached a stop string.
  std::string push(int token);
  /// push() for a domain's stop check, which sees each token before its
  /// event is delivered: the text is kept for take(), and stopped() is
  /// already true for the token that reached a stop string (the domain
  /// then ends the request at that token, not one step later).
  void feed(int token) { ready_ += push(token); }
  /// The text fed since the last take().
  std::string take() { return std::exchange(ready_, std::string()); }
  /// The rest of the text at the end of generation.
  std::string finish();
  bool stopped() const noexcept { return stopped_; }

 private:
  std::string decoded() const;
  const model::Tokenizer& tok_;
  std::vector<int> context_;       // prompt tokens: decoding starts after them
  std::vector<int> out_;
  std::vector<std::string> stop_;
  bool include_stop_ = false;
  int min_tokens_ = 0;
  std::size_t emitted_ = 0;
  std::size_t search_from_ = 0;    // where stop strings are looked for
  bool stopped_ = false;
  std::string final_;
  std::string ready_;              // fed, not yet taken
};

/// Tokenises the prompt (BOS per the tokenizer), runs one domain of the
/// gear over the model, and streams the completion text to `on_text`.
/// Returns the whole completion. Errors: ftp::InputError for bad options.
std::string generate_once(const model::Model& model, const GenerateOptions& opts,
                          const std::function<void(std::string_view)>& on_text);

}  // namespace ftp::serve
