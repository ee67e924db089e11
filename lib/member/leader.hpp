// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous.hpp"
#include "core/json.hpp"
#include "member/channel.hpp"

namespace ftp::member {

/// A process of the service other than the leader, as the leader knows it.
struct MemberInfo {
  std::string name;                  ///< its machine's name ("n1"); its devices are "n1/vd0"...
  std::vector<std::string> devices;  ///< full names, "n1/vd0"
  bool alive = false;
  std::string lost_why;              ///< why it is gone (empty while alive)
  std::uint64_t epoch = 0;           ///< which join of this name (a returning member has a new one)
};

/// The leader's end of the member channel: listens on the operator's
/// address, authenticates each peer (accept_member), keeps the members
/// and their devices, serves the Gloo rendezvous store to them, and sends
/// them the protocol's requests (build a domain's ranks, retire them).
/// A refused or broken peer is logged and dropped; the leader serves on.
/// A member that returns under the same name is taken back. Thread-safe.
class Leader {
 public:
  using Log = std::function<void(const std::string&)>;
  using Change = std::function<void(const MemberInfo&)>;

  /// `bind`: "HOST:PORT" (port 0: any free one, see address()).
  Leader(const std::string& bind, std::string secret, Log log = {});
  ~Leader();
  Leader(const Leader&) = delete;
  Leader& operator=(const Leader&) = delete;

  /// The bound "HOST:PORT".
  std::string address() const { return address_; }
  /// The host part of the bound address (where the leader's Gloo pairs bind).
  std::string host() const { return host_; }
  std::vector<MemberInfo> members() const;
  /// Waits until `n` members are alive; false after `timeout_ms`.
  bool wait_for_members(int n, int timeout_ms) const;
  /// The epoch of member `name` while it is alive, 0 when it is not: a
  /// domain built on one epoch cannot use a later one (its group is gone).
  std::uint64_t epoch(const std::string& name) const;
  /// Waits up to `timeout_ms` until one of `names` is no longer alive at
  /// its epoch in `epochs` (same order); "member NAME lost (WHY)" for the
  /// first such, or empty. A failed step across processes names its cause.
  std::string wait_lost(const std::vector<std::string>& names, const std::vector<std::uint64_t>& epochs,
                        int timeout_ms) const;
  /// Told of every join and loss (on the connection's thread).
  void on_change(Change f);

  /// The rendezvous store members' Gloo groups meet in.
  comm::LocalStore& store() { return store_; }

  /// Sends `request` (a "build" or "retire") to member `name`, waits up to
  /// `timeout_ms` for its reply ({"ok": true} or {"ok": false, "error"}).
  /// Throws Error naming the member when it is gone, says no, or is late.
  json::Json request(const std::string& name, json::Json request, int timeout_ms);
  /// Sends without waiting (best effort; false when the member is gone).
  bool tell(const std::string& name, const json::Json& message);

  /// Refused peers so far, by named error (ftp.BadSecret...).
  std::map<std::string, int> refusals() const;

 private:
  struct Conn;
  void accept_loop();
  void serve(std::shared_ptr<Conn> c);
  void lost(const std::shared_ptr<Conn>& c, const std::string& why);

  std::string secret_;
  Log log_;
  int listen_fd_ = -1;
  std::string address_, host_;
  comm::LocalStore store_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Conn>> by_name_;
  std::map<std::string, MemberInfo> info_;
  std::map<std::string, int> refusals_;
  std::vector<Change> changes_;
  std::map<std::uint64_t, std::pair<bool, json::Json>> replies_;  // request id -> (came, reply)
  std::uint64_t next_id_ = 1, next_epoch_ = 1;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::thread accept_;
};

}  // namespace ftp::member
