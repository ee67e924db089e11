// SPDX-License-Identifier: Apache-2.0
#pragma once

// The architectures the loaders read, in one table: what each needs beyond
// llama's tensors (token embedding, output norm, the classifier unless tied,
// and per layer attention norm, Q/K/V/output, FFN norm, gate/up/down), its
// RoPE pairing, and the Hugging Face class (config.json "architectures")
// that names it in a safetensors folder. Both the GGUF loader (model.cpp)
// and the Hugging Face folder loader (hf_folder.cpp) read it.

#include <string>
#include <string_view>

#include "model/model.hpp"

namespace ftp::model {

/// Parts of a model beyond the tensors every architecture has.
enum ArchPart : unsigned {
  kQkvBias = 1u << 0,    ///< blk.N.attn_{q,k,v}.bias
  kQkNorm = 1u << 1,     ///< blk.N.attn_{q,k}_norm.weight
  kRopeFreqs = 1u << 2,  ///< rope_freqs.weight
};

/// What one architecture needs.
struct ArchSpec {
  const char* name;      ///< general.architecture
  const char* hf_class;  ///< config.json architectures[0]
  RopeType rope;         ///< not stored in GGUF: llama.cpp's llama_model_rope_type()
  unsigned required;     ///< ArchPart bits a file must have
  unsigned optional;     ///< ArchPart bits it may have
};

/// A tensor the file holds that its architecture does not use is refused, as
/// llama.cpp does, rather than ignored.
inline constexpr ArchSpec kArchitectures[] = {
    // Mistral-style files are llama with other hyper-parameters; Llama 3.x
    // carries its RoPE scaling in rope_freqs.weight (GGUF) or rope_scaling
    // of type llama3 (config.json).
    {"llama", "LlamaForCausalLM", RopeType::norm, 0, kQkvBias | kRopeFreqs},
    {"qwen2", "Qwen2ForCausalLM", RopeType::neox, kQkvBias, 0},
    {"qwen3", "Qwen3ForCausalLM", RopeType::neox, kQkNorm, 0},
};

/// The entry whose name (by_hf_class: whose hf_class) is `key`; null when none.
inline const ArchSpec* find_arch(std::string_view key, bool by_hf_class = false) {
  for (const ArchSpec& a : kArchitectures)
    if (key == (by_hf_class ? a.hf_class : a.name)) return &a;
  return nullptr;
}

/// "llama, qwen2, qwen3" (or the HF classes), for error messages.
inline std::string arch_names(bool hf_classes = false) {
  std::string s;
  for (const ArchSpec& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(hf_classes ? a.hf_class : a.name);
  return s;
}

}  // namespace ftp::model
