// SPDX-License-Identifier: Apache-2.0
// Admission control (issue 20, item 2): the waiting queue's bounds by
// themselves, then a burst against a live daemon: past the bound, 429 with
// Retry-After (503 while draining), each refusal counted by reason, and
// every admitted request completes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

#include "api/openai/server.hpp"
#include "core/json.hpp"
#include "model/model.hpp"
#include "serve/admission.hpp"
#include "serve/http.hpp"
#include "serve/service.hpp"
#include "test_data.hpp"

using ftp::json::Json;
using namespace ftp::serve;
using HttpServer = ftp::api::openai::Server;

namespace {

RefusalReason refusal_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Refused& e) {
    return e.reason();
  }
  ADD_FAILURE() << "not refused";
  return RefusalReason::no_domain;
}

TEST(Admission, BoundsInRequestsAndTokensForTheServiceAndEachDomain) {
  AdmissionLimits l;
  l.service_requests = 3;
  l.service_tokens = 100;
  l.domain_requests = 2;
  l.domain_tokens = 60;
  Admission a(l);
  auto t1 = a.admit("d0", 30, 2);
  auto t2 = a.admit("d0", 30, 2);
  // d0 holds 2 requests: its bound.
  EXPECT_EQ(refusal_of([&] { a.admit("d0", 1, 2); }), RefusalReason::domain_queue_requests);
  auto t3 = a.admit("d1", 30, 2);
  EXPECT_EQ(a.waiting_requests(), 3);
  EXPECT_EQ(a.waiting_tokens(), 90);
  EXPECT_EQ(refusal_of([&] { a.admit("d1", 1, 2); }), RefusalReason::service_queue_requests);
  t1->release();
  t1->release();  // once only
  EXPECT_EQ(a.waiting_requests(), 2);
  // 60 + 50 tokens pass the service's 100.
  EXPECT_EQ(refusal_of([&] { a.admit("d1", 50, 2); }), RefusalReason::service_queue_tokens);
  // d1 has 30; 31 more pass its 60.
  EXPECT_EQ(refusal_of([&] { a.admit("d1", 31, 2); }), RefusalReason::domain_queue_tokens);
  auto t4 = a.admit("d1", 30, 2);
  t2.reset();
  t3.reset();
  t4.reset();  // the destructor gives the place back
  EXPECT_EQ(a.waiting_requests(), 0);
  EXPECT_EQ(a.waiting_tokens(), 0);
  // A request larger than a token bound is served alone, not refused forever.
  auto big = a.admit("d0", 500, 2);
  EXPECT_EQ(refusal_of([&] { a.admit("d0", 1, 2); }), RefusalReason::service_queue_tokens);
  try {
    a.admit("d2", 1, 7);
  } catch (const Refused& e) {
    EXPECT_EQ(e.kind(), Refusal::queue_full);  // the API layer answers 429
    EXPECT_EQ(e.retry_after_s(), 7);
    EXPECT_NE(std::string(e.what()).find("retry after 7 s"), std::string::npos) << e.what();
  }
}

TEST(Admission, ACarriedRequestIsNeverRefusedButCountsAgainstTheNextOnes) {
  // A request moved off a draining domain (or run again after its domain
  // failed) was accepted once: its new domain counts it, past the bound if
  // need be, and the requests that arrive after it are refused by it.
  AdmissionLimits l;
  l.service_requests = 10;
  l.domain_requests = 1;
  Admission a(l);
  auto t1 = a.admit("d1", 30, 2);
  auto moved = a.carry("d1", 40);  // past d1's bound of one: carried all the same
  EXPECT_EQ(a.waiting_requests(), 2);
  EXPECT_EQ(a.waiting_tokens(), 70);
  t1->release();
  // d1 still holds the carried one: a new request finds it full.
  EXPECT_EQ(refusal_of([&] { a.admit("d1", 1, 2); }), RefusalReason::domain_queue_requests);
  moved->release();
  moved->release();  // once only
  EXPECT_EQ(a.waiting_requests(), 0);
  EXPECT_EQ(a.waiting_tokens(), 0);
  auto t2 = a.admit("d1", 1, 2);
  EXPECT_EQ(a.waiting_requests(), 1);
}

std::string model_file(const char* f) { return ftp::test::data_dir() + "/models/stories260K/" + f; }

