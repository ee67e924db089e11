// SPDX-License-Identifier: Apache-2.0
// Control-socket server and client (lib/ipc). Each test starts a private
// server on a socket in a fresh temp directory. No timing assertions: every
// wait has a generous deadline and only guards against a hang.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <thread>

#include "ipc/client.hpp"
#include "ipc/server.hpp"

using namespace std::chrono_literals;
using ftp::Exit;
using ftp::ipc::Call;
using ftp::ipc::Client;
using ftp::ipc::Errc;
using ftp::ipc::Json;
using ftp::ipc::Method;
using ftp::ipc::RpcError;
using ftp::ipc::Server;
using ftp::ipc::ServerOptions;

namespace {

/// One worker thread running jobs in order: handlers that answer off the loop.
class Worker {
 public:
  Worker() : t_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  void post(std::function<void()> fn) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        fn = std::move(q_.front());
        q_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::thread t_;
};

std::string rpc_name(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const RpcError& e) {
    return e.name();
  }
  return "<no error>";
}

class Ipc : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftp-ipc-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/control.sock";
  }

  void TearDown() override {
    if (server_) server_->stop();
    {
      std::lock_guard lk(mu_);
      for (auto& t : threads_) t.join();
      threads_.clear();
    }
    worker_.reset();
    std::filesystem::remove_all(dir_);
  }

  ServerOptions options() {
    ServerOptions o;
    o.socket_path = path_;
    o.log = [this](ftp::ipc::LogLevel, std::string_view line) {
      std::lock_guard lk(mu_);
      logs_.emplace_back(line);
    };
    return o;
  }

  std::vector<Method> methods() {
    std::vector<Method> m;
    m.push_back({"add", "a + b", {{"a", "integer", true, "left"}, {"b", "integer", true, "right"}}, "{sum}", false,
                 [](Call& c) { c.reply(Json{{"sum", c.params()["a"].get<long>() + c.params()["b"].get<long>()}}); }});
    m.push_back({"echo", "returns value", {{"value", "any", false, "anything"}}, "{value}", false,
                 [](Call& c) { c.reply(Json{{"value", c.params().value("value", Json())}}); }});
    m.push_back({"echo_async", "returns value from a worker thread", {{"value", "any", false, ""}}, "{value}", false,
                 [this](Call& c) {
                   auto call = c.share();
                   worker_->post([call] { call->reply(Json{{"value", call->params().value("value", Json())}}); });
                 }});
    m.push_back({"length", "length of a string", {{"value", "string", true, ""}}, "{length}", false,
                 [](Call& c) { c.reply(Json{{"length", c.params()["value"].get_ref<const std::string&>().size()}}); }});
    m.push_back({"whoami", "peer credentials", {}, "{pid, uid, gid}", false, [](Call& c) {
                   c.reply(Json{{"pid", c.peer().pid}, {"uid", c.peer().uid}, {"gid", c.peer().gid}});
                 }});
    m.push_back({"ticks", "streams a counter", {{"count", "integer", false, ""}, {"interval_ms", "integer", false, ""}},
                 "{count}", true, [this](Call& c) {
                   auto call = c.share();
                   call->on_cancel([this] {
                     std::lock_guard lk(mu_);
                     ++cancels_;
                     cv_.notify_all();
                   });
                   long count = call->params().value("count", -1L);
                   long interval = call->params().value("interval_ms", 1L);
                   spawn([call, count, interval] {
                     long i = 0;
                     while (!call->cancelled() && (count < 0 || i < count)) {
                       call->notify(Json{{"tick", i++}});
                       std::this_thread::sleep_for(std::chrono::milliseconds(interval));
                     }
                     call->end(Json{{"count", i}});
                   });
                 }});
    m.push_back({"slow", "answers after ms", {{"ms", "integer", true, ""}}, "{slept}", false, [this](Call& c) {
                   auto call = c.share();
                   {
                     std::lock_guard lk(mu_);
                     ++slow_started_;
                     cv_.notify_all();
                   }
                   spawn([call] {
                     auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(call->params()["ms"].get<long>());
                     while (!call->cancelled() && std::chrono::steady_clock::now() < until)
                       std::this_thread::sleep_for(5ms);
                     call->reply(Json{{"slept", true}});
                   });
                 }});
    m.push_back({"fail", "throws", {}, "", false, [](Call&) { throw std::runtime_error("boom"); }});
    m.push_back({"noreply", "forgets to answer", {}, "", false, [](Call&) {}});
    m.push_back({"gear", "a later method's named error", {}, "", false,
                 [](Call& c) { c.error(-32010, "ftp.NoSuchGear", "no gear \"turbo\"", Json{{"gear", "turbo"}}); }});
    return m;
  }

  void start(ServerOptions o) {
    worker_ = std::make_unique<Worker>();
    server_ = std::make_unique<Server>(std::move(o), methods());
    server_->start();
  }
  void start() { start(options()); }

  void spawn(std::function<void()> fn) {
    std::lock_guard lk(mu_);
    threads_.emplace_back(std::move(fn));
  }

  /// Waits (10 s at most) for pred, evaluated under the fixture's mutex.
  bool wait_for(const std::function<bool()>& pred) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, 10s, pred);
  }
  /// Polls a condition that no one signals, 10 s at most.
  static bool eventually(const std::function<bool()>& pred) {
    auto until = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < until) {
      if (pred()) return true;
      std::this_thread::sleep_for(5ms);
    }
    return pred();
  }
  bool logged(std::string_view part) {
    std::lock_guard lk(mu_);
    for (const auto& l : logs_)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }

  std::string dir_, path_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> logs_;
  std::vector<std::thread> threads_;
  int cancels_ = 0;
  int slow_started_ = 0;
};

}  // namespace

