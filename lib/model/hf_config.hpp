// SPDX-License-Identifier: Apache-2.0
#pragma once

// config.json of a Hugging Face model folder, read into the engine's
// hyper-parameters: the architecture (architectures[0], one of the loader's
// table in model/arch.hpp), sizes, RMSNorm epsilon, RoPE base and scaling.
// Errors (ftp::InputError) name the file and the field.

#include <string>
#include <vector>

#include "core/json.hpp"
#include "model/arch.hpp"
#include "model/model.hpp"

namespace ftp::model {

struct HfConfig {
  const ArchSpec* arch = nullptr;
  HParams hparams;           ///< rope_type as the engine applies it to HF's row order (see hf_folder.hpp)
  bool tie_word_embeddings = false;
  int bos = -1, eos = -1;    ///< bos_token_id / eos_token_id; -1 when absent
  /// Llama 3 RoPE scaling (rope_scaling.rope_type "llama3"): the divisor of
  /// each pair's frequency, computed as llama.cpp's converter does
  /// (LlamaModel.generate_extra_tensors); empty without scaling.
  std::vector<float> rope_freqs;
};

/// Reads a parsed config.json; `path` names it in errors.
HfConfig hf_config_from_json(const json::Json& doc, const std::string& path);

/// Reads config.json at `path`.
HfConfig read_hf_config(const std::string& path);

}  // namespace ftp::model
