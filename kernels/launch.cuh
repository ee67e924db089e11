// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (host side; g++ and nvcc): whether the
// kernels of kernels/ that run in a decode step launch with it. Read by
// detail::launch (common.cuh); set by the CUDA backend
// (CudaBackendOptions::programmatic_launch, FTP_CUDA_PDL).
#pragma once

#include <atomic>

namespace ftp::kernels {

namespace detail {
/// -1: not set (on where the device has compute capability 9.0 or more).
inline std::atomic<int> programmatic_launch{-1};
}  // namespace detail

/// With it (Hopper and later; ignored before), a kernel's blocks may start
/// while the kernel before it in the stream finishes; each kernel waits at
/// its top (griddepcontrol.wait) until its predecessor has completed and
/// its memory is visible, so results are the same, and the launch gap and
/// the predecessor's tail overlap instead of adding up.
inline void set_programmatic_launch(bool on) { detail::programmatic_launch.store(on ? 1 : 0); }

}  // namespace ftp::kernels
