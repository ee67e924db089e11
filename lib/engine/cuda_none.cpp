// SPDX-License-Identifier: Apache-2.0
// The CUDA backend of a build without CUDA: it says why it cannot run.
#include "core/error.hpp"
#include "engine/rank_backend.hpp"

namespace ftp::engine {

Backend& cuda_backend() {
  throw BackendError("cuda backend: not part of this build of flextp (built without CUDA: meson -Dcuda=disabled, or no toolkit found)");
}

}  // namespace ftp::engine
