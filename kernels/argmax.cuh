// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cuda_runtime.h>

namespace ftp::kernels {

/// out[r] = index of the largest of x[r][0..n), the lowest index on ties
/// (engine::argmax), for t rows. Device pointers. Returns the launch
/// status; does not synchronise.
cudaError_t argmax_rows(const float* x, int t, int n, int* out, cudaStream_t stream);

}  // namespace ftp::kernels
