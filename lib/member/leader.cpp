// SPDX-License-Identifier: Apache-2.0
#include "member/leader.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace ftp::member {

/// A handshake of a silent peer ends after this long.
constexpr int kHandshakeMs = 5000;

struct Leader::Conn {
  explicit Conn(int fd) : ch(fd) {}
  Channel ch;
  std::string name;  // after the handshake
};

Leader::Leader(const std::string& bind, std::string secret, Log log) : secret_(std::move(secret)), log_(std::move(log)) {
  if (!log_) log_ = [](const std::string&) {};
  const auto colon = bind.rfind(':');
  if (colon == std::string::npos) throw InputError("--members-listen \"" + bind + "\": expected HOST:PORT");
  host_ = bind.substr(0, colon);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = bind.substr(colon + 1);
  if (int rc = ::getaddrinfo(host_.c_str(), port.c_str(), &hints, &res); rc != 0)
    throw InputError("--members-listen " + bind + ": " + gai_strerror(rc));
  listen_fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || ::bind(listen_fd_, res->ai_addr, res->ai_addrlen) != 0 || ::listen(listen_fd_, 16) != 0) {
    const std::string why = std::strerror(errno);
    ::freeaddrinfo(res);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw Error("member channel: cannot listen on " + bind + ": " + why);
  }
  ::freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  const int p = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  address_ = host_ + ":" + std::to_string(p);
  accept_ = std::thread([this] { accept_loop(); });
}

Leader::~Leader() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_.join();
  ::close(listen_fd_);
  {
    std::lock_guard lk(mu_);
    for (auto& [n, c] : by_name_) c->ch.shutdown();
  }
  // Connections still in their handshake end by its timeout at the latest.
  std::vector<std::thread> th;
  {
    std::lock_guard lk(mu_);
    th = std::move(threads_);
  }
  for (auto& t : th) t.join();
}

void Leader::accept_loop() {
  while (!stop_) {
    pollfd pf{listen_fd_, POLLIN, 0};
    if (::poll(&pf, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto c = std::make_shared<Conn>(fd);
    std::lock_guard lk(mu_);
    threads_.emplace_back([this, c] { serve(c); });
  }
}

void Leader::serve(std::shared_ptr<Conn> c) {
  json::Json hello;
  try {
    hello = accept_member(c->ch, secret_, kHandshakeMs);
  } catch (const ProtocolError& e) {
    log_(std::string("member channel: refused a peer: ") + e.what());
    std::lock_guard lk(mu_);
    ++refusals_[e.code()];
    return;
  } catch (const std::exception& e) {
    log_(std::string("member channel: dropped a peer in its handshake: ") + e.what());
    return;
  }
  MemberInfo info;
  info.name = hello.value("name", std::string());
  info.alive = true;
  bool ok = info.name.find('/') == std::string::npos;
  if (ok && hello.contains("devices") && hello["devices"].is_array())
    for (const auto& d : hello["devices"])
      if (d.is_string()) info.devices.push_back(info.name + "/" + d.get<std::string>());
  {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(info.name);
    if (it != by_name_.end()) ok = false;  // a live member of that name
    if (ok) {
      info.epoch = next_epoch_++;
      c->name = info.name;
      by_name_[info.name] = c;
      info_[info.name] = info;
    }
  }
  if (!ok) {
    try {
      c->ch.send(json::Json{{"type", "refused"}, {"error", "ftp.NameTaken"},
                            {"message", "a member named \"" + info.name + "\" is already here (or the name has a /)"}});
    } catch (...) {
    }
    log_("member channel: refused member " + info.name + ": name taken or invalid");
    std::lock_guard lk(mu_);
    ++refusals_["ftp.NameTaken"];
    return;
  }
  try {
    c->ch.send(json::Json{{"type", "welcome"}, {"protocol", kProtocol}});
  } catch (const std::exception& e) {
    lost(c, e.what());
    return;
  }
  log_("member " + info.name + " joined with " + std::to_string(info.devices.size()) + " devices");
  std::vector<Change> ch;
  {
    std::lock_guard lk(mu_);
    ch = changes_;
  }
  cv_.notify_all();
  for (auto& f : ch) f(info);
  try {
    for (;;) {
      json::Json m = c->ch.recv();
      const std::string type = m["type"].get<std::string>();
      if (type == "store_set") {
        store_.set(m.at("key").get<std::string>(), from_hex(m.at("value").get<std::string>()));
      } else if (type == "store_get") {
        std::vector<char> v;
        const bool found = store_.try_get(m.at("key").get<std::string>(), v);
        json::Json r{{"type", "store_value"}, {"re", m.at("id")}, {"found", found}};
        if (found) r["value"] = to_hex(v);
        c->ch.send(r);
      } else if (type == "reply") {
        std::lock_guard lk(mu_);
        auto it = replies_.find(m.at("re").get<std::uint64_t>());
        if (it != replies_.end()) it->second = {true, m};
        cv_.notify_all();
      } else {
        log_("member " + c->name + ": unknown message type \"" + type + "\" ignored");
      }
    }
  } catch (const std::exception& e) {
    lost(c, e.what());
  }
}

void Leader::lost(const std::shared_ptr<Conn>& c, const std::string& why) {
  MemberInfo info;
  std::vector<Change> ch;
  {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(c->name);
    if (it == by_name_.end() || it->second != c) return;
    by_name_.erase(it);
    info = info_[c->name];
    info.alive = false;
    info.lost_why = why;
    info_[c->name] = info;
    ch = changes_;
  }
  cv_.notify_all();
  if (!stop_) log_("member " + info.name + " lost: " + why);
  for (auto& f : ch) f(info);
}

std::vector<MemberInfo> Leader::members() const {
  std::lock_guard lk(mu_);
  std::vector<MemberInfo> out;
  for (const auto& [n, i] : info_) out.push_back(i);
  return out;
}

bool Leader::wait_for_members(int n, int timeout_ms) const {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return static_cast<int>(by_name_.size()) >= n; });
}