TEST_F(Ipc, IntrospectListsMethodsParamsLimitsErrors) {
  start();
  Client c(path_);
  Json r = c.call("introspect");
  EXPECT_EQ(r["kind"], "ftp.introspect/v1");
  EXPECT_EQ(r["protocol"], "ftp.protocol/v1");
  EXPECT_EQ(r["limits"]["max_message_bytes"], 16u << 20);
  EXPECT_EQ(r["limits"]["max_connections"], 256);
  EXPECT_EQ(r["limits"]["idle_timeout_ms"], 60000);
  bool found_add = false, found_self = false;
  for (const auto& m : r["methods"]) {
    if (m["name"] == "introspect") found_self = true;
    if (m["name"] == "add") {
      found_add = true;
      EXPECT_EQ(m["description"], "a + b");
      ASSERT_EQ(m["params"].size(), 2u);
      EXPECT_EQ(m["params"][0]["name"], "a");
      EXPECT_EQ(m["params"][0]["type"], "integer");
      EXPECT_EQ(m["params"][0]["required"], true);
    }
    if (m["name"] == "ticks") {
      EXPECT_EQ(m["streaming"], true);
    }
  }
  EXPECT_TRUE(found_add);
  EXPECT_TRUE(found_self);
  bool too_large = false;
  for (const auto& e : r["errors"])
    if (e["name"] == "ftp.MessageTooLarge" && e["code"] == -32001) too_large = true;
  EXPECT_TRUE(too_large);
  EXPECT_EQ(r, server_->introspect());
}

// The methods' own errors (the daemon's ftp.NoSuchGear, ...) are listed too,
// after the protocol's.
TEST_F(Ipc, IntrospectListsTheMethodsOwnErrors) {
  ServerOptions o = options();
  o.method_errors.push_back({-32010, "ftp.NoSuchGear", "no gear of that name"});
  start(std::move(o));
  Json r = Client(path_).call("introspect");
  ASSERT_FALSE(r["errors"].empty());
  const Json& last = r["errors"].back();
  EXPECT_EQ(last["name"], "ftp.NoSuchGear");
  EXPECT_EQ(last["code"], -32010);
  EXPECT_EQ(last["summary"], "no gear of that name");
}

