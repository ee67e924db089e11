// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>

namespace ftp {

/// The project version, from meson.build (e.g. "0.1.0").
std::string_view version() noexcept;

/// True when this build contains the CUDA backend.
bool built_with_cuda() noexcept;

}  // namespace ftp
