// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "weight_view.cuh"

namespace ftp::kernels {

/// Activations float32 -> f16 or bf16 (round to nearest even), n elements,
/// for the cuBLAS path of large batches. Device pointers. Returns the
/// launch status; does not synchronise.
cudaError_t convert_f32(const float* in, void* out, HalfType to, std::size_t n, cudaStream_t stream);

}  // namespace ftp::kernels
