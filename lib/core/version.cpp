// SPDX-License-Identifier: Apache-2.0
#include "core/version.hpp"

#include "ftp_config.h"

namespace ftp {

std::string_view version() noexcept { return FTP_VERSION; }

bool built_with_cuda() noexcept { return FTP_HAVE_CUDA != 0; }

}  // namespace ftp
