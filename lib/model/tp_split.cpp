// SPDX-License-Identifier: Apache-2.0
#include "model/tp_split.hpp"

#include <algorithm>

namespace ftp::model {

TpSplit tp_split(int n_head, int n_head_kv, int n_ff, int tp, int rank) noexcept {
  TpSplit s;
  if (tp < 1 || rank < 0 || rank >= tp) return s;
  const int qh = n_head / tp;
  s.q_begin = rank * qh;
  s.q_end = s.q_begin + qh;
  if (n_head_kv > 0 && tp <= n_head_kv) {
    const int kvh = n_head_kv / tp;
    s.kv_begin = rank * kvh;
    s.kv_end = s.kv_begin + kvh;
  } else if (n_head_kv > 0 && n_head >= n_head_kv) {
    // More ranks than KV heads: each rank reads the one KV head its query
    // heads belong to; tp / n_head_kv ranks read the same head's weights.
    s.kv_begin = s.q_begin / (n_head / n_head_kv);
    s.kv_end = s.kv_begin + 1;
  }
  const RowSplit ff = row_split(n_ff, tp, rank);
  s.ff_begin = ff.begin;
  s.ff_end = ff.end;
  return s;
}

RowSplit row_split(int n, int tp, int rank) noexcept {
  RowSplit v;
  if (tp < 1 || rank < 0 || rank >= tp || n <= 0) return v;
  const int base = n / tp, extra = n % tp;
  v.begin = rank * base + std::min(rank, extra);
  v.end = v.begin + base + (rank < extra ? 1 : 0);
  return v;
}

}  // namespace ftp::model
