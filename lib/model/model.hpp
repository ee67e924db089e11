// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ftp::model {

/// Element types of weight tensors we load: floats, and ggml's block
/// quantizations (layouts in model/quant.hpp): Q8_0, the legacy Q4_0, Q4_1,
/// Q5_0, Q5_1 (blocks of 32) and the K-quants Q2_K..Q6_K (blocks of 256).
enum class DType { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k };

/// "Q4_K" etc., as ggml names the type.
const char* dtype_name(DType t) noexcept;

/// Weights per block of t: 1 for F32, F16 and BF16, 32 for Q8_0 and the
/// legacy quants, 256 for the K-quants. A row of a quantized tensor holds
/// whole blocks (the loader refuses others).
int dtype_block(DType t) noexcept;

/// Bytes of `n` elements of type t (n a multiple of dtype_block(t); for
/// example Q8_0: blocks of 32 int8 + one f16 scale = 34 bytes).
std::size_t dtype_bytes(DType t, std::int64_t n);

/// A read-only view of one tensor inside the loaded file (memory-mapped).
/// Matrices are row-major [rows][cols] = [out_features][in_features], which
/// is how both GGUF (ne[0] = cols, fastest) and llama2.c store them.
struct TensorView {
  std::string name;
  DType dtype = DType::f32;
  std::int64_t rows = 1;            ///< 1 for vectors
  std::int64_t cols = 0;            ///< elements per row (the fastest dimension)
  const void* data = nullptr;       ///< into the mapping; valid while the Model lives
  std::size_t bytes = 0;

  bool empty() const noexcept { return data == nullptr; }
  std::int64_t elements() const noexcept { return rows * cols; }
};

/// Converts `count` elements of a row-major tensor starting at element
/// `first` (a multiple of dtype_block: quantized types start on a block;
/// `count` may end inside one) to float32, bit-exact with ggml's
/// dequantize_row_* for the quantized types.
void to_f32(const TensorView& t, std::int64_t first, std::int64_t count, float* out);

/// How RoPE pairs the dimensions of a head. GGUF does not store it: the
/// loader chooses it from general.architecture, as llama.cpp's
/// llama_model_rope_type() does.
enum class RopeType {
  norm,  ///< adjacent pairs (x[2i], x[2i+1]): llama
  neox,  ///< halves (x[i], x[i + n_rot/2]): qwen2, qwen3 (GPT-NeoX style)
};

/// Hyper-parameters of a Llama-family model.
struct HParams {
  std::string arch = "llama";
  std::string name;
  int n_vocab = 0;
  int n_ctx_train = 0;      ///< context length the model was trained for
  int n_embd = 0;           ///< hidden size
  int n_ff = 0;             ///< feed-forward size
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;        ///< < n_head for grouped-query attention
  int head_dim = 0;         ///< n_embd / n_head unless the file says otherwise
  int n_rot = 0;            ///< rotary dimensions per head (usually head_dim)
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeType rope_type = RopeType::norm;
  bool tied_output = false; ///< the classifier is the token embedding
};

/// Weights of one transformer layer (all matrices [out][in]).
/// Rows of wq and wk are in the interleaved RoPE order of llama2.c and
/// Meta's checkpoints: within each head, elements (2i, 2i+1) form one rotated
/// pair. GGUF "llama" files use the same order (llama.cpp's converters permute
/// HF's rotate-half layout into it; its llama2.c converter copies unchanged),
/// so one RoPE serves both formats. qwen2 and qwen3 files keep HF's
/// rotate-half rows: HParams::rope_type says neox and RoPE pairs (i, i + n_rot/2).
struct LayerWeights {
  TensorView attn_norm;     ///< [n_embd]
  TensorView wq;            ///< [n_head*head_dim][n_embd]
  TensorView wk;            ///< [n_head_kv*head_dim][n_embd]
  TensorView wv;            ///< [n_head_kv*head_dim][n_embd]
  TensorView wo;            ///< [n_embd][n_head*head_dim]
  TensorView ffn_norm;      ///< [n_embd]
  TensorView w_gate;        ///< [n_ff][n_embd]  (llama2.c w1)
  TensorView w_down;        ///< [n_embd][n_ff]  (llama2.c w2)
  TensorView w_up;          ///< [n_ff][n_embd]  (llama2.c w3)
  // Optional, as the architecture says (empty when absent):
  TensorView bq;            ///< [n_head*head_dim] added after wq (qwen2)
  TensorView bk;            ///< [n_head_kv*head_dim] added after wk
  TensorView bv;            ///< [n_head_kv*head_dim] added after wv
  TensorView q_norm;        ///< [head_dim] RMSNorm of each query head before RoPE (qwen3)
  TensorView k_norm;        ///< [head_dim] RMSNorm of each key head before RoPE