TEST_F(Ipc, UnknownMethod) {
  start();
  Client c(path_);
  try {
    c.call("no.such.method");
    FAIL() << "no error";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.name(), "ftp.NoSuchMethod");
    EXPECT_EQ(e.code(), -32601);
    EXPECT_EQ(e.exit(), Exit::usage);
    EXPECT_NE(std::string(e.what()).find("no.such.method"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 2}})["sum"], 3);  // same connection keeps serving
}

TEST_F(Ipc, InvalidParams) {
  start();
  Client c(path_);
  try {
    c.call("add", {{"a", 1}});
    FAIL() << "no error";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.name(), "ftp.InvalidParams");
    EXPECT_EQ(e.code(), -32602);
    EXPECT_EQ(e.data()["param"], "b");
    EXPECT_NE(e.message().find("missing required parameter \"b\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(rpc_name([&] { c.call("add", {{"a", "x"}, {"b", 2}}); }), "ftp.InvalidParams");
  EXPECT_EQ(rpc_name([&] { c.call("add", {{"a", 1.5}, {"b", 2}}); }), "ftp.InvalidParams");
  EXPECT_EQ(rpc_name([&] { c.call("add", Json::array({1, 2})); }), "ftp.InvalidParams");
  EXPECT_EQ(c.call("add", {{"a", 2.0}, {"b", 2}, {"unknown", true}})["sum"], 4);  // unknown fields ignored
}

TEST_F(Ipc, HandlerErrorsAreNamed) {
  start();
  Client c(path_);
  EXPECT_EQ(rpc_name([&] { c.call("fail"); }), "ftp.Internal");
  EXPECT_EQ(rpc_name([&] { c.call("noreply"); }), "ftp.Internal");
  try {
    c.call("gear");
    FAIL() << "no error";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.name(), "ftp.NoSuchGear");
    EXPECT_EQ(e.code(), -32010);
    EXPECT_EQ(e.data()["gear"], "turbo");
    EXPECT_EQ(std::string(e.what()), "ftp.NoSuchGear: no gear \"turbo\"");
  }
  EXPECT_EQ(c.call("echo", {{"value", "still here"}})["value"], "still here");
}

TEST_F(Ipc, SixtyFourConcurrentClients) {
  start();
  constexpr int kClients = 64, kCalls = 100;
  std::atomic<int> ok{0};
  std::vector<std::future<void>> done;
  for (int t = 0; t < kClients; ++t) {
    done.push_back(std::async(std::launch::async, [&, t] {
      Client c(path_);
      for (int i = 0; i < kCalls; ++i) {
        if (i % 2 == 0) {
          Json r = c.call("add", {{"a", t}, {"b", i}}, 60s);
          if (r["sum"] == t + i) ++ok;
        } else {
          std::string v = std::to_string(t) + ":" + std::to_string(i);
          Json r = c.call("echo_async", {{"value", v}}, 60s);
          if (r["value"] == v) ++ok;
        }
      }
    }));
  }
  for (auto& f : done) f.get();
  EXPECT_EQ(ok.load(), kClients * kCalls);
  EXPECT_TRUE(eventually([&] { return server_->connection_count() == 0; }));
}

TEST_F(Ipc, MalformedJsonGetsParseErrorAndConnectionKeepsServing) {
  start();
  Client c(path_), other(path_);
  c.send_raw("{\"jsonrpc\": \"2.0\", nope\n");
  auto m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_TRUE((*m)["id"].is_null());
  EXPECT_EQ((*m)["error"]["code"], -32700);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.ParseError");

  c.send_raw("{\"jsonrpc\":\"1.0\",\"id\":5,\"method\":\"add\"}\n");
  m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["id"], 5);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.InvalidRequest");

  c.send_raw("[{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"add\"}]\n");
  m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.InvalidRequest");

  // Valid syntax the parser refuses (a number past a double): a parse
  // error too, not an exception out of the event loop (which ended the
  // process).
  c.send_raw("{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"add\",\"params\":{\"x\":1e400}}\n");
  m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["error"]["code"], -32700);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.ParseError");

  // A notification (no id) gets no answer: the next line answers id 7.
  c.send_raw("\n{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"value\":1}}\r\n"
             "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"echo\",\"params\":{\"value\":2}}\n");
  m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["id"], 7);
  EXPECT_EQ((*m)["result"]["value"], 2);

  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  EXPECT_EQ(other.call("add", {{"a", 2}, {"b", 2}})["sum"], 4);
}

