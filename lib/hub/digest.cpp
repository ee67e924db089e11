// SPDX-License-Identifier: Apache-2.0
#include "hub/digest.hpp"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "core/error.hpp"

namespace ftp::hub {

namespace {

struct Hasher {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
  Hasher(DigestKind kind, std::uint64_t size) {
    if (!ctx || EVP_DigestInit_ex(ctx.get(), kind == DigestKind::sha256 ? EVP_sha256() : EVP_sha1(), nullptr) != 1)
      throw Error("libcrypto: cannot start a digest");
    if (kind == DigestKind::git_blob_sha1) {
      const std::string head = "blob " + std::to_string(size);
      update(head.data(), head.size() + 1);  // with its NUL
    }
  }
  void update(const void* p, std::size_t n) {
    if (EVP_DigestUpdate(ctx.get(), p, n) != 1) throw Error("libcrypto: digest update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx.get(), md, &n) != 1) throw Error("libcrypto: digest final failed");
    std::string out(2 * n, '0');
    static const char* digits = "0123456789abcdef";
    for (unsigned int i = 0; i < n; ++i) out[2 * i] = digits[md[i] >> 4], out[2 * i + 1] = digits[md[i] & 15];
    return out;
  }
};

}  // namespace

std::string digest_hex(DigestKind kind, std::string_view bytes) {
  Hasher h(kind, bytes.size());
  h.update(bytes.data(), bytes.size());
  return h.hex();
}

std::string file_digest_hex(DigestKind kind, const std::filesystem::path& file) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) throw Error(file.string() + ": " + ec.message());
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot open");
  Hasher h(kind, size);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) throw Error(file.string() + ": read error");
  return h.hex();
}

const char* digest_name(DigestKind kind) { return kind == DigestKind::sha256 ? "sha256" : "git blob sha1"; }

}  // namespace ftp::hub
