// SPDX-License-Identifier: Apache-2.0
#include "member/channel.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ftp::member {
namespace {

constexpr std::uint32_t kMaxFrame = 16u << 20;

std::string hex(const unsigned char* p, std::size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

bool equal_const_time(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string field(const json::Json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void refuse(Channel& c, const std::string& code, const std::string& why) {
  try {
    c.send(json::Json{{"type", "refused"}, {"error", code}, {"message", why}});
  } catch (...) {
  }
  throw ProtocolError(code, why);
}

}  // namespace

std::string load_secret(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw InputError("secret file " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError("secret file " + path + ": not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw InputError("secret file " + path + " has mode " + mode + "; it must be 0600 (chmod 600 " + path + ")");
  }
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) throw InputError("secret file " + path + ": the secret must be at least 16 bytes");
  return s;
}

std::string hmac_hex(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
            message.size(), out, &n))
    throw Error("member: HMAC-SHA256 failed (OpenSSL)");
  return hex(out, n);
}

std::string random_nonce() {
  unsigned char b[32];
  if (RAND_bytes(b, sizeof b) != 1) throw Error("member: no random bytes (OpenSSL RAND_bytes)");
  return hex(b, sizeof b);
}

std::string to_hex(const std::vector<char>& bytes) {
  return hex(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

std::vector<char> from_hex(const std::string& d) {
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (d.size() % 2) throw ProtocolError("ftp.BadFrame", "an odd number of hex digits");
  std::vector<char> out(d.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = val(d[2 * i]), lo = val(d[2 * i + 1]);
    if (hi < 0 || lo < 0) throw ProtocolError("ftp.BadFrame", "not hex digits");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

int Channel::connect_to(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InputError("member address \"" + address + "\": expected HOST:PORT");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    throw Error("member address " + address + ": " + gai_strerror(rc));
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    why = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) throw Error("member: cannot connect to " + address + ": " + why);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void Channel::send(const json::Json& message) {
  const std::string body = message.dump();
  if (body.size() > kMaxFrame) throw Error("member: a message of " + std::to_string(body.size()) + " bytes");
  char head[8] = {'F', 'T', 'P', 'M'};
  const std::uint32_t n = static_cast<std::uint32_t>(body.size());
  head[4] = static_cast<char>(n >> 24);
  head[5] = static_cast<char>(n >> 16);
  head[6] = static_cast<char>(n >> 8);
  head[7] = static_cast<char>(n);
  std::lock_guard lk(send_mu_);
  std::string frame(head, 8);
  frame += body;
  std::size_t at = 0;
  while (at < frame.size()) {
    const ssize_t k = ::send(fd_, frame.data() + at, frame.size() - at, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw Error(std::string("member: send: ") + std::strerror(errno));
    at += static_cast<std::size_t>(k);
  }
}

void Channel::read_exact(char* p, std::size_t n, int timeout_ms) {
  std::size_t at = 0;
  while (at < n) {
    if (timeout_ms >= 0) {
      pollfd pf{fd_, POLLIN, 0};
      const int rc = ::poll(&pf, 1, timeout_ms);
      if (rc == 0) throw ProtocolError("ftp.Timeout", "no message within " + std::to_string(timeout_ms) + " ms");
      if (rc < 0 && errno == EINTR) continue;
    }
    const ssize_t k = ::recv(fd_, p + at, n - at, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) throw Error("member: the peer closed the connection");
    if (k < 0) throw Error(std::string("member: recv: ") + std::strerror(errno));
    at += static_cast<std::size_t>(k);
  }
}

json::Json Channel::recv(int timeout_ms) {
  char head[8];
  read_exact(head, 8, timeout_ms);
  if (std::memcmp(head, "FTPM", 4) != 0) throw ProtocolError("ftp.BadFrame", "not a member-protocol frame");
  const std::uint32_t n = (static_cast<std::uint32_t>(static_cast<unsigned char>(head[4])) << 24) |
                          (static_cast<std::uint32_t>(static_cast<unsigned char>(head[5])) << 16) |
                          (static_cast<std::uint32_t>(static_cast<unsigned char>(head[6])) << 8) |
                          static_cast<std::uint32_t>(static_cast<unsigned char>(head[7]));
  if (n > kMaxFrame) throw ProtocolError("ftp.BadFrame", "a frame of " + std::to_string(n) + " bytes (at most 16 MiB)");
  std::string body(n, '\0');
  read_exact(body.data(), n, timeout_ms);
  json::Json m;
  try {
    m = json::parse_line(body);
  } catch (const std::exception& e) {
    throw ProtocolError("ftp.BadFrame", e.what());
  }
  if (!m.is_object() || !m.contains("type") || !m["type"].is_string())
    throw ProtocolError("ftp.BadFrame", "a message is an object with a string \"type\"");
  return m;
}

void Channel::shutdown() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

json::Json accept_member(Channel& c, const std::string& secret, int timeout_ms) {
  json::Json hello = c.recv(timeout_ms);
  if (field(hello, "type") != "hello") refuse(c, "ftp.BadFrame", "the first message must be a hello");
  if (field(hello, "protocol") != kProtocol)
    refuse(c, "ftp.WrongVersion", "protocol \"" + field(hello, "protocol") + "\", this leader speaks " + kProtocol);
  const std::string name = field(hello, "name"), peer_nonce = field(hello, "nonce");
  if (name.empty() || peer_nonce.size() != 64) refuse(c, "ftp.BadFrame", "a hello has a name and a 64-digit nonce");
  const std::string nonce = random_nonce();
  c.send(json::Json{{"type", "challenge"}, {"nonce", nonce}, {"proof", hmac_hex(secret, "leader:" + peer_nonce)}});
  json::Json auth = c.recv(timeout_ms);
  if (field(auth, "type") != "auth") refuse(c, "ftp.BadFrame", "expected auth");
  if (!equal_const_time(field(auth, "proof"), hmac_hex(secret, "member:" + name + ":" + nonce)))
    refuse(c, "ftp.BadSecret", "member " + name + " does not know the secret");
  return hello;
}

json::Json join_leader(Channel& c, const std::string& secret, json::Json hello, int timeout_ms) {
  const std::string nonce = random_nonce();
  hello["type"] = "hello";
  hello["protocol"] = kProtocol;
  hello["nonce"] = nonce;
  c.send(hello);
  json::Json ch = c.recv(timeout_ms);
  if (field(ch, "type") == "refused") throw ProtocolError(field(ch, "error"), field(ch, "message"));
  if (field(ch, "type") != "challenge") throw ProtocolError("ftp.BadFrame", "expected a challenge");
  if (!equal_const_time(field(ch, "proof"), hmac_hex(secret, "leader:" + nonce)))
    throw ProtocolError("ftp.BadSecret", "the leader does not know the secret");
  c.send(json::Json{{"type", "auth"},
                    {"proof", hmac_hex(secret, "member:" + hello.value("name", std::string()) + ":" + field(ch, "nonce"))}});
  json::Json w = c.recv(timeout_ms);
  if (field(w, "type") == "refused") throw ProtocolError(field(w, "error"), field(w, "message"));
  if (field(w, "type") != "welcome") throw ProtocolError("ftp.BadFrame", "expected welcome");
  return w;
}

}  // namespace ftp::member
