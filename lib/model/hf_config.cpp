// SPDX-License-Identifier: Apache-2.0
#include "model/hf_config.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/escape.hpp"

namespace ftp::model {

namespace {

/// A positive int field below a sanity limit.
int need_int(const json::Node& n, const char* key, std::int64_t lim) {
  const std::int64_t v = n.integer(key);
  if (v <= 0 || v > lim) n.at(key).fail("must be in 1.." + std::to_string(lim) + ", got " + std::to_string(v));
  return static_cast<int>(v);
}

/// Llama 3's frequency divisors, as convert_hf_to_gguf.py computes them.
std::vector<float> llama3_factors(const json::Node& rs, float base, int dim) {
  const double factor = rs.number_or("factor", 8.0);
  const double low = rs.number_or("low_freq_factor", 1.0);
  const double high = rs.number_or("high_freq_factor", 4.0);
  const double old_ctx = rs.number_or("original_max_position_embeddings", 8192);
  if (!(factor > 0) || !(low > 0) || !(high > low) || !(old_ctx > 0))
    rs.fail("llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings > 0");
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> out;
  for (int i = 0; i < dim; i += 2) {
    // torch.float32 in the converter: 1 / base ** (i / dim).
    const float freq = 1.0f / std::pow(base, static_cast<float>(i) / static_cast<float>(dim));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) out.push_back(1.0f);
    else if (wavelen > low_wavelen) out.push_back(static_cast<float>(factor));
    else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

HfConfig parse(const json::Node& root) {
  root.expect_object();
  HfConfig c;
  const json::Node archs = root.at("architectures");
  archs.expect_array();
  if (archs.items().empty()) archs.fail("empty: expected one of " + arch_names(true));
  const std::string cls = archs.items()[0].str();
  c.arch = find_arch(cls, true);
  if (!c.arch)
    archs.items()[0].fail("unsupported architecture '" + printable(cls) + "' (supported: " + arch_names(true) + ")");
  HParams& h = c.hparams;
  h.arch = c.arch->name;
  h.name = root.str_or("_name_or_path", "");
  h.n_embd = need_int(root, "hidden_size", 1 << 20);
  h.n_ff = need_int(root, "intermediate_size", 1 << 22);
  h.n_layer = need_int(root, "num_hidden_layers", 4096);
  h.n_head = need_int(root, "num_attention_heads", 1 << 16);
  h.n_head_kv = root.has("num_key_value_heads") ? need_int(root, "num_key_value_heads", 1 << 16) : h.n_head;
  if (h.n_head % h.n_head_kv != 0)
    root.at("num_key_value_heads").fail(std::to_string(h.n_head_kv) + " does not divide num_attention_heads " +
                                        std::to_string(h.n_head));
  if (root.has("head_dim")) {
    h.head_dim = need_int(root, "head_dim", 1 << 16);
  } else {
    if (h.n_embd % h.n_head != 0)
      root.at("num_attention_heads").fail(std::to_string(h.n_head) + " does not divide hidden_size " +
                                          std::to_string(h.n_embd));
    h.head_dim = h.n_embd / h.n_head;
  }
  if (h.head_dim % 2 != 0) root.fail("head_dim " + std::to_string(h.head_dim) + " must be even for RoPE");
  h.n_rot = h.head_dim;
  h.n_vocab = need_int(root, "vocab_size", 1 << 24);
  h.n_ctx_train = need_int(root, "max_position_embeddings", 1 << 30);
  const double eps = root.number("rms_norm_eps");
  if (!(eps > 0 && eps < 1)) root.at("rms_norm_eps").fail("must be in (0, 1)");
  h.rms_eps = static_cast<float>(eps);
  const double theta = root.number_or("rope_theta", 10000.0);
  if (!(theta > 0 && theta < 1e12)) root.at("rope_theta").fail("must be positive");
  h.rope_theta = static_cast<float>(theta);
  // HF keeps Q/K rows in rotate-half order; see hf_folder.hpp.
  h.rope_type = RopeType::neox;
  const std::string act = root.str_or("hidden_act", "silu");
  if (act != "silu") root.at("hidden_act").fail("unsupported activation '" + printable(act) + "' (supported: silu)");
  c.tie_word_embeddings = root.boolean_or("tie_word_embeddings", false);
  h.tied_output = c.tie_word_embeddings;
  if (const auto rs = root.find("rope_scaling")) {
    rs->expect_object();
    const std::string type = rs->has("rope_type") ? rs->str("rope_type") : rs->str_or("type", "default");
    if (type == "llama3") {
      if (!(c.arch->optional & kRopeFreqs) && !(c.arch->required & kRopeFreqs))
        rs->fail("llama3 scaling is not used by architecture " + std::string(c.arch->name));
      c.rope_freqs = llama3_factors(*rs, h.rope_theta, h.n_rot);
    } else if (type != "default") {
      rs->fail("unsupported RoPE scaling '" + printable(type) + "' (supported: llama3)");
    }
  }
  auto id = [&](const char* key) -> int {
    const auto n = root.find(key);
    if (!n || !n->value().is_number_integer()) return -1;  // a list (several EOS) is not an id
    const std::int64_t v = n->integer();
    if (v < 0 || v >= h.n_vocab) n->fail("token id " + std::to_string(v) + " outside the vocabulary");
    return static_cast<int>(v);
  };
  c.bos = id("bos_token_id");
  c.eos = id("eos_token_id");
  return c;
}

}  // namespace

HfConfig hf_config_from_json(const json::Json& doc, const std::string& path) {
  try {
    return parse(json::Node(doc, ""));
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

HfConfig read_hf_config(const std::string& path) {
  json::Json doc;
  try {
    doc = json::parse(json::read_text(path), path);
  } catch (const InputError& e) {
    const std::string what = e.what();
    throw InputError(what.rfind(path, 0) == 0 ? what : path + ": " + what);
  }
  return hf_config_from_json(doc, path);
}

}  // namespace ftp::model