// A deeply nested line (followed by another member, as it must be for
// nlohmann's ordered map to copy it recursively) overflowed the stack and
// ended the process; now it is a parse error naming where, and the
// connection serves on.
TEST_F(Ipc, DeepNestingIsAParseErrorNotACrash) {
  start();
  Client c(path_);
  const int depth = 300000;
  c.send_raw("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"add\",\"params\":{\"x\":" + std::string(depth, '[') +
             std::string(depth, ']') + ",\"a\":1}}\n");
  auto m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.ParseError");
  EXPECT_NE((*m)["error"]["message"].get<std::string>().find("nesting deeper than 128"), std::string::npos) << m->dump();
  EXPECT_TRUE((*m)["error"]["data"]["byte"].is_number_integer());
  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
}

TEST_F(Ipc, MessageOverConfiguredLimitClosesConnection) {
  auto o = options();
  o.max_message_bytes = 1024;
  start(o);
  Client other(path_);
  {
    Client c(path_);
    c.send_raw(std::string(2000, 'x'));  // no newline: still over the limit
    auto m = c.read_message(10s);
    ASSERT_TRUE(m);
    EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.MessageTooLarge");
    EXPECT_EQ((*m)["error"]["data"]["max_message_bytes"], 1024);
    EXPECT_FALSE(c.read_message(10s));  // then closed
  }
  {
    Client c(path_);
    EXPECT_EQ(rpc_name([&] { c.call("echo", {{"value", std::string(1100, 'y')}}); }), "ftp.MessageTooLarge");
  }
  {
    Client c(path_);  // exactly at the limit is fine
    std::string head = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"length\",\"params\":{\"value\":\"";
    std::string tail = "\"}}";
    std::string line = head + std::string(1024 - head.size() - tail.size(), 'z') + tail;
    ASSERT_EQ(line.size(), 1024u);
    c.send_raw(line + "\n");
    auto m = c.read_message(10s);
    ASSERT_TRUE(m);
    EXPECT_EQ((*m)["result"]["length"], 1024 - head.size() - tail.size());
  }
  EXPECT_EQ(other.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
}

TEST_F(Ipc, MessageOverSixteenMiB) {
  start();
  const std::size_t limit = ftp::ipc::kMaxMessageBytes;
  std::string head = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"length\",\"params\":{\"value\":\"";
  std::string tail = "\"}}";
  {
    Client c(path_);  // exactly 16 MiB: served
    std::string line = head + std::string(limit - head.size() - tail.size(), 'z') + tail + "\n";
    c.send_raw(line);
    auto m = c.read_message(60s);
    ASSERT_TRUE(m);
    EXPECT_EQ((*m)["result"]["length"], limit - head.size() - tail.size());
  }
  {
    Client c(path_);  // 16 MiB + 1: refused, closed
    std::string line = head + std::string(limit + 1 - head.size() - tail.size(), 'z') + tail + "\n";
    try {
      c.send_raw(line);
    } catch (const RpcError& e) {
      EXPECT_EQ(e.name(), "ftp.Disconnected");  // the server may close before all is sent
    }
    auto m = c.read_message(60s);
    ASSERT_TRUE(m);
    EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.MessageTooLarge");
  }
  Client other(path_);
  EXPECT_EQ(other.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
}

TEST_F(Ipc, ClientDisconnectsMidMessage) {
  start();
  Client other(path_);
  EXPECT_EQ(other.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  {
    Client c(path_);
    c.send_raw("{\"jsonrpc\":\"2.0\",\"id\":1,\"meth");
  }
  EXPECT_TRUE(eventually([&] { return logged("mid-message"); }));
  EXPECT_TRUE(eventually([&] { return server_->connection_count() == 1; }));
  EXPECT_EQ(other.call("add", {{"a", 2}, {"b", 3}})["sum"], 5);
}

TEST_F(Ipc, ClientDisconnectsMidStreamCancelsIt) {
  start();
  Client other(path_);
  {
    Client c(path_);
    int items = 0;
    auto r = c.stream("ticks", {{"interval_ms", 2}}, [&](const Json& data) {
      EXPECT_EQ(data["tick"], items);
      return ++items < 3;
    });
    EXPECT_FALSE(r);  // stopped by us: connection closed
    EXPECT_EQ(items, 3);
  }
  EXPECT_TRUE(wait_for([&] { return cancels_ == 1; }));
  {
    Client c(path_);  // gone without reading anything
    c.send_request("ticks", {{"interval_ms", 2}});
  }
  EXPECT_TRUE(wait_for([&] { return cancels_ == 2; }));
  EXPECT_EQ(other.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  // A finished stream: items, then its result.
  Client c(path_);
  int items = 0;
  auto r = c.stream("ticks", {{"count", 5}, {"interval_ms", 0}}, [&](const Json&) { return ++items > 0; });
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)["count"], 5);
  EXPECT_EQ(items, 5);
}

TEST_F(Ipc, ClientThatDoesNotReadItsStreamIsDropped) {
  auto o = options();
  o.max_queued_bytes = 64 * 1024;
  start(o);
  Client c(path_);
  c.send_request("ticks", {{"interval_ms", 0}});  // and never read
  EXPECT_TRUE(wait_for([&] { return cancels_ == 1; }));
  EXPECT_TRUE(logged("does not read"));
  Client other(path_);
  EXPECT_EQ(other.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
}

TEST_F(Ipc, HalfClosedClientStillGetsItsAnswer) {
  start();
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, path_.c_str());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  std::string req = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"slow\",\"params\":{\"ms\":50}}\n";
  ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) got.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(Json::parse(got.substr(0, got.find('\n')))["result"]["slept"], true);
}

TEST_F(Ipc, ShutdownWithClientsOpen) {
  start();
  Client idle(path_);
  EXPECT_EQ(idle.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  std::promise<void> streaming;
  auto stream_result = std::async(std::launch::async, [&] {
    Client c(path_);
    bool first = true;
    return rpc_name([&] {
      c.stream("ticks", {{"interval_ms", 5}}, [&](const Json&) {
        if (first) streaming.set_value();
        first = false;
        return true;
      });
    });
  });
  auto slow_result = std::async(std::launch::async, [&] {
    Client c(path_);
    return rpc_name([&] { c.call("slow", {{"ms", 60000}}, 60s); });
  });
  ASSERT_EQ(streaming.get_future().wait_for(10s), std::future_status::ready);
  ASSERT_TRUE(wait_for([&] { return slow_started_ == 1; }));

  server_->stop();
  EXPECT_EQ(stream_result.get(), "ftp.ShuttingDown");
  EXPECT_EQ(slow_result.get(), "ftp.ShuttingDown");
  std::string n = rpc_name([&] { idle.call("add", {{"a", 1}, {"b", 1}}); });
  EXPECT_TRUE(n == "ftp.ShuttingDown" || n == "ftp.Disconnected") << n;
  EXPECT_FALSE(std::filesystem::exists(path_));
  EXPECT_TRUE(wait_for([&] { return cancels_ == 1; }));
  try {
    Client late(path_);
    FAIL() << "connected to a stopped server";
  } catch (const ftp::Error& e) {
    EXPECT_EQ(e.exit(), Exit::unreachable);
  }
}

TEST_F(Ipc, IdleTimeout) {
  auto o = options();
  o.idle_timeout = 200ms;
  start(o);
  Client c(path_);
  auto m = c.read_message(30s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.IdleTimeout");
  EXPECT_EQ((*m)["error"]["code"], -32003);
  EXPECT_FALSE(c.read_message(30s));
  // A call in progress keeps the connection alive past the idle timeout.
  Client busy(path_);
  EXPECT_EQ(busy.call("slow", {{"ms", 800}}, 30s)["slept"], true);
}

// A client that never reads: its idle connection's close waits for the
// queued answers to go out, so it is cut after shutdown_grace instead of
// holding its socket (and the bytes) for ever.
TEST_F(Ipc, AnIdleClientThatNeverReadsIsCutAfterTheGrace) {
  auto o = options();
  o.idle_timeout = 200ms;
  o.shutdown_grace = 100ms;
  o.max_queued_bytes = 64 << 20;  // under the output quota: only the grace cuts it
  start(o);
  auto fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
  };
  const auto before = fds();
  Client c(path_);
  EXPECT_TRUE(eventually([&] { return fds() == before + 2; }));  // the client's socket and the server's
  // Far more answer bytes than the socket buffers hold, never read.
  const std::string big(16 * 1024, 'x');
  for (int i = 0; i < 400; ++i) c.send_request("echo", {{"value", big}});
  // Idle timeout, graceful close, the grace: only the client's socket is left.
  EXPECT_TRUE(eventually([&] { return fds() == before + 1; })) << fds() - before << " fds left";
}

TEST_F(Ipc, MaxConnections) {
  auto o = options();
  o.max_connections = 2;
  start(o);
  auto a = std::make_unique<Client>(path_);
  Client b(path_);
  EXPECT_EQ(a->call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  EXPECT_EQ(b.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  Client c(path_);
  try {
    c.call("add", {{"a", 1}, {"b", 1}});
    FAIL() << "third connection accepted";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.name(), "ftp.TooManyConnections");
    EXPECT_EQ(e.code(), -32002);
  }
  EXPECT_TRUE(logged("too many connections"));
  a.reset();
  EXPECT_TRUE(eventually([&] {
    try {
      Client d(path_);
      return d.call("add", {{"a", 1}, {"b", 1}})["sum"] == 2;
    } catch (const RpcError&) {
      return false;
    }
  }));
}

TEST_F(Ipc, SocketModeIs0660) {
  start();
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

// A directory every user may write to without the sticky bit would let any
// of them replace the socket with their own: refused, naming it. With the
// sticky bit (as /tmp has) it is fine.
TEST_F(Ipc, SocketDirectoryOthersCanWriteIsRefused) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  Server s(options(), {});
  try {
    s.start();
    FAIL() << "started in a world-writable directory";
  } catch (const ftp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("writable by every user without the sticky bit"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  start();
  EXPECT_EQ(Client(path_).call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  ::chmod(dir_.c_str(), 0700);
}

TEST_F(Ipc, PeerCredentialsAreReadAndLogged) {
  start();
  Client c(path_);
  Json r = c.call("whoami");
  EXPECT_EQ(r["pid"], ::getpid());
  EXPECT_EQ(r["uid"], ::getuid());
  EXPECT_EQ(r["gid"], ::getgid());
  EXPECT_TRUE(logged("pid=" + std::to_string(::getpid()) + " uid=" + std::to_string(::getuid())));
}

TEST_F(Ipc, ClientTimeout) {
  start();
  Client c(path_);
  try {
    c.call("slow", {{"ms", 5000}}, 100ms);
    FAIL() << "no timeout";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.name(), "ftp.Timeout");
    EXPECT_EQ(e.exit(), Exit::timeout);
  }
  EXPECT_FALSE(c.connected());
  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);  // reconnects
}

TEST_F(Ipc, UnreachableDaemonNamesThePath) {
  try {
    Client c(path_);
    FAIL() << "connected";
  } catch (const ftp::Error& e) {
    EXPECT_EQ(e.exit(), Exit::unreachable);
    std::string m = e.what();
    EXPECT_NE(m.find(path_), std::string::npos) << m;
    EXPECT_NE(m.find("No such file"), std::string::npos) << m;
  }
}

TEST_F(Ipc, StaleSocketReplacedLiveSocketRefused) {
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ::close(fd);  // the file stays, no one listens
  }
  start();
  Client c(path_);
  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
  Server second(options(), {});
  try {
    second.start();
    FAIL() << "second server started on a live socket";
  } catch (const ftp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 2}})["sum"], 3);
  EXPECT_TRUE(std::filesystem::exists(path_));
}