ServiceConfig one_gear_config(const ftp::model::HParams& hp) {
  ServiceConfig c;
  c.model_name = "stories260K";
  c.gears.model = {"stories260K", hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_embd, 0};
  c.gears.topology = "test";
  ftp::doc::Gear g;
  g.name = "standard";
  g.replicas = {ftp::doc::Replica{{ftp::doc::Stage{0, hp.n_layer, {"vd0"}}}}};
  c.gears.gears.push_back(g);
  // One sequence at a time, three waiting at most: a burst must overflow.
  c.max_running = 1;
  c.admission.service_requests = 3;
  c.admission.domain_requests = 3;
  return c;
}

double metric(const std::string& body, const std::string& line_start) {
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(line_start, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  ADD_FAILURE() << line_start << " not in /metrics";
  return -1;
}

TEST(AdmissionHttp, ABurstPastTheBoundGets429WithRetryAfterAndEveryAdmittedRequestCompletes) {
  if (!std::filesystem::exists(model_file("stories260K.gguf")))
    GTEST_SKIP() << "stories260K.gguf not found under " << ftp::test::data_dir() << " (set FTP_TEST_DATA)";
  auto model = ftp::model::load_model(model_file("stories260K.gguf"));
  Service service(model, one_gear_config(model.hparams));
  service.start();
  HttpOptions o;
  o.port = 0;
  HttpServer server(service, o);
  server.start();
  auto post = [&](const Json& body) {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(std::chrono::seconds(120));
    return c.Post("/v1/completions", body.dump(), "application/json");
  };
  const std::string refused_line = "flextp:requests_refused_total{model_name=\"stories260K\",reason=\"service_queue_requests\"} ";
  const std::string domain_line = "flextp:requests_refused_total{model_name=\"stories260K\",reason=\"domain_queue_requests\"} ";
  auto refused_now = [&] {
    httplib::Client c("127.0.0.1", server.port());
    auto r = c.Get("/metrics");
    return metric(r->body, refused_line) + metric(r->body, domain_line);
  };
  const double refused_before = refused_now();

  // 8 prompts in one request: with one running, the 5th finds 3 waiting at
  // least, so the whole request is refused (all or nothing).
  auto r = post(Json{{"prompt", Json::array({"a", "b", "c", "d", "e", "f", "g", "h"})}, {"max_tokens", 50}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  ASSERT_TRUE(r->has_header("Retry-After")) << r->body;
  EXPECT_GE(std::stoi(r->get_header_value("Retry-After")), 1);
  EXPECT_EQ(Json::parse(r->body)["error"]["type"], "rate_limit_error") << r->body;
  int refused = 1;

  // A burst of 12 concurrent requests: each is answered 200 with all its
  // tokens, or 429 with Retry-After; none is dropped.
  std::vector<std::future<httplib::Result>> burst;
  for (int i = 0; i < 12; ++i)
    burst.push_back(std::async(std::launch::async, [&] { return post(Json{{"prompt", "Once"}, {"max_tokens", 100}}); }));
  int ok = 0;
  for (auto& f : burst) {
    auto res = f.get();
    ASSERT_TRUE(res) << "an answer for every request";
    if (res->status == 429) {
      ++refused;
      EXPECT_TRUE(res->has_header("Retry-After"));
      continue;
    }
    ASSERT_EQ(res->status, 200) << res->body;
    ++ok;
    const Json j = Json::parse(res->body);
    const std::string reason = j["choices"][0]["finish_reason"];
    EXPECT_TRUE(reason == "length" || reason == "stop") << res->body;
    if (reason == "length") EXPECT_EQ(j["usage"]["completion_tokens"], 100) << res->body;
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(refused_now() - refused_before, refused) << "every 429 is counted";
  EXPECT_EQ(service.status()["requests_failed"], 0);

  // Draining: 503 with Retry-After, counted as draining.
  service.drain_and_stop();
  r = post(Json{{"prompt", "Once"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_TRUE(r->has_header("Retry-After"));
  httplib::Client c("127.0.0.1", server.port());
  EXPECT_EQ(metric(c.Get("/metrics")->body,
                   "flextp:requests_refused_total{model_name=\"stories260K\",reason=\"draining\"} "),
            1);
}

}  // namespace
