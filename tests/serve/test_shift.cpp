// SPDX-License-Identifier: Apache-2.0
// Live gear shifts under load on CPU virtual devices (stories260K): no
// request lost, every greedy completion equal to the static output, no
// request served by two domains; rollback, refusals, drains.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "core/error.hpp"
#include "doc/gear_table.hpp"
#include "model/model.hpp"
#include "control/clock.hpp"
#include "engine/domain.hpp"
#include "engine/rank_backend.hpp"
#include "engine/weight_store.hpp"
#include "ipc/client.hpp"
#include "serve/control_socket.hpp"
#include "serve/domain_runner.hpp"
#include "serve/generate.hpp"
#include "serve/remote.hpp"
#include "serve/service.hpp"
#include "test_data.hpp"

using namespace ftp::serve;

namespace {

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v ? v : dflt;
}

std::string model_path() { return ftp::test::stories260k("stories260K.gguf"); }
std::string gears_path() { return env_or("FTP_SOURCE_ROOT", ".") + "/examples/gears/stories260K-cpu.json"; }

const std::vector<std::string> kPrompts = {
    "Zoo",       "Once upon a time", "The cat",   "Lily and Ben", "A big red ball", "She saw",
    "One day",   "The sun was",      "Tom had a", "In the park",  "Mom said",       "The little dog",
    "He wanted", "They played",      "Sue",       "The bird",
};

struct Result {
  std::string text;
  std::set<std::string> domains;
  ftp::engine::FinishReason finish_reason = ftp::engine::FinishReason::none;
  std::string error;
};

/// Submits one request; the future holds its result once it ended.
/// `on_first` runs at its first event. Refusals throw here.
std::future<Result> send(Service& svc, const std::string& id, const std::string& prompt, int max_tokens,
                         std::function<void()> on_first = {}) {
  struct State {
    std::mutex mu;
    Result r;
    bool told = false;
    std::promise<Result> done;
  };
  auto st = std::make_shared<State>();
  CompletionRequest req;
  req.id = id;
  req.prompt = prompt;
  req.max_tokens = max_tokens;
  req.on_event = [st, on_first = std::move(on_first)](const CompletionEvent& e) {
    std::lock_guard lk(st->mu);
    st->r.text += e.text;
    st->r.domains.insert(e.domain_id);
    if (!std::exchange(st->told, true) && on_first) on_first();
    if (e.finished) {
      st->r.finish_reason = e.finish_reason;
      st->r.error = e.error;
      st->done.set_value(st->r);
    }
  };
  auto fut = st->done.get_future();
  svc.submit(std::move(req));
  return fut;
}

/// Submits one request and waits for its end.
Result complete(Service& svc, const std::string& id, const std::string& prompt, int max_tokens) {
  return send(svc, id, prompt, max_tokens).get();
}

/// The name of the error `fn` throws: a ControlError's name, "InputError: "
/// and the message, or "<none>".
std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ControlError& e) {
    return e.name();
  } catch (const ftp::InputError& e) {
    return std::string("InputError: ") + e.what();
  }
  return "<none>";
}

/// Starts a shift to `to` with ramp steps of `step_ms` on a thread and
/// returns once its shadow is warm (the ramp has begun).
std::thread slow_shift(Service& svc, const std::string& to, int step_ms) {
  auto in_ramp = std::make_shared<std::atomic<bool>>(false);
  std::thread t([&svc, to, step_ms, in_ramp] {
    Service::ShiftOptions slow;
    slow.to = to;
    slow.step_interval_ms = step_ms;
    svc.shift(slow, [&](const ftp::doc::ShiftEvent& e) {
      if (e.phase == ftp::doc::ShiftPhase::warm) *in_ramp = true;
    });
  });
  while (!*in_ramp) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return t;
}

struct ShiftFixture : ::testing::Test {
  static inline std::unique_ptr<ftp::model::Model> model;
  static inline ftp::doc::GearTable table;
  static inline std::map<std::string, std::string> reference;  // prompt -> static greedy text
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    model = std::make_unique<ftp::model::Model>(ftp::model::load_model(model_path()));
    table = ftp::json::parse_file(gears_path(), [](const auto& j) { return ftp::doc::gear_table_from_json(j); });
    // The static single-gear output of each prompt: one-shot at TP 1.
    for (const auto& p : kPrompts) {
      GenerateOptions o;
      o.prompt = p;
      o.max_tokens = 40;
      reference[p] = generate_once(*model, o, [](std::string_view) {});
    }
  }
  void SetUp() override {
    if (!model) GTEST_SKIP() << "stories260K.gguf not found at " << model_path() << " (set FTP_TEST_DATA)";
  }
  ServiceConfig config() const {
    ServiceConfig c;
    c.model_name = "stories260K";
    c.gears = table;
    c.kv_blocks = 256;
    c.step_interval_ms = 20;
    return c;
  }
};

}  // namespace

TEST_F(ShiftFixture, SixteenStreamingClientsThroughTwentyShifts) {
  Service svc(*model, config());
  svc.start();
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, failed{0}, mismatched{0}, two_domains{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c)
    clients.emplace_back([&, c] {
      for (int i = 0; !stop.load(); ++i) {
        const std::string& p = kPrompts[static_cast<std::size_t>((c + i) % kPrompts.size())];
        Result r;
        try {
          r = complete(svc, "c" + std::to_string(c) + "-" + std::to_string(i), p, 40);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "client " << c << ": submit refused: " << e.what();
          ++failed;
          continue;
        }
        if (r.finish_reason == ftp::engine::FinishReason::error) {
          ADD_FAILURE() << "client " << c << ": " << r.error;
          ++failed;
        }
        if (r.text != reference[p]) {
          ADD_FAILURE() << "prompt \"" << p << "\": got \"" << r.text << "\", static \"" << reference[p] << "\"";
          ++mismatched;
        }
        if (r.domains.size() != 1) ++two_domains;
        ++completed;
      }
    });
  // TP 1 <-> 2 <-> 4 and PP 1 <-> 2, twenty times.
  const std::vector<std::string> cycle = {"standard", "performance", "standard", "economy", "pipelined"};
  std::vector<double> overhead_ms;
  for (int s = 0; s < 20; ++s) {
    Service::ShiftOptions o;
    o.to = cycle[static_cast<std::size_t>(s) % cycle.size()];
    std::int64_t t_reserve = -1, t_full = -1;
    auto done = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) {
      if (e.phase == ftp::doc::ShiftPhase::reserve) t_reserve = e.t_ms;
      if (e.phase == ftp::doc::ShiftPhase::ramp && e.traffic_share >= 1.0) t_full = e.t_ms;
    });
    ASSERT_EQ(done.outcome, ftp::doc::ShiftOutcome::committed) << done.message;
    EXPECT_EQ(svc.current_gear(), o.to);
    // Acceptance to 100 % on the new domain, minus the two ramp waits.
    overhead_ms.push_back(static_cast<double>(t_full - t_reserve) - 2 * 20);
  }
  stop = true;
  for (auto& t : clients) t.join();
  std::sort(overhead_ms.begin(), overhead_ms.end());
  std::printf("shift: %d completions during 20 shifts; acceptance -> 100 %% minus ramp waits: median %.1f ms, max %.1f ms\n",
              completed.load(), overhead_ms[overhead_ms.size() / 2], overhead_ms.back());
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(mismatched.load(), 0);
  EXPECT_EQ(two_domains.load(), 0);
  EXPECT_GT(completed.load(), 16);
  auto st = svc.status();
  EXPECT_EQ(st["requests_failed"], 0);
  EXPECT_EQ(svc.records().size(), 20u);
}