TEST(IpcProtocol, DefaultSocketPath) {
  std::string old_sock = getenv("FTP_SOCKET") ? getenv("FTP_SOCKET") : "";
  std::string old_xdg = getenv("XDG_RUNTIME_DIR") ? getenv("XDG_RUNTIME_DIR") : "";
  setenv("FTP_SOCKET", "/tmp/x.sock", 1);
  EXPECT_EQ(ftp::ipc::default_socket_path(), "/tmp/x.sock");
  unsetenv("FTP_SOCKET");
  setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  EXPECT_EQ(ftp::ipc::default_socket_path(), "/run/user/1000/flextp/control.sock");
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(ftp::ipc::default_socket_path(), "/run/flextp/control.sock");
  if (!old_sock.empty()) setenv("FTP_SOCKET", old_sock.c_str(), 1);
  if (!old_xdg.empty()) setenv("XDG_RUNTIME_DIR", old_xdg.c_str(), 1);
}

TEST(IpcProtocol, ErrorTableIsConsistent) {
  const auto& t = ftp::ipc::error_table();
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(t[i].errc), i);
    EXPECT_EQ(t[i].name.rfind("ftp.", 0), 0u);
    for (std::size_t j = i + 1; j < t.size(); ++j) {
      EXPECT_NE(t[i].code, t[j].code);
      EXPECT_NE(t[i].name, t[j].name);
    }
  }
  auto e = RpcError::from_json(ftp::ipc::error_object(Errc::idle_timeout, "idle", Json{{"x", 1}}));
  EXPECT_EQ(e.name(), "ftp.IdleTimeout");
  EXPECT_EQ(e.exit(), Exit::timeout);
  EXPECT_EQ(e.data(), (Json{{"x", 1}}));
  // A peer that does not name its errors: standard codes get our names.
  auto plain = RpcError::from_json(Json{{"code", -32601}, {"message", "nope"}});
  EXPECT_EQ(plain.name(), "ftp.NoSuchMethod");
}

