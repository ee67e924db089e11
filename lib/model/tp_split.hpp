// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace ftp::model {

/// Which heads and feed-forward rows one tensor-parallel rank serves: the
/// one rule that the engine's views (engine::split_rank) and the planner's
/// byte counts (plan::shard_union_bytes) both follow, so that the bytes
/// planned for a device are the bytes its ranks read.
struct TpSplit {
  int q_begin = 0, q_end = 0;    ///< query heads [q_begin, q_end)
  int kv_begin = 0, kv_end = 0;  ///< KV heads read: split when tp <= n_head_kv, else the one head of its query heads
  int ff_begin = 0, ff_end = 0;  ///< feed-forward rows, as even as possible (the first n_ff % tp ranks one larger)
};

/// The split of rank `rank` of `tp` (0 <= rank < tp). Does not check that
/// tp divides the heads (engine::split_rank does, with the errors); with
/// n_head_kv <= 0 the KV range is empty.
TpSplit tp_split(int n_head, int n_head_kv, int n_ff, int tp, int rank) noexcept;

/// Rows [begin, end) of `n` that rank `rank` of `tp` holds, as even as
/// possible (the first n % tp ranks one row more): the feed-forward rows
/// of tp_split, and the vocabulary rows of the token embedding and the
/// output head (vocabulary-parallel embedding and head), so a vocabulary
/// that tp does not divide gives an uneven last shard.
struct RowSplit {
  int begin = 0, end = 0;
  int size() const noexcept { return end - begin; }
};
RowSplit row_split(int n, int tp, int rank) noexcept;

}  // namespace ftp::model
