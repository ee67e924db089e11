// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>

namespace ftp::kernels {

/// Element types of weights in device memory, as stored in the model file.
/// Q8_0: blocks of 32 elements, 34 bytes each (f16 scale d, then 32 int8 q;
/// value = d x q).
enum class WeightDType : int { f32 = 0, f16 = 1, bf16 = 2, q8_0 = 3 };

/// A sub-matrix of a row-major weight tensor in device memory, in its
/// stored dtype (the device twin of engine::MatView): element (i, j) of the
/// view is element (r0 + i) * ld + c0 + j of the tensor, where ld is the
/// tensor's row length in elements. Row-parallel views of tensor-parallel
/// ranks are column ranges (c0 > 0, cols < ld); nothing is copied.
struct WeightView {
  const void* data = nullptr;  ///< device pointer to the whole tensor
  WeightDType dtype = WeightDType::f32;
  std::int64_t ld = 0;         ///< elements per row of the tensor
  std::int64_t r0 = 0, rows = 0;
  std::int64_t c0 = 0, cols = 0;
};

/// Element types of dense activation or dequantised tiles (cuBLAS inputs).
enum class HalfType : int { f16 = 0, bf16 = 1 };

}  // namespace ftp::kernels