namespace {

/// A raw connection to `path`: the answer lines as sent, unparsed.
class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path.c_str());
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawConn() { ::close(fd_); }
  bool ok() const { return ok_; }
  int fd() const { return fd_; }
  void send(const std::string& s) const {
    std::size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<std::size_t>(n);
    }
  }
  /// The next line, without its '\n' ("" at the end of the stream).
  std::string line() {
    char ch;
    std::string out;
    while (::read(fd_, &ch, 1) == 1) {
      if (ch == '\n') return out;
      out += ch;
    }
    return out;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

}  // namespace

// Issue 20, hostile input 4: a client that sends 12,000 calls and never
// reads is cut once its unread answers pass the quota, and what they held is
// freed (63 MB stayed queued before); the server serves on.
TEST_F(Ipc, OutputQuotaCutsAClientThatSendsCallsAndNeverReads) {
  start();  // the default quota, 1 MiB
  EXPECT_EQ(server_->introspect()["limits"]["max_queued_bytes"], 1 << 20);
  // 12,000 answers of ~560 bytes: 6.7 MB, far more than the quota and the
  // socket's buffers.
  std::string calls;
  for (int i = 0; i < 12000; ++i)
    calls += "{\"jsonrpc\":\"2.0\",\"id\":" + std::to_string(i) + R"(,"method":"echo","params":{"value":")" +
             std::string(512, 'v') + "\"}}\n";
  {
    RawConn c(path_);
    ASSERT_TRUE(c.ok());
    c.send(calls);  // returns once the server has cut the connection (EPIPE), or all is sent
    EXPECT_TRUE(eventually([&] { return logged("over the quota of 1048576"); }));
    EXPECT_TRUE(eventually([&] { return server_->connection_count() == 0; }));
    EXPECT_TRUE(eventually([&] { return server_->queued_bytes() == 0; })) << server_->queued_bytes();
  }
  Client other(path_);
  EXPECT_EQ(other.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
}

