// SPDX-License-Identifier: Apache-2.0
// Device helpers shared by the kernels (included by .cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "launch.cuh"

#include "weight_view.cuh"

namespace ftp::kernels::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct Plus {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; }
};

/// `op` over the block (blockDim.x a multiple of 32, at most 1024): within
/// each warp, then over the warps' results; every thread gets the result.
/// `red` holds 32 T of shared memory; `identity` is op's neutral element.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, T* red, T identity, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : identity;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (block_reduce); `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) { return block_reduce(v, red, 0.0f, Plus{}); }

__device__ __forceinline__ float bf16_bits_to_f32(std::uint16_t h) { return __uint_as_float(static_cast<std::uint32_t>(h) << 16); }
__device__ __forceinline__ float f16_bits_to_f32(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }

/// Element `idx` of a tensor in F32, F16, BF16 or Q8_0 (a scalar path: used
/// where a view's rows are not aligned for vector loads). The block types
/// (Q4_0 .. Q6_K) have no element access (their kernels decode whole
/// chunks, quant_blocks.cuh): NaN for them, which no caller asks.
__device__ __forceinline__ float load_weight(const void* base, WeightDType dt, std::int64_t idx) {
  switch (dt) {
    case WeightDType::f32: return static_cast<const float*>(base)[idx];
    case WeightDType::f16: return f16_bits_to_f32(static_cast<const std::uint16_t*>(base)[idx]);
    case WeightDType::bf16: return bf16_bits_to_f32(static_cast<const std::uint16_t*>(base)[idx]);
    case WeightDType::q8_0: {
      const auto* blk = static_cast<const std::uint8_t*>(base) + (idx >> 5) * 34;
      const std::uint16_t d = static_cast<std::uint16_t>(blk[0] | (blk[1] << 8));
      return f16_bits_to_f32(d) * static_cast<float>(static_cast<std::int8_t>(blk[2 + (idx & 31)]));
    }
    default: break;
  }
  return __uint_as_float(0x7fc00000u);
}

/// RoPE pair j (j < n_rot / 2) of a head: its two dimensions, (2j, 2j + 1)
/// for llama's pairing, (j, j + n_rot / 2) for NEOX; and its angle at
/// position p, p x theta^(-2j / n_rot) / freq_factors[j] (freq_factors
/// null: 1), computed in float as engine::ops::rope.
struct RopePair {
  int d0, d1;
  float c, s;  ///< cos and sin of the angle
};
__device__ __forceinline__ RopePair rope_pair(float p, int j, int n_rot, float theta, bool neox,
                                              const float* __restrict__ freq_factors) {
  float freq = 1.0f / powf(theta, static_cast<float>(2 * j) / static_cast<float>(n_rot));
  if (freq_factors) freq /= freq_factors[j];
  RopePair r;
  r.d0 = neox ? j : 2 * j;
  r.d1 = neox ? j + n_rot / 2 : 2 * j + 1;
  sincosf(p * freq, &r.s, &r.c);
  return r;
}

/// Rotates (h[d0], h[d1]) of head `h` by pair `r` into out0, out1 (reads
/// both before writing: they may be h + d0, h + d1).
__device__ __forceinline__ void rope_rotate(const float* h, const RopePair& r, float* out0, float* out1) {
  const float v0 = h[r.d0], v1 = h[r.d1];
  *out0 = v0 * r.c - v1 * r.s;
  *out1 = v0 * r.s + v1 * r.c;
}

/// float32 -> f16 / bf16, round to nearest even.
template <class H>
__device__ __forceinline__ H to_half(float x);
template <>
__device__ __forceinline__ __half to_half<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 to_half<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/// Multiprocessors of the current device (cached per thread and device: a
/// rank's thread asks on every launch).
inline cudaError_t sm_count(int* sms) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  thread_local int cached_device = -1, cached = 0;
  if (device != cached_device) {
    e = cudaDeviceGetAttribute(&cached, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    cached_device = device;
  }
  *sms = cached;
  return cudaSuccess;
}

inline unsigned grid_for(std::size_t n, int threads, unsigned cap) {
  std::size_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g < cap ? g : cap);
}

/// The first statement of a kernel launched with detail::launch: lets the
/// next kernel in the stream be scheduled (it waits at its own top), then
/// waits until the previous kernel has completed and its writes are
/// visible. Nothing before sm_90, and nothing to wait for when the kernel
/// was launched without the attribute.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Whether launches on the current device use programmatic dependent
/// launch: unless set_programmatic_launch(false), where the device has
/// compute capability >= 9.0 and runs code compiled for compute_90 or later
/// (`kernel`'s PTX version: code JIT-compiled from older PTX has no
/// griddepcontrol.wait, pdl_begin being empty there). The kernels of this
/// library share one build, so the first kernel launched decides for all.
inline bool programmatic_launch_on(const void* kernel) {
  const int set = programmatic_launch.load(std::memory_order_relaxed);
  if (set == 0) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  thread_local int cached_device = -1;
  thread_local bool cached = false;
  if (device != cached_device) {
    int major = 0;
    cudaFuncAttributes attr{};
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    cached = major >= 9 && attr.ptxVersion >= 90;
    cached_device = device;
  }
  return cached;
}

/// kernel<<<grid, block, smem, stream>>>(args...), with programmatic
/// dependent launch where programmatic_launch_on(); the kernel must begin
/// with pdl_begin(). Errors are left for cudaGetLastError, as with <<<>>>.
template <class... P, class... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream, A&&... args) {
  if (!programmatic_launch_on(reinterpret_cast<const void*>(kernel))) {
    kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

}  // namespace ftp::kernels::detail
