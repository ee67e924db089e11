// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"

namespace ftp::member {

/// The member protocol's name and version: a peer that speaks another is
/// refused (ftp.WrongVersion).
constexpr const char* kProtocol = "ftp.member/1";

/// Why a peer was refused or a frame dropped; `code()` is the named error
/// ("ftp.BadSecret", "ftp.WrongVersion", "ftp.BadFrame", "ftp.Timeout").
class ProtocolError : public Error {
 public:
  ProtocolError(std::string code, const std::string& message) : Error(code + ": " + message), code_(std::move(code)) {}
  const std::string& code() const noexcept { return code_; }

 private:
  std::string code_;
};

/// The shared secret of a service's members: the bytes of `path`, which
/// must be a regular file of mode 0600 or 0400 (no group or other access)
/// and not empty. Throws InputError naming the file and what is wrong.
std::string load_secret(const std::string& path);

/// HMAC-SHA256 of `message` under `key` (OpenSSL libcrypto), as 64 hex digits.
std::string hmac_hex(const std::string& key, const std::string& message);
/// 32 random bytes as hex (OpenSSL RAND_bytes).
std::string random_nonce();
/// Bytes as hex digits and back (the store's values in JSON); from_hex
/// throws ProtocolError ftp.BadFrame on anything but pairs of hex digits.
std::string to_hex(const std::vector<char>& bytes);
std::vector<char> from_hex(const std::string& digits);

/// One TCP connection between the leader and a member: frames of
/// "FTPM", a 4-byte big-endian length (at most 16 MiB) and a JSON object.
/// send() may be called from several threads; recv() from one.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Connects to "HOST:PORT"; throws Error naming the address.
  static int connect_to(const std::string& address);

  void send(const json::Json& message);
  /// The next message; waits up to `timeout_ms` (< 0: for ever). Throws
  /// ProtocolError ftp.BadFrame (not our framing, not a JSON object),
  /// ftp.Timeout, or Error when the peer has closed.
  json::Json recv(int timeout_ms = -1);
  /// Ends the connection (a blocked recv() returns with an error).
  void shutdown() noexcept;
  int fd() const noexcept { return fd_; }

 private:
  void read_exact(char* p, std::size_t n, int timeout_ms);
  int fd_;
  std::mutex send_mu_;
};

/// The leader's side of the handshake on a new connection: hello (protocol,
/// name, nonce) -> challenge (the leader's nonce and its proof of the
/// secret) -> auth (the member's proof) -> welcome. Returns the member's
/// hello. Throws ProtocolError (ftp.WrongVersion, ftp.BadSecret,
/// ftp.BadFrame, ftp.Timeout) after telling the peer why where it can.
json::Json accept_member(Channel& c, const std::string& secret, int timeout_ms);

/// The member's side: sends `hello` (its name and devices; protocol and
/// nonce are added), checks the leader's proof, answers the challenge.
/// Returns the welcome. Throws ProtocolError as accept_member.
json::Json join_leader(Channel& c, const std::string& secret, json::Json hello, int timeout_ms);

}  // namespace ftp::member
