// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace ftp::kernels {

/// Most buffers sum_buffers_f32 takes (ranks of one communicator on one GPU).
constexpr int kMaxSumBuffers = 16;

/// In-place all-reduce of several buffers on one device: every bufs[j][i]
/// becomes ((bufs[0][i] + bufs[1][i]) + bufs[2][i]) + ... (rank order, as
/// comm::InprocCommunicator adds), for i < n and j < n_bufs <= kMaxSumBuffers.
/// The communicator of several tensor-parallel ranks on one GPU. Device
/// pointers (one device); the pointer array itself is host memory, passed by
/// value to the kernel. Returns the launch status; does not synchronise.
cudaError_t sum_buffers_f32(float* const* bufs, int n_bufs, std::size_t n, cudaStream_t stream);

}  // namespace ftp::kernels