  /// The seven matrices.
  std::array<const TensorView*, 7> matrices() const { return {&wq, &wk, &wv, &wo, &w_gate, &w_down, &w_up}; }
  /// Every tensor the layer has, norms and optional vectors included.
  std::vector<const TensorView*> tensors() const {
    std::vector<const TensorView*> out = {&attn_norm, &wq, &wk, &wv, &wo, &ffn_norm, &w_gate, &w_down, &w_up};
    for (const TensorView* t : {&bq, &bk, &bv, &q_norm, &k_norm})
      if (!t->empty()) out.push_back(t);
    return out;
  }
};

struct Weights {
  TensorView tok_embd;      ///< [n_vocab][n_embd]
  std::vector<LayerWeights> layers;
  TensorView output_norm;   ///< [n_embd]
  TensorView output;        ///< [n_vocab][n_embd]; equals tok_embd when tied
  /// [n_rot/2] Llama 3 RoPE scaling: pair i's frequency is divided by
  /// rope_freqs[i] (llama.cpp's freq_factors), in every layer; empty when absent.
  TensorView rope_freqs;
};

/// What a tokenizer needs, from GGUF metadata (tokenizer.ggml.*) or from a
/// llama2.c tokenizer.bin.
struct TokenizerData {
  std::string model;                 ///< "llama" (SentencePiece), "gpt2" (byte-level BPE), "llama2c"
  std::string pre;                   ///< GGUF tokenizer.ggml.pre ("default", "llama3", ...)
  std::vector<std::string> tokens;
  std::vector<float> scores;         ///< empty when absent
  std::vector<std::int32_t> types;   ///< token types (1 normal, 2 unknown, 3 control, 4 user, 6 byte); empty when absent
  std::vector<std::string> merges;   ///< BPE merges "a b"; empty when absent
  /// "llama" read from a Hugging Face tokenizer.json (BPE with byte
  /// fallback): pairs merge by their rank in `merges`, as HF's BPE does,
  /// not by the score of the merged token as SentencePiece (GGUF) does.
  bool merge_by_rank = false;
  int bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;
  int max_token_length = 0;          ///< llama2.c tokenizer.bin header
  std::string chat_template;         ///< tokenizer.chat_template; empty when absent
};

class Tokenizer;

/// A loaded model: hyper-parameters, weight views into the memory-mapped
/// file, tokenizer data. Move-only; views stay valid while it lives.
class Model {
 public:
  HParams hparams;
  Weights weights;
  TokenizerData tokenizer;
  std::string path;
  std::string format;                ///< "gguf", "llama2c" or "safetensors" (a Hugging Face folder)
  /// The tokenizer built from `tokenizer` by the loader, which refuses a
  /// vocabulary it cannot build; null for a model made in code (use
  /// tokenizer_of, which builds one then).
  std::shared_ptr<const Tokenizer> built_tokenizer;

  Model();
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  /// Keeps the mapping of the file alive (set by the loaders).
  std::shared_ptr<const void> mapping;
  /// True when the weight views point into a read-only private mapping of
  /// the file (load_model), so their pages can be dropped and re-read.
  bool weights_file_mapped = false;
};

/// Loads a model: a directory is a Hugging Face folder (model/hf_folder.hpp);
/// a file's format is told by its magic: GGUF v3 ("GGUF"), or a
/// llama2.c legacy float32 checkpoint (its tokenizer from `tokenizer_path`,
/// or tokenizer.bin / tok<vocab>.bin beside it). Errors (ftp::InputError)
/// name the file, the tensor and the reason: bad magic or version, truncated
/// file, tensor data out of bounds, unsupported type or architecture, shape
/// mismatch with the metadata.
Model load_model(const std::string& path, const std::string& tokenizer_path = "");

/// Builds the tokenizer of `data` (Tokenizer::from): the loaders call it so
/// that a bad vocabulary is refused with the file named (`source`: "PATH:
/// tokenizer: ..."), as the model's other errors are, and keep what it
/// built (Model::built_tokenizer).
std::shared_ptr<const Tokenizer> build_tokenizer(const TokenizerData& data, const std::string& source);

/// Reads only the tokenizer data: of a GGUF file (a full model or a
/// vocab-only GGUF, whatever its architecture), or of a llama2.c
/// tokenizer.bin (told apart by the GGUF magic; all its tokens up to the end
/// of the file). Errors (ftp::InputError) name the file and the key.
TokenizerData load_tokenizer_data(const std::string& path);

}  // namespace ftp::model