std::uint64_t Leader::epoch(const std::string& name) const {
  std::lock_guard lk(mu_);
  if (!by_name_.count(name)) return 0;
  auto it = info_.find(name);
  return it == info_.end() ? 0 : it->second.epoch;
}

std::string Leader::wait_lost(const std::vector<std::string>& names, const std::vector<std::uint64_t>& epochs,
                              int timeout_ms) const {
  std::string out;
  auto gone = [&] {
    for (std::size_t i = 0; i < names.size() && i < epochs.size(); ++i) {
      auto it = info_.find(names[i]);
      const bool alive = by_name_.count(names[i]) && it != info_.end() && it->second.epoch == epochs[i];
      if (!alive) {
        out = "member " + names[i] + " lost";
        if (it != info_.end() && !it->second.lost_why.empty()) out += " (" + it->second.lost_why + ")";
        return true;
      }
    }
    return false;
  };
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), gone);
  return out;
}

void Leader::on_change(Change f) {
  std::lock_guard lk(mu_);
  changes_.push_back(std::move(f));
}

std::map<std::string, int> Leader::refusals() const {
  std::lock_guard lk(mu_);
  return refusals_;
}

bool Leader::tell(const std::string& name, const json::Json& message) {
  std::shared_ptr<Conn> c;
  {
    std::lock_guard lk(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return false;
    c = it->second;
  }
  try {
    c->ch.send(message);
    return true;
  } catch (...) {
    return false;
  }
}

json::Json Leader::request(const std::string& name, json::Json req, int timeout_ms) {
  std::uint64_t id;
  {
    std::lock_guard lk(mu_);
    id = next_id_++;
    replies_[id] = {false, {}};
  }
  req["id"] = id;
  if (!tell(name, req)) {
    std::lock_guard lk(mu_);
    replies_.erase(id);
    throw Error("member " + name + " is not connected");
  }
  std::unique_lock lk(mu_);
  const bool came = cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                                 [&] { return replies_[id].first || !by_name_.count(name); });
  json::Json r = replies_[id].second;
  const bool got = replies_[id].first;
  replies_.erase(id);
  if (!got)
    throw Error("member " + name + (came ? " was lost before it answered " : " did not answer ") +
                req.value("type", std::string()) + " within " + std::to_string(timeout_ms) + " ms");
  if (!r.value("ok", false))
    throw Error("member " + name + ": " + req.value("type", std::string()) + " failed: " + r.value("error", std::string("?")));
  return r;
}

}  // namespace ftp::member
