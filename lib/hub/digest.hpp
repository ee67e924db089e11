// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace ftp::hub {

/// What the hub lists to check a file by: the SHA-256 of its bytes (files
/// in LFS, `lfs.oid`) or the id git gives it as a blob, SHA-1 of
/// "blob <size>\0" and the bytes (the others, `oid`).
enum class DigestKind { sha256, git_blob_sha1 };

/// The lower-case hex digest of bytes (OpenSSL's libcrypto).
std::string digest_hex(DigestKind kind, std::string_view bytes);

/// The same over a file, read in 1 MiB pieces; an Error names the file.
std::string file_digest_hex(DigestKind kind, const std::filesystem::path& file);

/// "sha256" or "git blob sha1", for messages.
const char* digest_name(DigestKind kind);

}  // namespace ftp::hub
