// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

namespace ftp::kernels {

/// Log-probabilities of t rows of n logits (rows of ld floats), as
/// engine::token_logprobs computes them: lse = max + log(sum exp(l - max))
/// in double, chosen[r] = l[ids[r]] - lse, and the k most likely tokens of
/// each row (by logit descending, lower index first on ties) into
/// top_ids[r * k ..] and top_lp[r * k ..]. k is 0..20; the top tokens are
/// found by k block-wide argmax passes, each over the tokens ordered after
/// the previous one. A row whose logits are all -inf gets -inf throughout
/// (its top ids are then 0, 1, ...); +inf logits share all the mass. Returns the launch status; does not
/// synchronise.
cudaError_t logprobs_rows(const float* logits, int ld, int t, int n, const int* ids, int k, float* chosen,
                          int* top_ids, float* top_lp, cudaStream_t stream);

}  // namespace ftp::kernels
