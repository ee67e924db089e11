// SPDX-License-Identifier: Apache-2.0
// Device helpers of the KV writes (included by their .cu files only).
#pragma once

#include "common.cuh"

namespace ftp::kernels::detail {

/// float32 -> a KV page element (float copied, f16 / bf16 rounded to nearest even).
template <class T>
__device__ __forceinline__ T kv_from_f32(float x) {
  return to_half<T>(x);
}
template <>
__device__ __forceinline__ float kv_from_f32<float>(float x) {
  return x;
}

}  // namespace ftp::kernels::detail