// The control plane reads time only from the injected clock (rule 4): with a
// virtual clock that stands still, every stamp is its time, and moving it
// moves them.
TEST_F(ShiftFixture, ControlPlaneTimeComesFromTheInjectedClock) {
  auto clock = std::make_shared<ftp::control::VirtualClock>(50000);
  ServiceConfig c = config();
  c.clock = clock;
  c.step_interval_ms = 30000;  // virtual: the test moves the clock, nobody waits 30 s
  Service svc(*model, c);
  svc.start();
  EXPECT_EQ(svc.observe().t_ms, 0);
  clock->advance(7000);
  EXPECT_EQ(svc.observe().t_ms, 7000);
  Service::ShiftOptions o;
  o.to = "standard";
  std::vector<ftp::doc::ShiftEvent> events;
  // The shifter sleeps on the clock at each ramp step (10 %, 50 %): the test
  // is the time, moving it 30 s whenever the shifter waits.
  auto shift = std::async(std::launch::async, [&] {
    return svc.shift(o, [&](const ftp::doc::ShiftEvent& e) { events.push_back(e); });
  });
  int moved = 0;
  while (shift.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready)
    if (const std::int64_t wake = clock->next_wake_ms(); wake > clock->now_ms()) {
      clock->set(wake);
      ++moved;
    }
  auto rec = shift.get();
  EXPECT_EQ(rec.outcome, ftp::doc::ShiftOutcome::committed) << rec.message;
  EXPECT_EQ(moved, 2);  // two checked ramp steps; 100 % needs no wait
  ASSERT_FALSE(events.empty());
  int ramp_steps = 0;
  for (const auto& e : events) {
    if (e.phase == ftp::doc::ShiftPhase::reserve || e.phase == ftp::doc::ShiftPhase::warm) {
      EXPECT_EQ(e.t_ms, 7000) << e.phase;
      EXPECT_EQ(e.phase_ms, 0.0) << e.phase;
    } else if (e.phase == ftp::doc::ShiftPhase::ramp && e.traffic_share < 1.0) {
      // Each checked step took exactly its virtual interval.
      ++ramp_steps;
      EXPECT_EQ(e.t_ms, 7000 + 30000 * ramp_steps) << e.phase << " " << e.traffic_share;
      EXPECT_EQ(e.phase_ms, 30000.0) << e.phase;
    } else {
      EXPECT_EQ(e.t_ms, 67000) << e.phase;
      EXPECT_EQ(e.phase_ms, 0.0) << e.phase;
    }
  }
  EXPECT_EQ(ramp_steps, 2);
  svc.drain_and_stop();
}

TEST_F(ShiftFixture, FailedCheckRollsBackWithoutFailingRequests) {
  Service svc(*model, config());
  svc.start();
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0};
  std::thread client([&] {
    for (int i = 0; !stop; ++i)
      if (complete(svc, "r" + std::to_string(i), kPrompts[static_cast<std::size_t>(i) % kPrompts.size()], 30)
              .finish_reason == ftp::engine::FinishReason::error)
        ++failed;
  });
  Service::ShiftOptions o;
  o.to = "performance";
  o.inject_fault = "check";
  std::vector<std::string> phases;
  auto done = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) { phases.emplace_back(ftp::doc::to_string(e.phase)); });
  stop = true;
  client.join();
  EXPECT_EQ(done.outcome, ftp::doc::ShiftOutcome::rolled_back);
  EXPECT_NE(std::find(phases.begin(), phases.end(), "rollback"), phases.end());
  EXPECT_EQ(svc.current_gear(), "economy");
  EXPECT_EQ(failed.load(), 0);
  auto st = svc.status();
  ASSERT_EQ(st["domains"].size(), 1u);
  EXPECT_EQ(st["domains"][0]["gear"], "economy");
  EXPECT_EQ(st["domains"][0]["state"], "serving");
}

TEST_F(ShiftFixture, RefusalsAreNamed) {
  Service svc(*model, config());
  svc.start();
  Service::ShiftOptions o;
  o.to = "turbo";
  EXPECT_EQ(refusal([&] { svc.shift(o, nullptr); }), "ftp.NoSuchGear");
  o.to = "economy";
  EXPECT_EQ(refusal([&] { svc.shift(o, nullptr); }), "ftp.SameGear");
  // A shift during a shift.
  std::thread t = slow_shift(svc, "standard", 300);
  o.to = "performance";
  EXPECT_EQ(refusal([&] { svc.shift(o, nullptr); }), "ftp.ShiftInProgress");
  t.join();
  EXPECT_EQ(svc.current_gear(), "standard");
  // The last serving domain is not drained without force.
  std::string last = svc.status()["domains"][0]["id"];
  EXPECT_EQ(refusal([&] { svc.drain_domain(last, false, 1000, nullptr); }), "ftp.LastDomain");
  EXPECT_EQ(refusal([&] { svc.drain_domain("d999", false, 1000, nullptr); }), "ftp.NoSuchDomain");
}

