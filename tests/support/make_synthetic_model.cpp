// SPDX-License-Identifier: Apache-2.0
// synthetic-model: writes a synthetic Llama GGUF (seeded random weights, a
// SentencePiece-style byte vocabulary; tests/support/synthetic_gguf.hpp).
// The build writes one of stories260K's shape (5 layers, 64 wide, 8 heads,
// 4 KV heads), so that shell/quickstart serves and shifts on a fresh clone
// without ../shared: examples/gears/stories260K-cpu.json fits it. Its text
// is noise, not stories: the weights are random.
#include "cli/tool.hpp"
#include "synthetic_gguf.hpp"

int main(int argc, char** argv) {
  ftp::cli::Tool tool("synthetic-model",
                      "Write a synthetic Llama GGUF with seeded random weights (F32); the default shape is\n"
                      "stories260K's. Its outputs are noise: for demos and tests of serving, never of quality.");
  ftp::testing::SyntheticShape s;
  s.n_layer = 5;
  s.n_embd = 64;
  s.n_ff = 172;
  s.n_head = 8;
  s.n_head_kv = 4;
  s.n_vocab = 512;
  s.n_ctx = 512;
  s.stddev = 0.1f;
  std::string out;
  auto& app = tool.app();
  app.add_option("-o,--out", out, "GGUF file to write")->required()->option_text("PATH");
  app.add_option("--layers", s.n_layer, "Layers (default 5)")->check(ftp::cli::in_range(1, 256));
  app.add_option("--seed", s.seed, "Seed of the weights (default 1)");
  return tool.run(argc, argv, [&]() -> int {
    ftp::testing::write_synthetic_gguf(out, s);
    tool.emit({{"kind", "ftp.synthetic-model/v1"}, {"path", out}, {"n_layer", s.n_layer}, {"seed", s.seed}});
    return 0;
  });
}