// A client that reads gets every answer, however many it asks for.
TEST_F(Ipc, OutputQuotaLetsAReadingClientThrough) {
  auto o = options();
  o.max_queued_bytes = 4 * 1024;
  start(o);
  Client c(path_);
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(c.call("echo", {{"value", std::string(8192, 'x')}})["value"].get<std::string>().size(), 8192u);
  EXPECT_EQ(server_->queued_bytes(), 0u);
}

// Issue 20, hostile input 8: a 30-digit JSON-RPC id comes back with the same
// digits (not as the float 1.2345678901234568e+29), in results, stream items
// and errors.
TEST_F(Ipc, ThirtyDigitIdComesBackExactly) {
  start();
  const std::string id = "123456789012345678901234567890";
  RawConn c(path_);
  ASSERT_TRUE(c.ok());
  c.send(R"({"jsonrpc":"2.0","id":)" + id + R"(,"method":"add","params":{"a":1,"b":2}})" "\n");
  EXPECT_EQ(c.line(), R"({"jsonrpc":"2.0","id":)" + id + R"(,"result":{"sum":3}})");
  c.send(R"({"jsonrpc":"2.0","id":)" + id + R"(,"method":"ticks","params":{"count":1,"interval_ms":0}})" "\n");
  EXPECT_EQ(c.line(), R"({"jsonrpc":"2.0","method":"ftp.stream","params":{"id":)" + id +
                          R"(,"method":"ticks","data":{"tick":0}}})");
  EXPECT_EQ(c.line(), R"({"jsonrpc":"2.0","id":)" + id + R"(,"result":{"count":1}})");
  c.send(R"({"jsonrpc":"2.0","id":-1.50e3,"method":"nosuch"})" "\n");
  EXPECT_EQ(c.line().rfind(R"({"jsonrpc":"2.0","id":-1.50e3,"error":)", 0), 0u);
  c.send(R"({"jsonrpc":"2.0","id":"s","method":"add","params":{"a":1,"b":1}})" "\n");
  EXPECT_EQ(c.line(), R"({"jsonrpc":"2.0","id":"s","result":{"sum":2}})");
}