TEST_F(ShiftFixture, DrainingAReplicaKeepsServing) {
  Service svc(*model, config());
  svc.start();
  Service::ShiftOptions o;
  o.to = "replicated";  // dp = 2 on vd2, vd3
  ASSERT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  auto ids = svc.domains_on_devices({"vd3"});
  ASSERT_EQ(ids.size(), 1u);
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0};
  std::thread client([&] {
    for (int i = 0; !stop; ++i)
      if (complete(svc, "r" + std::to_string(i), "Zoo", 20).finish_reason == ftp::engine::FinishReason::error) ++failed;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  svc.drain_domain(ids[0], false, 60000, nullptr);
  EXPECT_EQ(complete(svc, "after", "Zoo", 40).text, reference["Zoo"]);
  stop = true;
  client.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(svc.status()["domains"].size(), 1u);
}

TEST_F(ShiftFixture, BadRequestsAreRefusedAndServiceKeepsServing) {
  auto c = config();
  c.max_tokens_limit = 100;
  Service svc(*model, c);
  svc.start();
  auto status_of = [&](CompletionRequest r) {
    try {
      svc.submit(std::move(r));
    } catch (const RequestError& e) {
      return e.kind() == Refusal::draining || e.kind() == Refusal::no_domain ? 503 : 400;
    }
    return 0;
  };
  CompletionRequest r;
  r.prompt = "Zoo";
  r.max_tokens = 101;
  EXPECT_EQ(status_of(r), 400);
  r.max_tokens = 0;
  EXPECT_EQ(status_of(r), 400);
  r.max_tokens = 10;
  r.prompt_tokens.assign(static_cast<std::size_t>(svc.context_length()), 300);
  EXPECT_EQ(status_of(r), 400);
  EXPECT_EQ(complete(svc, "ok", "Zoo", 40).text, reference["Zoo"]);
}

TEST_F(ShiftFixture, ReleaseModeDropsAndPrefetchesWeightsAndOutputsStayTheSame) {
  auto c = config();
  for (auto& g : c.gears.gears)
    if (g.name == "performance") g.weight_mode = "release";
  Service svc(*model, c);
  svc.start();
  std::vector<std::string> messages;
  auto collect = [&](const ftp::doc::ShiftEvent& e) { messages.push_back(std::string(ftp::doc::to_string(e.phase)) + ": " + e.message); };
  Service::ShiftOptions o;
  o.to = "performance";
  ASSERT_EQ(svc.shift(o, collect).outcome, ftp::doc::ShiftOutcome::committed);
  EXPECT_EQ(complete(svc, "a", "Zoo", 40).text, reference["Zoo"]);
  o.to = "economy";
  ASSERT_EQ(svc.shift(o, collect).outcome, ftp::doc::ShiftOutcome::committed);
  // Leaving the release-mode gear, vd1..vd3 drop their weights; vd0 keeps them.
  auto has = [&](const std::string& prefix) {
    return std::any_of(messages.begin(), messages.end(), [&](const std::string& m) {
      auto at = m.find(prefix);
      return at != std::string::npos && m.compare(at + prefix.size(), 2, "0 ") != 0;
    });
  };
  EXPECT_TRUE(has("weights prefetched: ")) << ::testing::PrintToString(messages);
  EXPECT_TRUE(has("weights released: ")) << ::testing::PrintToString(messages);
  // Pages come back from the file: the same text, at every gear.
  EXPECT_EQ(complete(svc, "b", "Zoo", 40).text, reference["Zoo"]);
  o.to = "performance";
  ASSERT_EQ(svc.shift(o, collect).outcome, ftp::doc::ShiftOutcome::committed);
  EXPECT_EQ(complete(svc, "c", "Zoo", 40).text, reference["Zoo"]);
}

TEST_F(ShiftFixture, RouterSendsLongPromptsToTheLargestTpDomain) {
  auto c = config();
  c.route_long_prompt_tokens = 8;
  Service svc(*model, c);
  svc.start();
  std::atomic<bool> stop{false};
  // Keep a shift half-way (ramp at 50 %) so that two domains serve at once.
  std::thread t([&] {
    Service::ShiftOptions o;
    o.to = "performance";
    o.ramp = {0.5, 1.0};
    o.step_interval_ms = 400;
    svc.shift(o, nullptr);
  });
  for (int i = 0; i < 400 && svc.status()["domains"].size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::set<std::string> long_domains, short_domains;
  for (int i = 0; i < 6; ++i) {
    long_domains.merge(complete(svc, "l" + std::to_string(i), "Once upon a time there was a little dog", 4).domains);
    short_domains.merge(complete(svc, "s" + std::to_string(i), "Zoo", 4).domains);
  }
  t.join();
  ASSERT_EQ(long_domains.size(), 1u);  // always the TP-4 shadow domain
  EXPECT_GE(short_domains.size(), 2u);  // spread over both by weight
  // The TP-4 domain is the one left after the shift.
  EXPECT_EQ(*long_domains.begin(), svc.status()["domains"][0]["id"].get<std::string>());
}

// Without --kv-blocks, a domain's KV pool is the gear's kv_cache_cap of each
// virtual device's free memory, at most what max_running requests of the
// full context need; a shadow domain is sized from what the serving one
// left free.
TEST_F(ShiftFixture, KvPoolFollowsTheGearsCapOfFreeDeviceMemory) {
  const auto& hp = model->hparams;
  const int bt = 16, full = (hp.n_ctx_train + bt - 1) / bt;
  ServiceConfig c = config();
  c.kv_blocks = 0;
  c.max_running = 64;
  // economy: TP 1 on vd0, every KV head of every layer on one rank.
  // 16-bit pages: ftp-serve's default KV cache (--kv-cache-dtype auto).
  const std::uint64_t per_page = 2ull * hp.n_layer * hp.n_head_kv * bt * hp.head_dim * 2;
  const int needed = 64 * full;
  std::uint64_t budget = 0;
  {
    Service probe(*model, c);
    const auto st = probe.status();
    for (const auto& d : st["devices"])
      if (d["id"] == "vd0") budget = d["memory_budget"].get<std::uint64_t>();
  }
  ASSERT_GT(budget, 0u);
  // A cap that holds half of what the batch could use.
  const double cap = 0.5 * static_cast<double>(needed) * static_cast<double>(per_page) / static_cast<double>(budget);
  for (auto& g : c.gears.gears) g.kv_cache_cap = cap;
  c.start_gear = "economy";
  Service svc(*model, c);
  svc.start();
  auto kv_blocks_of = [&](const std::string& state) {
    const auto st = svc.status();
    for (const auto& d : st["domains"])
      if (d["state"] == state) return d["kv_blocks"].get<int>();
    return -1;
  };
  const int first = kv_blocks_of("serving");
  EXPECT_EQ(first, static_cast<int>(cap * static_cast<double>(budget) / static_cast<double>(per_page)));
  EXPECT_LT(first, needed);
  EXPECT_GE(first, needed / 2 - 1);
  // Requests still complete, with the static output.
  EXPECT_EQ(complete(svc, "kv-1", "Zoo", 40).text, reference["Zoo"]);
  // A shift to standard (TP 2 on vd0, vd1): the shadow is sized while the
  // economy domain still holds its pages on vd0.
  Service::ShiftOptions o;
  o.to = "standard";
  ASSERT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  const double per_rank = static_cast<double>(per_page / 2);  // half the KV heads each
  const double free_vd0 = static_cast<double>(budget - static_cast<std::uint64_t>(first) * per_page);
  const int expect = static_cast<int>(std::min(cap * free_vd0 / per_rank, static_cast<double>(needed)));
  EXPECT_EQ(kv_blocks_of("serving"), expect);
  EXPECT_LT(expect, needed);

  // Without a cap that binds, the batch's need decides.
  ServiceConfig wide = config();
  wide.kv_blocks = 0;
  wide.start_gear = "economy";
  Service svc2(*model, wide);
  svc2.start();
  EXPECT_EQ(svc2.status()["domains"][0]["kv_blocks"].get<int>(), needed);
}

TEST_F(ShiftFixture, KvCapTooSmallForOneRequestNamesTheDevice) {
  ServiceConfig c = config();
  c.kv_blocks = 0;
  for (auto& g : c.gears.gears) g.kv_cache_cap = 1e-9;
  c.start_gear = "economy";
  Service svc(*model, c);
  try {
    svc.start();
    FAIL() << "a KV pool of no page was built";
  } catch (const ftp::InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("device vd0"), std::string::npos) << m;
    EXPECT_NE(m.find("kv_cache_cap"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes free"), std::string::npos) << m;
  }
}

TEST_F(ShiftFixture, StoppedDomainRefusesNewRequestsUntouched) {
  // A request routed to a domain that retires before its submit must not
  // wait on a thread that has ended: the runner refuses it, intact, and the
  // service routes it again.
  ftp::engine::WeightStore store(*model);
  ftp::engine::DomainConfig dc;
  dc.kv_blocks = 64;
  DomainRunner d("dx", "economy", {}, model->hparams, dc, ftp::engine::Domain::real_engine(store));
  ftp::engine::GenerationRequest ok;
  ok.id = "before";
  ok.prompt = {1};
  ok.max_tokens = 1;
  std::promise<std::string> finished;
  ok.on_event = [&](const ftp::engine::GenerationEvent& e) {
    if (e.finished) finished.set_value(std::string(ftp::engine::to_string(e.finish_reason)));
  };
  ASSERT_TRUE(d.submit(std::move(ok)));
  EXPECT_EQ(finished.get_future().get(), "length");
  d.stop();
  ftp::engine::GenerationRequest late;
  late.id = "late";
  late.prompt = {1, 2};
  EXPECT_FALSE(d.submit(std::move(late)));
  EXPECT_EQ(late.id, "late");
  EXPECT_EQ(late.prompt.size(), 2u);
}

TEST_F(ShiftFixture, MetricsEscapeTheGearLabel) {
  ServiceConfig c = config();
  c.gears.gears[0].name = "eco\"no\\my\nx";
  c.start_gear = c.gears.gears[0].name;
  Service svc(*model, c);
  svc.start();
  const std::string m = svc.prometheus();
  EXPECT_NE(m.find(",gear=\"eco\\\"no\\\\my\\nx\"} 1\n"), std::string::npos) << m;
}

TEST_F(ShiftFixture, ReloadDuringAShiftAnswersAtOnceAndWrongModelsAreRefused) {
  Service svc(*model, config());
  svc.start();
  std::thread t = slow_shift(svc, "standard", 500);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(refusal([&] { svc.reload(table); }), "ftp.ShiftInProgress");
  // It did not wait for the ramp (two steps of 500 ms).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
  t.join();
  EXPECT_EQ(svc.gear_table_generation(), 0u);
  ftp::doc::GearTable other = table;
  other.model.n_layers = 8;
  const std::string refused = refusal([&] { svc.reload(other); });
  EXPECT_EQ(refused.rfind("InputError: ", 0), 0u) << refused;
  EXPECT_NE(refused.find("the model has 8"), std::string::npos) << refused;
  EXPECT_EQ(refusal([&] { svc.reload(table); }), "<none>");
  EXPECT_EQ(svc.gear_table_generation(), 1u);
}

TEST_F(ShiftFixture, AfterAForcedDrainOfTheLastDomainAShiftBringsTheGearBack) {
  Service svc(*model, config());
  svc.start();
  EXPECT_TRUE(svc.ready());
  std::string last = svc.status()["domains"][0]["id"];
  svc.drain_domain(last, true, 60000, nullptr);
  EXPECT_FALSE(svc.ready());
  EXPECT_EQ(svc.status()["ready"], false);  // status agrees with /ready (503)
  EXPECT_EQ(svc.serving_domains(), 0);
  try {
    complete(svc, "none", "Zoo", 4);
    ADD_FAILURE() << "a request was accepted with no serving domain";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.kind(), Refusal::no_domain);
  }
  Service::ShiftOptions o;
  o.to = svc.current_gear();  // the same gear: nothing serves it any more
  EXPECT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  EXPECT_TRUE(svc.ready());
  EXPECT_EQ(svc.status()["ready"], true);
  EXPECT_EQ(complete(svc, "back", "Zoo", 40).text, reference["Zoo"]);
}

namespace {

/// The real engine with a pause before each step while `pause_ms` > 0: a
/// request on it is certain to be in flight for pause_ms x its tokens.
class PacedEngine final : public ftp::engine::Engine {
 public:
  PacedEngine(std::unique_ptr<ftp::engine::Engine> inner, std::shared_ptr<std::atomic<int>> pause_ms)
      : inner_(std::move(inner)), pause_ms_(std::move(pause_ms)) {}
  const ftp::model::HParams& hparams() const override { return inner_->hparams(); }
  int block_tokens() const override { return inner_->block_tokens(); }
  std::uint64_t kv_bytes() const override { return inner_->kv_bytes(); }
  std::vector<std::vector<float>> forward(const std::vector<ftp::engine::SeqChunk>& c, int mb) override {
    pause();
    return inner_->forward(c, mb);
  }
  void recycle(std::vector<std::vector<float>>&& logits) override { inner_->recycle(std::move(logits)); }
  std::vector<int> forward_choose(const std::vector<ftp::engine::SeqChunk>& c, int mb,
                                  const std::vector<ftp::engine::TokenChoice>& choices) override {
    pause();
    return inner_->forward_choose(c, mb, choices);
  }
  const std::vector<double>& stage_busy_s() const override { return inner_->stage_busy_s(); }
  void set_background() override { inner_->set_background(); }
  std::string failure() const override { return inner_->failure(); }

 private:
  void pause() const {
    if (int ms = pause_ms_->load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  std::unique_ptr<ftp::engine::Engine> inner_;
  std::shared_ptr<std::atomic<int>> pause_ms_;
};

/// A service whose domains run PacedEngines over `store`, all paused by `pause_ms`.
ServiceConfig paced(ServiceConfig c, const ftp::engine::WeightStore& store, std::shared_ptr<std::atomic<int>> pause_ms) {
  c.engine_factory = [&store, pause_ms](const ftp::doc::Replica&, const ftp::engine::DomainConfig& dc) {
    return std::make_unique<PacedEngine>(ftp::engine::Domain::real_engine(store)(dc), pause_ms);
  };
  return c;
}

/// Sends a request and returns its result's future once its first token came.
std::future<Result> in_flight(Service& svc, const std::string& id, int max_tokens) {
  auto first = std::make_shared<std::promise<void>>();
  auto fut = send(svc, id, "Zoo", max_tokens, [first] { first->set_value(); });
  first->get_future().wait();
  return fut;
}

std::vector<std::string> states(const Service& svc) {
  std::vector<std::string> out;
  const auto st = svc.status();  // named: a range-for over a temporary's member would dangle
  for (const auto& d : st["domains"]) out.push_back(d["state"].get<std::string>());
  return out;
}

}  // namespace

// A shift whose old domain is still busy when the drain timeout passes
// returns (committed, the record says so); the old domain finishes its
// request, takes no new ones, and the next shift retires it.
TEST_F(ShiftFixture, AShiftReturnsAfterTheDrainTimeoutAndTheOldDomainRetiresLater) {
  ftp::engine::WeightStore store(*model);
  auto pause_ms = std::make_shared<std::atomic<int>>(0);
  ServiceConfig c = paced(config(), store, pause_ms);
  c.drain_timeout_ms = 50;
  c.step_interval_ms = 0;
  Service svc(*model, c);
  svc.start();
  pause_ms->store(20);  // 400 tokens: at least 8 s on the old domain
  auto busy = in_flight(svc, "busy", 400);
  Service::ShiftOptions o;
  o.to = "standard";
  std::vector<std::string> drain_msgs;
  const auto ev = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) {
    if (e.phase == ftp::doc::ShiftPhase::drain || e.phase == ftp::doc::ShiftPhase::retire) drain_msgs.push_back(e.message);
  });
  EXPECT_EQ(ev.outcome, ftp::doc::ShiftOutcome::committed);
  ASSERT_EQ(drain_msgs.size(), 2u);
  EXPECT_NE(drain_msgs[0].find("drain timed out"), std::string::npos) << drain_msgs[0];
  EXPECT_NE(drain_msgs[1].find("still draining"), std::string::npos) << drain_msgs[1];
  EXPECT_EQ(busy.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the request ended too soon";
  const auto during = states(svc);
  EXPECT_EQ(std::count(during.begin(), during.end(), "draining"), 1) << svc.status()["domains"].dump();
  // New requests go to the new domain meanwhile.
  pause_ms->store(0);
  const Result fresh = complete(svc, "fresh", "Zoo", 40);
  EXPECT_EQ(fresh.text, reference["Zoo"]);
  const Result old = busy.get();
  EXPECT_EQ(old.finish_reason, ftp::engine::FinishReason::length) << old.error;
  EXPECT_EQ(old.domains.size(), 1u);
  EXPECT_NE(fresh.domains, old.domains);
  // The next shift retires the old domain, now idle.
  o.to = "economy";
  EXPECT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  EXPECT_EQ(states(svc), std::vector<std::string>{"serving"}) << svc.status()["domains"].dump();
}

// SIGTERM's drain waits drain_timeout_ms; a request still running then ends
// with an error event that says why, and the service stops.
TEST_F(ShiftFixture, StoppingAfterTheDrainTimeoutEndsTheRestWithAnError) {
  ftp::engine::WeightStore store(*model);
  auto pause_ms = std::make_shared<std::atomic<int>>(0);
  ServiceConfig c = paced(config(), store, pause_ms);
  c.drain_timeout_ms = 50;
  Service svc(*model, c);
  svc.start();
  pause_ms->store(20);
  auto busy = in_flight(svc, "busy", 400);
  svc.drain_and_stop();
  const Result r = busy.get();
  EXPECT_EQ(r.finish_reason, ftp::engine::FinishReason::error);
  EXPECT_NE(r.error.find("drain timeout of 50 ms"), std::string::npos) << r.error;
  EXPECT_TRUE(states(svc).empty()) << svc.status()["domains"].dump();
}

// A drain that times out leaves the domain draining (named error); the
// next drain or shift retires it once idle and frees its device.
TEST_F(ShiftFixture, ADrainThatTimesOutIsRetiredOnceIdle) {
  ftp::engine::WeightStore store(*model);
  auto pause_ms = std::make_shared<std::atomic<int>>(0);
  Service svc(*model, paced(config(), store, pause_ms));
  svc.start();
  Service::ShiftOptions o;
  o.to = "replicated";
  ASSERT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  auto ids = svc.domains_on_devices({"vd3"});
  ASSERT_EQ(ids.size(), 1u);
  // Requests alternate between the two replicas: one of two is on vd3's.
  pause_ms->store(20);
  auto a = in_flight(svc, "a", 400);
  auto b = in_flight(svc, "b", 400);
  EXPECT_EQ(refusal([&] { svc.drain_domain(ids[0], false, 0, nullptr); }), "ftp.DrainTimeout");
  const auto during = states(svc);
  EXPECT_EQ(std::count(during.begin(), during.end(), "draining"), 1) << svc.status()["domains"].dump();
  pause_ms->store(0);
  EXPECT_EQ(a.get().finish_reason, ftp::engine::FinishReason::length);
  EXPECT_EQ(b.get().finish_reason, ftp::engine::FinishReason::length);
  // The next drain (or shift) retires it, now idle, and frees its device.
  auto others = svc.domains_on_devices({"vd2"});
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(refusal([&] { svc.drain_domain(others[0], false, 1000, nullptr); }), "ftp.LastDomain");
  EXPECT_EQ(states(svc), std::vector<std::string>{"serving"}) << svc.status()["domains"].dump();
}

// The control socket range-checks integers (the protocol's type check lets
// any integral number through) and checks a shift's ramp as ftp-shift
// does: named errors, nothing started, and the daemon goes on.
TEST_F(ShiftFixture, ControlParamsOutOfRangeAreInvalidParams) {
  Service svc(*model, config());
  svc.start();
  ftp::ipc::ServerOptions so;
  so.socket_path = (std::filesystem::temp_directory_path() / ("ftp-test-control-" + std::to_string(::getpid()))).string();
  ControlSocket cp(svc, so, ControlSocketOptions{"", "/dev", false});
  cp.start();
  ftp::ipc::Client cl(cp.socket_path());
  auto err = [&](const std::string& method, const ftp::json::Json& params) {
    try {
      cl.stream(method, params, [](const ftp::json::Json&) { return true; }, std::chrono::seconds(30));
    } catch (const ftp::ipc::RpcError& e) {
      return e.name() + " " + e.data().value("param", std::string()) + ": " + e.message();
    }
    return std::string("<none>");
  };
  using ftp::json::Json;
  EXPECT_EQ(err("watch", Json{{"interval_ms", 4294967396.0}, {"count", 3}}),
            "ftp.InvalidParams interval_ms: interval_ms: must be an integer from 50 to 86400000, got 4294967396.0");
  EXPECT_EQ(err("watch", Json{{"interval_ms", 10}}),
            "ftp.InvalidParams interval_ms: interval_ms: must be an integer from 50 to 86400000, got 10");
  EXPECT_EQ(err("watch", Json{{"count", -1}}), "ftp.InvalidParams count: count: must be an integer from 0 to 2147483647, got -1");
  EXPECT_EQ(err("drain", Json{{"domain", "d0"}, {"timeout_ms", -5}, {"force", true}}),
            "ftp.InvalidParams timeout_ms: timeout_ms: must be an integer from 0 to 2000000000, got -5");
  EXPECT_EQ(err("shift", Json{{"to", "standard"}, {"step_interval_ms", 1e12}}),
            "ftp.InvalidParams step_interval_ms: step_interval_ms: must be an integer from 0 to 86400000, got 1000000000000.0");
  EXPECT_EQ(err("shift", Json{{"to", "standard"}, {"ramp", Json::array({0.9, 0.2, 1.0})}}),
            "ftp.InvalidParams ramp: ramp: shares must increase, got 0.9,0.2,1");
  EXPECT_EQ(err("shift", Json{{"to", "standard"}, {"ramp", Json::array({0.5})}}),
            "ftp.InvalidParams ramp: ramp: the last share must be 1.0 (100 %), got 0.5");
  // reload reads a regular file only: a FIFO or /dev/zero would block the
  // socket's thread or fill the daemon.
  // ftp-drain --devices: each bound wholly a number, a bounded range.
  EXPECT_THROW(ftp::serve::parse_device_list("vd0-1x"), ftp::InputError);
  EXPECT_THROW(ftp::serve::parse_device_list("vd0-2000000000"), ftp::InputError);
  EXPECT_EQ(ftp::serve::parse_device_list("vd4-6,gpu1"), (std::vector<std::string>{"vd4", "vd5", "vd6", "gpu1"}));
  EXPECT_EQ(err("reload", Json{{"path", "/dev/zero"}}), "ftp.InvalidGearTable path: /dev/zero: not a regular file");
  EXPECT_EQ(err("drain", Json{{"devices", Json::array({1})}}),
            "ftp.InvalidParams devices: devices[0]: expected a device id string, got number");
  EXPECT_TRUE(svc.records().empty()) << svc.records().dump();
  EXPECT_EQ(err("watch", Json{{"count", 1}}), "<none>");
  EXPECT_EQ(err("shift", Json{{"to", "standard"}, {"ramp", Json::array({0.5, 1.0})}, {"step_interval_ms", 0}}), "<none>");
  cp.stop();
}

namespace {

/// The devices of a replica, stage by stage.
std::vector<std::string> devices_of(const ftp::doc::Replica& rep) {
  std::vector<std::string> out;
  for (const auto& st : rep.stages) out.insert(out.end(), st.devices.begin(), st.devices.end());
  return out;
}

/// A service whose domains on exactly one of `slow` (device lists) run
/// PacedEngines paused by `slow_ms`, and every other domain the real engine
/// at its own speed: a gear that is really slower, not a failed check.
ServiceConfig slow_on(ServiceConfig c, const ftp::engine::WeightStore& store, std::set<std::vector<std::string>> slow,
                      std::shared_ptr<std::atomic<int>> slow_ms) {
  auto none = std::make_shared<std::atomic<int>>(0);
  c.engine_factory = [&store, slow, slow_ms, none](const ftp::doc::Replica& rep, const ftp::engine::DomainConfig& dc) {
    return std::make_unique<PacedEngine>(ftp::engine::Domain::real_engine(store)(dc), slow.count(devices_of(rep)) ? slow_ms : none);
  };
  return c;
}

/// Holds the steps of the engines it gates while closed: a request on a
/// gated domain is certain to be in flight until the test opens the gate,
/// whatever the machine's speed.
class Gate {
 public:
  void close() {
    std::lock_guard lk(mu_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
};

/// Opens the gate when the test leaves (also on a failed assertion), before
/// the service it is declared after stops its domains.
struct OpenOnExit {
  std::shared_ptr<Gate> gate;
  ~OpenOnExit() { gate->open(); }
};

/// The real engine, each step waiting at the gate first.
class GatedEngine final : public ftp::engine::Engine {
 public:
  GatedEngine(std::unique_ptr<ftp::engine::Engine> inner, std::shared_ptr<Gate> gate)
      : inner_(std::move(inner)), gate_(std::move(gate)) {}
  const ftp::model::HParams& hparams() const override { return inner_->hparams(); }
  int block_tokens() const override { return inner_->block_tokens(); }
  std::uint64_t kv_bytes() const override { return inner_->kv_bytes(); }
  std::vector<std::vector<float>> forward(const std::vector<ftp::engine::SeqChunk>& c, int mb) override {
    gate_->pass();
    return inner_->forward(c, mb);
  }
  void recycle(std::vector<std::vector<float>>&& logits) override { inner_->recycle(std::move(logits)); }
  std::vector<int> forward_choose(const std::vector<ftp::engine::SeqChunk>& c, int mb,
                                  const std::vector<ftp::engine::TokenChoice>& choices) override {
    gate_->pass();
    return inner_->forward_choose(c, mb, choices);
  }
  const std::vector<double>& stage_busy_s() const override { return inner_->stage_busy_s(); }
  void set_background() override { inner_->set_background(); }
  std::string failure() const override { return inner_->failure(); }

 private:
  std::unique_ptr<ftp::engine::Engine> inner_;
  std::shared_ptr<Gate> gate_;
};

/// A service whose domains on exactly `devices` step through `gate`; the others run freely.
ServiceConfig gated_on(ServiceConfig c, const ftp::engine::WeightStore& store, std::vector<std::string> devices,
                       std::shared_ptr<Gate> gate) {
  c.engine_factory = [&store, devices, gate](const ftp::doc::Replica& rep,
                                             const ftp::engine::DomainConfig& dc) -> std::unique_ptr<ftp::engine::Engine> {
    auto real = ftp::engine::Domain::real_engine(store)(dc);
    if (devices_of(rep) != devices) return real;
    return std::make_unique<GatedEngine>(std::move(real), gate);
  };
  return c;
}

/// Sends the 40-token "Zoo" request and closes the gate at its first token
/// (on the domain's thread, before its next step): it stays in flight until
/// the gate opens. Returns once the gate is closed.
std::future<Result> held(Service& svc, const std::string& id, const std::shared_ptr<Gate>& gate) {
  auto first = std::make_shared<std::promise<void>>();
  auto fut = send(svc, id, "Zoo", 40, [gate, first] {
    gate->close();
    first->set_value();
  });
  first->get_future().wait();
  return fut;
}

/// The state of domain `id` in the status ("<gone>" once retired and removed).
std::string state_of(const Service& svc, const std::string& id) {
  const auto st = svc.status();
  for (const auto& d : st["domains"])
    if (d["id"] == id) return d["state"].get<std::string>();
  return "<gone>";
}

/// A bound on how long a control call may take here: far longer than any
/// shift or drain of these tests, so that only one that waits for a held
/// request reaches it (a hang guard, not a timing).
constexpr auto kNoWait = std::chrono::seconds(30);

}  // namespace

// The new gear is really slower (its two TP-1 domains pause 40 ms before
// each step: a 40-token request takes over 1.6 s, against tens of ms on the
// old one): the ramp's check sees their P99 E2E above 1.5 x the baseline
// and rolls back, with no fault injected, and no request fails or changes.
// (TP-1 domains: four TP ranks on two busy cores are slow enough to give
// no sample at all within the step.)
TEST_F(ShiftFixture, ASlowerNewGearRollsBackOnItsP99) {
  ftp::engine::WeightStore store(*model);
  auto slow_ms = std::make_shared<std::atomic<int>>(40);
  Service svc(*model, slow_on(config(), store, {{"vd2"}, {"vd3"}}, slow_ms));  // replicated
  svc.start();
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, failed{0}, mismatched{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c)
    clients.emplace_back([&, c] {
      for (int i = 0; !stop.load(); ++i) {
        const std::string& p = kPrompts[static_cast<std::size_t>((c + i) % kPrompts.size())];
        const Result r = complete(svc, "c" + std::to_string(c) + "-" + std::to_string(i), p, 40);
        if (r.finish_reason == ftp::engine::FinishReason::error) ++failed;
        if (r.text != reference[p]) ++mismatched;
        ++completed;
      }
    });
  // A baseline: completions on the economy domain before the shift.
  while (completed.load() < 64) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Service::ShiftOptions o;
  o.to = "replicated";
  o.ramp = {0.5, 1.0};
  // Long enough for the 20 samples the check needs from the slow domains
  // (16 clients, under 2 s per request there, every second request).
  o.step_interval_ms = 5000;
  std::vector<std::string> phases;
  const auto rec = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) { phases.emplace_back(ftp::doc::to_string(e.phase)); });
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(rec.outcome, ftp::doc::ShiftOutcome::rolled_back) << rec.message;
  EXPECT_NE(rec.message.find("P99 E2E"), std::string::npos) << rec.message;
  EXPECT_NE(rec.message.find("x baseline"), std::string::npos) << rec.message;
  EXPECT_NE(std::find(phases.begin(), phases.end(), "rollback"), phases.end()) << ::testing::PrintToString(phases);
  EXPECT_EQ(svc.current_gear(), "economy");
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(mismatched.load(), 0);
  EXPECT_EQ(svc.status()["requests_failed"], 0);
  EXPECT_EQ(states(svc), std::vector<std::string>{"serving"}) << svc.status()["domains"].dump();
}

// A request still running on a draining domain keeps it draining through
// the next shift: the domain retires only once the request has ended, with
// its full text.
TEST_F(ShiftFixture, ADomainHoldingARequestStaysDrainingThroughTheNextShift) {
  ftp::engine::WeightStore store(*model);
  auto gate = std::make_shared<Gate>();
  ServiceConfig c = gated_on(config(), store, {"vd0"}, gate);  // economy
  c.drain_timeout_ms = 50;
  c.step_interval_ms = 0;
  Service svc(*model, c);
  OpenOnExit opener{gate};
  svc.start();
  const std::string old_id = svc.status()["domains"][0]["id"];
  auto busy = held(svc, "long", gate);
  Service::ShiftOptions o;
  o.to = "replicated";
  const auto first = svc.shift(o, nullptr);
  EXPECT_EQ(first.outcome, ftp::doc::ShiftOutcome::committed) << first.message;
  EXPECT_EQ(state_of(svc, old_id), "draining");
  // The second shift, while the request is held on the old domain.
  auto second = std::async(std::launch::async, [&] {
    o.to = "standard";
    return svc.shift(o, nullptr);
  });
  if (second.wait_for(kNoWait) != std::future_status::ready) {
    gate->open();  // before the future's end waits for the shift
    FAIL() << "the second shift waited for the draining domain's request: it retired a domain that holds one";
  }
  EXPECT_EQ(second.get().outcome, ftp::doc::ShiftOutcome::committed);
  EXPECT_EQ(state_of(svc, old_id), "draining") << svc.status()["domains"].dump();
  EXPECT_EQ(busy.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  gate->open();
  const Result r = busy.get();
  EXPECT_EQ(r.finish_reason, ftp::engine::FinishReason::length) << r.error;
  EXPECT_EQ(r.text, reference["Zoo"]);
  EXPECT_EQ(r.domains, std::set<std::string>{old_id});
  // Idle now, it retires at the next shift; the replicated domains retired at the second.
  o.to = "economy";
  EXPECT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  EXPECT_EQ(state_of(svc, old_id), "<gone>");
  EXPECT_EQ(states(svc), std::vector<std::string>{"serving"}) << svc.status()["domains"].dump();
}

// ftp-drain: a drain waits for the domain's request, which ends with its
// full text, and only then retires the domain; a drain that times out
// leaves it draining, and another drain while its request runs does not
// retire it.
TEST_F(ShiftFixture, ADrainRetiresItsDomainOnlyAfterItsRequestEnds) {
  ftp::engine::WeightStore store(*model);
  auto gate = std::make_shared<Gate>();
  ServiceConfig c = gated_on(config(), store, {"vd3"}, gate);
  c.start_gear = "replicated";  // dp 2: vd2, vd3
  Service svc(*model, c);
  OpenOnExit opener{gate};
  svc.start();
  const std::string gated = svc.domains_on_devices({"vd3"}).at(0), other = svc.domains_on_devices({"vd2"}).at(0);
  // The router alternates between the two equal replicas: one request, and
  // the next goes to the other.
  auto on_gated_next = [&] {
    if (*complete(svc, "probe", "Zoo", 1).domains.begin() != gated) return;
    complete(svc, "probe2", "Zoo", 1);
  };

  // A drain that waits: the domain stays draining while its request runs.
  on_gated_next();
  auto a = held(svc, "a", gate);
  auto drain = std::async(std::launch::async, [&] { return svc.drain_domain(gated, false, 600000, nullptr); });
  while (state_of(svc, gated) == "serving") std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(state_of(svc, gated), "draining");
  EXPECT_EQ(drain.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout) << "the drain did not wait";
  gate->open();
  const Result ra = a.get();
  EXPECT_EQ(ra.finish_reason, ftp::engine::FinishReason::length) << ra.error;
  EXPECT_EQ(ra.text, reference["Zoo"]);
  EXPECT_EQ(ra.domains, std::set<std::string>{gated});
  EXPECT_EQ(drain.get(), 1);
  EXPECT_EQ(state_of(svc, gated), "<gone>");

  // Back to two replicas, the gated one again on vd3.
  Service::ShiftOptions o;
  o.to = "economy";
  ASSERT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  o.to = "replicated";
  ASSERT_EQ(svc.shift(o, nullptr).outcome, ftp::doc::ShiftOutcome::committed);
  const std::string gated2 = svc.domains_on_devices({"vd3"}).at(0), other2 = svc.domains_on_devices({"vd2"}).at(0);
  auto retry = [&] {
    if (*complete(svc, "probe3", "Zoo", 1).domains.begin() != gated2) return;
    complete(svc, "probe4", "Zoo", 1);
  };
  retry();
  auto b = held(svc, "b", gate);
  // A drain that times out: the domain stays draining.
  EXPECT_EQ(refusal([&] { svc.drain_domain(gated2, false, 0, nullptr); }), "ftp.DrainTimeout");
  EXPECT_EQ(state_of(svc, gated2), "draining");
  // Another drain while its request runs (refused: the other is the last
  // serving domain) leaves it draining.
  auto again = std::async(std::launch::async, [&] { return refusal([&] { svc.drain_domain(other2, false, 1000, nullptr); }); });
  if (again.wait_for(kNoWait) != std::future_status::ready) {
    gate->open();  // before the future's end waits for the drain
    FAIL() << "the second drain waited for the draining domain's request: it retired a domain that holds one";
  }
  EXPECT_EQ(again.get(), "ftp.LastDomain");
  EXPECT_EQ(state_of(svc, gated2), "draining") << svc.status()["domains"].dump();
  gate->open();
  const Result rb = b.get();
  EXPECT_EQ(rb.finish_reason, ftp::engine::FinishReason::length) << rb.error;
  EXPECT_EQ(rb.text, reference["Zoo"]);
  // Idle now: the next drain retires it.
  EXPECT_EQ(refusal([&] { svc.drain_domain(other2, false, 1000, nullptr); }), "ftp.LastDomain");
  EXPECT_EQ(state_of(svc, gated2), "<gone>");
  (void)other;
}

// SIGTERM (drain_and_stop): new requests are refused at once, the domain
// drains while its request runs, the request ends with its full text, and
// only then do the domains stop and retire.
TEST_F(ShiftFixture, StoppingWaitsForTheRequestInFlightThenRetires) {
  ftp::engine::WeightStore store(*model);
  auto gate = std::make_shared<Gate>();
  Service svc(*model, gated_on(config(), store, {"vd0"}, gate));
  OpenOnExit opener{gate};
  svc.start();
  const std::string id = svc.status()["domains"][0]["id"];
  auto busy = held(svc, "long", gate);
  auto stopping = std::async(std::launch::async, [&] { svc.drain_and_stop(); });
  while (svc.accepting()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_THROW(complete(svc, "late", "Zoo", 4), RequestError);
  while (state_of(svc, id) == "serving") std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(state_of(svc, id), "draining");
  EXPECT_EQ(stopping.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout) << "stopped without waiting";
  gate->open();
  const Result r = busy.get();
  EXPECT_EQ(r.finish_reason, ftp::engine::FinishReason::length) << r.error;
  EXPECT_EQ(r.text, reference["Zoo"]);
  stopping.get();
  EXPECT_EQ(state_of(svc, id), "<gone>");
}

// The communicator pool (engine::Backend::prepare_communicators, in-process
// on CPU): the service makes every stage's communicator at start, so no
// shift's warm phase makes one; a reload's new device set is made at the
// reload, not at the shift that first uses it.
TEST_F(ShiftFixture, WarmPhasesCreateNoCommunicatorOncePooled) {
  Service svc(*model, config());
  svc.start();
  auto warm_of = [&](const std::string& to) {
    ftp::doc::ShiftEvent warm;
    Service::ShiftOptions o;
    o.to = to;
    const auto rec = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) {
      if (e.phase == ftp::doc::ShiftPhase::warm) warm = e;
    });
    EXPECT_EQ(rec.outcome, ftp::doc::ShiftOutcome::committed) << rec.message;
    EXPECT_FALSE(rec.communicators_created);  // only the warm record carries it
    return warm;
  };
  for (const std::string to : {"standard", "performance", "pipelined", "replicated", "economy", "performance"}) {
    const auto warm = warm_of(to);
    ASSERT_TRUE(warm.communicators_created) << warm.message;
    EXPECT_EQ(*warm.communicators_created, 0u) << to << ": " << warm.message;
    EXPECT_EQ(*warm.communicator_ms, 0.0) << to;
    EXPECT_NE(warm.message.find("; communicators created: 0 in 0 ms"), std::string::npos) << warm.message;
  }
  // A gear on a device set no gear had: made at the reload.
  ftp::doc::GearTable t = svc.gear_table();
  ftp::doc::Gear wide = *t.find("standard");
  wide.name = "wide";
  wide.replicas[0].stages[0].devices = {"vd3", "vd2"};
  t.gears.push_back(wide);
  svc.reload(t);
  const auto warm = warm_of("wide");
  ASSERT_TRUE(warm.communicators_created);
  EXPECT_EQ(*warm.communicators_created, 0u) << warm.message;
  EXPECT_EQ(complete(svc, "w", "Zoo", 40).text, reference["Zoo"]);
}

namespace {

/// The value of a Prometheus sample line that starts with `name` ("-1" when absent).
double metric(const std::string& text, const std::string& name) {
  std::size_t at = 0;
  while ((at = text.find(name, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      const std::size_t eol = text.find('\n', at);
      const std::string line = text.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    at += name.size();
  }
  return -1;
}

}  // namespace

// Ready before the first request (issue 17): every domain, at start and in
// a shift's warm phase, runs dummy requests at the batch sizes its backend
// wants warmed (on CPU the powers of two up to max_running) before it
// serves; the warm record lists them. The dummies leave every KV page free,
// are counted nowhere, and the first real request gives the golden text.
TEST_F(ShiftFixture, WarmPhaseListsTheBatchSizesItsDummyRequestsRan) {
  ServiceConfig c = config();
  c.max_running = 8;
  Service svc(*model, c);
  svc.start();
  EXPECT_EQ(svc.start_warm_up().batch_sizes, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(svc.start_warm_up().graphs_captured, 0u) << "no graphs on CPU";
  for (const auto& d : svc.status()["domains"]) EXPECT_EQ(d["kv_usage"].get<double>(), 0.0) << d.dump();
  ftp::doc::ShiftEvent warm;
  std::vector<ftp::doc::ShiftEvent> events;
  Service::ShiftOptions o;
  o.to = "standard";
  const auto rec = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) {
    events.push_back(e);
    if (e.phase == ftp::doc::ShiftPhase::warm) warm = e;
  });
  ASSERT_EQ(rec.outcome, ftp::doc::ShiftOutcome::committed) << rec.message;
  ASSERT_TRUE(warm.warm_batch_sizes) << warm.message;
  EXPECT_EQ(*warm.warm_batch_sizes, (std::vector<int>{1, 2, 4, 8})) << warm.message;
  ASSERT_TRUE(warm.graphs_captured);
  EXPECT_EQ(*warm.graphs_captured, 0u);
  ASSERT_TRUE(warm.warmup_ms);
  EXPECT_GE(*warm.warmup_ms, 0.0);
  EXPECT_NE(warm.message.find("; warm-up at batch sizes 1,2,4,8 in "), std::string::npos) << warm.message;
  for (const auto& e : events)
    if (e.phase != ftp::doc::ShiftPhase::warm) EXPECT_FALSE(e.warm_batch_sizes || e.graphs_captured || e.warmup_ms);
  // The journal's form keeps them.
  const ftp::doc::ShiftEvent back = ftp::doc::shift_event_from_json(ftp::doc::to_json(warm));
  EXPECT_EQ(back.warm_batch_sizes, warm.warm_batch_sizes);
  EXPECT_EQ(back.graphs_captured, warm.graphs_captured);
  for (const auto& d : svc.status()["domains"])
    EXPECT_EQ(d["kv_usage"].get<double>(), 0.0) << "the warm-up's pages are free again: " << d.dump();
  EXPECT_EQ(complete(svc, "first", "Zoo", 40).text, reference["Zoo"]);
  const auto st = svc.status();
  EXPECT_EQ(st["requests_total"].get<std::uint64_t>(), 1u) << "the dummies are no requests";
  const std::string prom = svc.prometheus();
  const double prompt_tokens = metric(prom, "vllm:prompt_tokens_total");
  const double generated = metric(prom, "vllm:generation_tokens_total");
  const int zoo_prompt = static_cast<int>(ftp::model::tokenizer_of(*model)->encode_prompt("Zoo").size());
  EXPECT_EQ(prompt_tokens, zoo_prompt) << prom;
  EXPECT_GT(generated, 0) << prom;
  EXPECT_LE(generated, 40) << "one request's tokens, none of the dummies': " << prom;
  EXPECT_EQ(metric(prom, "vllm:num_preemptions_total"), 0) << prom;
}

// The communicator pool spans the gear table's devices only (issue 17: the
// NCCL root communicator and its contexts on the table's GPUs; on CPU the
// in-process pool keeps communicators of the table's virtual devices), and
// a reload with a table on other devices moves it.
TEST_F(ShiftFixture, CommunicatorPoolSpansTheTablesDevicesOnlyAndFollowsAReload) {
  ServiceConfig c = config();
  c.virtual_devices = 6;
  Service svc(*model, c);
  svc.start();
  ftp::engine::Backend& cpu = ftp::engine::cpu_backend();
  // The virtual devices' own names: vdN of the table is cpu:N.
  EXPECT_EQ(cpu.communicator_devices(), (std::vector<std::string>{"cpu:0", "cpu:1", "cpu:2", "cpu:3"}));
  ftp::doc::GearTable t = table;
  t.gears = {*table.find("economy"), *table.find("standard")};
  ftp::doc::Gear far = *table.find("standard");
  far.name = "far";
  far.replicas[0].stages[0].devices = {"vd4", "vd5"};
  t.gears.push_back(far);
  svc.reload(t);
  EXPECT_EQ(cpu.communicator_devices(), (std::vector<std::string>{"cpu:0", "cpu:1", "cpu:4", "cpu:5"}));
  ftp::doc::ShiftEvent warm;
  Service::ShiftOptions o;
  o.to = "far";
  const auto rec = svc.shift(o, [&](const ftp::doc::ShiftEvent& e) {
    if (e.phase == ftp::doc::ShiftPhase::warm) warm = e;
  });
  ASSERT_EQ(rec.outcome, ftp::doc::ShiftOutcome::committed) << rec.message;
  ASSERT_TRUE(warm.communicators_created);
  EXPECT_EQ(*warm.communicators_created, 0u) << "made at the reload: " << warm.message;
  EXPECT_EQ(complete(svc, "far", "Zoo", 40).text, reference["Zoo"]);
}
