// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "engine/rank_backend.hpp"
#include "engine/weight_store.hpp"

/// llama.cpp's reference outputs on the synthetic architecture and
/// quantization models of ../shared/data/models/arch-refs (see its README):
/// reading references.jsonl, and the comparison rules of issue 19 ("What it
/// must show"): first-step logits within a relative error, greedy tokens
/// equal except where the engine took llama.cpp's runner-up at a near-tie.
namespace ftp::test {

/// The folder of the arch-refs models ($FTP_TEST_DATA/models/arch-refs).
std::string arch_refs_dir();

/// One line of references.jsonl: a (model, prompt) pair.
struct LlamaRef {
  std::string model;                ///< GGUF file name inside arch_refs_dir()
  std::string prompt;               ///< prompt text
  std::vector<int> prompt_tokens;   ///< llama.cpp's tokenization (BOS first)
  std::vector<int> tokens;          ///< 32 greedy ids, no stop at EOS
  std::vector<float> logits_first;  ///< all n_vocab logits of the first generated position (6 digits)
  std::vector<float> margins;       ///< top-1 minus top-2 logit at each step
  std::vector<int> runner_up;       ///< the top-2 id at each step
};

/// The lines of a references file (references.jsonl or
/// references_serial_prompt.jsonl); throws ftp::InputError naming the file,
/// the line and the field when one is malformed or the arrays disagree in length.
std::vector<LlamaRef> read_llama_refs(const std::string& path);

/// The lines of `refs` for model file `model`, in file order.
std::vector<LlamaRef> refs_of_model(const std::vector<LlamaRef>& refs, const std::string& model);

/// How close an engine must come to llama.cpp on one model file.
struct RefTolerance {
  double logit_rel = 1e-4;  ///< max |diff| / max |logit| of the first-step logits
  double tie = 1e-3;        ///< a divergence is excused where llama.cpp's margin is below this
};

/// F32 weights: llama.cpp does plain F32 dot products (1e-4, ties 1e-3).
inline constexpr RefTolerance kF32Tolerance{1e-4, 1e-3};
/// BF16 and quantized weights with the engine's float activations:
/// llama.cpp rounds or quantizes the activations first (3e-2, ties 0.1).
inline constexpr RefTolerance kReducedTolerance{3e-2, 0.1};

/// max |ref[i] - got[i]| / max |ref[i]|; infinity where the sizes differ.
double relative_logit_error(const std::vector<float>& ref, const std::vector<float>& got);

/// Compares greedy tokens with the reference: "" when they are equal, or
/// when the first divergence is at a step where `got` took the reference's
/// runner-up and the reference margin there is below `tie` (the rest of the
/// sequence then legitimately differs). Otherwise a one-line reason naming
/// the step, both ids and the margin. `excused` (optional) is set to the
/// step of an excused divergence, or -1.
std::string compare_greedy(const LlamaRef& ref, const std::vector<int>& got, double tie, int* excused = nullptr);

/// What a model file's weights are, which sets its tolerance.
enum class RefWeights {
  f32,      ///< kF32Tolerance
  reduced,  ///< BF16 or quantized matrices: kReducedTolerance
};

/// One model file of arch-refs that the engine supports.
struct RefModel {
  const char* file;    ///< GGUF file name inside arch_refs_dir()
  RefWeights weights;
};

/// The arch-refs model files the engine supports, one line each in
/// llama_refs.cpp: adding a file there adds it to the CPU test (and, for
/// f32 files, to the GPU suite's).
const std::vector<RefModel>& supported_ref_models();

RefTolerance tolerance_of(RefWeights w);

/// A gear to check a model at: stages over its layers.
struct RefGear {
  std::string name;
  std::vector<engine::StageLayout> stages;
};

/// TP 1; the largest TP whose ranks each hold whole KV heads (it divides
/// n_head and n_head_kv) with one stage per layer (the largest PP); and,
/// where n_head allows more ranks than KV heads, TP n_head with the KV
/// heads replicated (one stage).
std::vector<RefGear> ref_gears(const model::HParams& hp);

/// ref_gears of the store's model, each at the largest TP up to its own
/// that the store's weights allow (WeightStore refuses a row-parallel split
/// inside a quantization block, e.g. TP 2 of a Q4_K attn_output of 256
/// columns): the largest TP x PP the shapes allow. Gears that come out
/// equal are kept once.
std::vector<RefGear> ref_gears(const engine::WeightStore& store);

/// What the engine gave on one reference (one prompt at one gear).
struct RefOutcome {
  std::vector<float> logits_first;  ///< logits after the prompt
  std::vector<int> tokens;          ///< greedy ids, as many as the reference's
  double logit_error = 0;           ///< relative_logit_error against llama.cpp
  std::string token_failure;        ///< compare_greedy's reason; "" when they agree
  int excused_step = -1;            ///< a near-tie divergence's step, or -1
  std::string tokenize_failure;     ///< "" when the model's tokenizer gives prompt_tokens
};

/// Runs `ref` on a domain of gear `gear` over `store` (backend null: the
/// CPU): the prompt tokens prefilled in one batch, then greedy decoding
/// (argmax, lowest id on ties, no stop at EOS) of as many tokens as the
/// reference has; compares with llama.cpp under `tol`.
RefOutcome run_llama_ref(const engine::WeightStore& store, const RefGear& gear, const LlamaRef& ref,
                         const RefTolerance& tol, engine::Backend* backend = nullptr);

}  // namespace ftp::test