// Issue 20, hostile input 1: a line of 80,000 keys is refused by the key
// limit while parsing (it blocked status on another connection for 13.4 s),
// naming the limit; the connection serves on.
TEST_F(Ipc, ObjectOverTheKeyLimitIsAParseErrorNamingIt) {
  start();
  std::string params = "{";
  for (int i = 0; i < 80000; ++i) params += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  params += "}";
  Client c(path_);
  c.send_raw(R"({"jsonrpc":"2.0","id":1,"method":"echo","params":)" + params + "}\n");
  auto m = c.read_message(10s);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)["error"]["data"]["name"], "ftp.ParseError");
  EXPECT_EQ((*m)["error"]["data"]["limit"], "max_keys");
  EXPECT_NE((*m)["error"]["message"].get<std::string>().find("more than 4096 keys"), std::string::npos) << m->dump();
  EXPECT_EQ(c.call("add", {{"a", 1}, {"b", 1}})["sum"], 2);
}

// Issue 20, hostile input 7: in a directory every user may write to, another
// user can listen at the socket's path first; the client refuses a server
// that runs as neither root nor this user, naming its uid and user.
TEST_F(Ipc, ClientRefusesAServerOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a listener as another user (nobody, uid 65534)";
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the squatter: nobody, listening at the daemon's path
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(1);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 8) != 0) ::_exit(2);
    (void)::write(ready[1], "r", 1);
    for (;;) {
      int c = ::accept(fd, nullptr, nullptr);
      if (c >= 0) ::close(c);
    }
  }
  ::close(ready[1]);
  char r = 0;
  ASSERT_EQ(::read(ready[0], &r, 1), 1) << "the squatter did not start";
  ::close(ready[0]);
  std::string what;
  Exit exit = Exit::ok;
  try {
    Client c(path_);
  } catch (const ftp::Error& e) {
    what = e.what();
    exit = e.exit();
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(exit, Exit::unreachable);
  EXPECT_NE(what.find("served by uid 65534 (nobody)"), std::string::npos) << what;
  EXPECT_NE(what.find("not by root or this user"), std::string::npos) << what;
}
