// SPDX-License-Identifier: Apache-2.0
// What every engine shares: the checks of a forward's chunks, its split into
// micro-batches, and (for the backends) the layout of a micro-batch's rows.
#include "engine/engine.hpp"

#include <algorithm>
#include <map>

#include "hardware/cpu/cpu_info.hpp"
#include "hardware/cpu/virtual_device.hpp"
#include "core/error.hpp"
#include "engine/rank_backend.hpp"

namespace ftp::engine {

void check_chunks(const std::vector<SeqChunk>& chunks, int n_vocab, int block_tokens, const std::string& who) {
  for (const auto& c : chunks) {
    if (c.tokens.empty()) throw Error(who + ": an empty chunk");
    const int need = (c.start_pos + static_cast<int>(c.tokens.size()) + block_tokens - 1) / block_tokens;
    if (!c.blocks || static_cast<int>(c.blocks->size()) < need)
      throw Error(who + ": chunk at position " + std::to_string(c.start_pos) + " lacks KV blocks");
    for (int t : c.tokens)
      if (t < 0 || t >= n_vocab)
        throw InputError("token id " + std::to_string(t) + " out of the vocabulary (" + std::to_string(n_vocab) + ")");
  }
}

void micro_batch_indices(const std::vector<SeqChunk>& chunks, int micro_batches, std::vector<int>& out) {
  out.clear();
  int total = 0;
  for (const auto& c : chunks) total += static_cast<int>(c.tokens.size());
  const int m = std::max(1, std::min<int>(micro_batches, static_cast<int>(chunks.size())));
  // A chunk opens the next group when its middle lies past the current
  // group's share of the tokens (group idx ends near (idx + 1) x total / m):
  // a large prefill after many decodes gets a group of its own instead of
  // joining theirs. In integers: 2 acc + n > 2 (idx + 1) total / m. The
  // first chunk opens group 0, and a group opens only after the current
  // one has a chunk: none is empty.
  long long acc = 0;
  int idx = 0;
  for (const auto& c : chunks) {
    const long long n = static_cast<long long>(c.tokens.size());
    if (idx < m - 1 && !out.empty() && (2 * acc + n) * m > 2LL * (idx + 1) * total) ++idx;
    out.push_back(idx);
    acc += n;
  }
}

std::vector<std::vector<const SeqChunk*>> split_micro_batches(const std::vector<SeqChunk>& chunks, int micro_batches) {
  std::vector<int> index;
  micro_batch_indices(chunks, micro_batches, index);
  std::vector<std::vector<const SeqChunk*>> groups(index.empty() ? 0 : static_cast<std::size_t>(index.back()) + 1);
  for (std::size_t k = 0; k < chunks.size(); ++k) groups[static_cast<std::size_t>(index[k])].push_back(&chunks[k]);
  return groups;
}

BatchLayout make_batch_layout(const std::vector<const SeqChunk*>& chunks, int block_tokens) {
  BatchLayout b;
  b.n_seq = static_cast<int>(chunks.size());
  b.decode_only = true;
  for (const SeqChunk* c : chunks) {
    b.max_blocks = std::max(b.max_blocks, static_cast<int>(c->blocks->size()));
    if (c->tokens.size() != 1) b.decode_only = false;
  }
  b.block_table.assign(static_cast<std::size_t>(b.n_seq) * b.max_blocks, -1);
  for (int s = 0; s < b.n_seq; ++s) {
    const SeqChunk& c = *chunks[static_cast<std::size_t>(s)];
    std::copy(c.blocks->begin(), c.blocks->end(), b.block_table.begin() + static_cast<std::ptrdiff_t>(s) * b.max_blocks);
    for (std::size_t i = 0; i < c.tokens.size(); ++i) {
      int pos = c.start_pos + static_cast<int>(i);
      b.tokens.push_back(c.tokens[i]);
      b.pos.push_back(pos);
      b.seq.push_back(s);
      b.slot.push_back((*c.blocks)[static_cast<std::size_t>(pos / block_tokens)] * block_tokens + pos % block_tokens);
      b.max_pos = std::max(b.max_pos, pos + 1);
    }
    if (c.want_logits) b.logit_rows.push_back(static_cast<int>(b.tokens.size()) - 1);
  }
  b.n_rows = static_cast<int>(b.tokens.size());
  return b;
}

std::vector<std::vector<int>> resolve_rank_threads(const std::vector<StageLayout>& stages) {
  std::map<const hardware::VirtualDevice*, int> ranks_on;  // the domain's ranks on each device
  auto device_of = [](const StageLayout& l, int r) -> const hardware::VirtualDevice* {
    return static_cast<std::size_t>(r) < l.devices.size() ? l.devices[static_cast<std::size_t>(r)] : nullptr;
  };
  for (const StageLayout& l : stages)
    for (int r = 0; r < l.tp; ++r) {
      if (const auto* d = device_of(l, r)) ++ranks_on[d];
    }
  std::vector<std::vector<int>> out;
  for (const StageLayout& l : stages) {
    std::vector<int> t;
    for (int r = 0; r < l.tp; ++r) {
      int n = l.rank_threads;
      if (n <= 0) {
        const hardware::VirtualDevice* d = device_of(l, r);
        n = d ? d->threads() / ranks_on[d] : 1;
      }
      t.push_back(std::max(1, n));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<RankSpec> stage_rank_specs(const StageLayout& l, int stage, int n_stages, int kv_blocks, int block_tokens,
                                       int max_rows, const std::vector<int>& threads) {
  std::vector<RankSpec> specs;
  for (int r = 0; r < l.tp; ++r) {
    RankSpec rs;
    rs.stage = stage;
    rs.rank = r;
    rs.tp = l.tp;
    rs.first_layer = l.first_layer;
    rs.n_layers = l.n_layers;
    rs.first_stage = stage == 0;
    rs.last_stage = stage + 1 == n_stages;
    rs.kv_blocks = kv_blocks;
    rs.block_tokens = block_tokens;
    rs.max_rows = max_rows;
    rs.kv_dtype = l.kv_dtype;
    if (!l.devices.empty()) rs.device = l.devices[static_cast<std::size_t>(r)];
    if (!l.gpus.empty()) rs.gpu = l.gpus[static_cast<std::size_t>(r)];
    if (static_cast<std::size_t>(r) < threads.size()) rs.threads = threads[static_cast<std::size_t>(r)];
    specs.push_back(rs);
  }
  return specs;
}

void check_choices(std::size_t choices, std::size_t rows, const std::string& who) {
  if (choices != rows)
    throw Error(who + ": " + std::to_string(choices) + " choices for " + std::to_string(rows) +
                " chunks that want logits");
}

std::vector<int> Engine::forward_choose(const std::vector<SeqChunk>& chunks, int micro_batches,
                                        const std::vector<TokenChoice>& choices) {
  auto logits = forward(chunks, micro_batches);
  check_choices(choices.size(), logits.size(), "forward_choose");
  std::vector<int> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = choose_token(logits[i].data(), logits[i].size(), choices[i]);
  recycle(std::move(logits));
  return out;
}

std::vector<int> Engine::forward_choose_logprobs(const std::vector<SeqChunk>& chunks, int micro_batches,
                                                 const std::vector<TokenChoice>& choices,
                                                 std::vector<TokenLogprobs>& logprobs) {
  auto logits = forward(chunks, micro_batches);
  check_choices(choices.size(), logits.size(), "forward_choose_logprobs");
  std::vector<int> out(logits.size());
  logprobs.assign(logits.size(), TokenLogprobs{});
  for (std::size_t i = 0; i < logits.size(); ++i) {
    out[i] = choose_token(logits[i].data(), logits[i].size(), choices[i]);
    if (choices[i].logprobs >= 0)
      logprobs[i] = token_logprobs(logits[i].data(), logits[i].size(), out[i], choices[i].logprobs);
  }
  recycle(std::move(logits));
  return out;
}

}  // namespace ftp::engine

namespace ftp::engine {

std::vector<std::unique_ptr<RankBackend>> Backend::make_stage_ranks(const WeightStore&, const std::vector<RankSpec>&,
                                                                    std::shared_ptr<comm::Collective>) {
  throw BackendError("backend " + name() + ": cannot run a stage whose ranks are in other processes");
}

}  // namespace ftp::engine
