// SPDX-License-Identifier: Apache-2.0
// ftp-serve: serve a model. This build offers the one-shot mode: generate
// one completion for --prompt and exit.
#include <iostream>

#include "cli/tool.hpp"
#include "core/error.hpp"
#include "model/model.hpp"
#include "serve/generate.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("ftp-serve",
                      "Serve a Llama-family model (GGUF or llama2.c) on CPU virtual devices.\n"
                      "One-shot mode: with --prompt, generate one completion, print only its text on\n"
                      "stdout, and exit. The daemon mode (HTTP API, control socket) is not in this build.");
  std::string model_path, tokenizer_path, gear = "tp=1,pp=1", prompt;
  bool have_prompt = false;
  ftp::serve::GenerateOptions o;
  auto& app = tool.app();
  app.add_option("-m,--model", model_path, "Model file: GGUF v3, or a llama2.c checkpoint (.bin)")
      ->required()
      ->option_text("PATH");
  app.add_option("--tokenizer", tokenizer_path,
                 "llama2.c tokenizer.bin (default: tokenizer.bin or tok<vocab>.bin beside the model)")
      ->option_text("PATH");
  app.add_option("--gear", gear, "Parallel layout: tp=T,pp=P (default tp=1,pp=1)")->option_text("tp=T,pp=P");
  app.add_option("-p,--prompt", prompt, "Generate one completion of TEXT and exit ('' means BOS only)")
      ->option_text("TEXT")
      ->each([&](const std::string&) { have_prompt = true; });
  app.add_option("-n,--max-tokens", o.max_tokens, "Tokens to generate at most (default 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("-t,--temperature", o.sampling.temperature, "Sampling temperature; 0 is greedy (default 0)")
      ->check(CLI::Range(0.0f, 100.0f));
  app.add_option("--top-k", o.sampling.top_k, "Sample among the K most likely tokens (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", o.sampling.top_p, "Sample from the smallest set of mass P (1: off)")
      ->check(CLI::Range(0.0f, 1.0f));
  app.add_option("-s,--seed", o.sampling.seed, "Random seed of the sampler (default 0)");
  app.add_option("--stop", o.stop, "Stop before this text (repeatable)")->option_text("TEXT");

  return tool.run(argc, argv, [&]() -> int {
    if (!have_prompt)
      throw ftp::InputError("--prompt is required: this build of ftp-serve offers the one-shot mode only");
    o.gear = ftp::serve::parse_gear_spec(gear);
    o.prompt = prompt;
    ftp::model::Model model = ftp::model::load_model(model_path, tokenizer_path);
    bool json = !tool.app().get_option("--json")->empty();
    std::string text = ftp::serve::generate_once(model, o, [&](std::string_view piece) {
      if (!json) std::cout << piece << std::flush;
    });
    if (json)
      tool.emit(ftp::json::Json{{"kind", "ftp.completion/v1"}, {"model", model_path}, {"gear", gear}, {"text", text}});
    else
      std::cout << "\n" << std::flush;
    return 0;
  });
}
