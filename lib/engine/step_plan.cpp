// SPDX-License-Identifier: Apache-2.0
#include "engine/step_plan.hpp"

#include <cstring>
#include <string>

#include "core/error.hpp"

namespace ftp::engine {
namespace {

class Writer {
 public:
  void i32(std::int64_t v) {
    const auto x = static_cast<std::int32_t>(v);
    put(&x, sizeof x);
  }
  void f64(double v) { put(&v, sizeof v); }
  void ints(const std::vector<int>& v) {
    i32(static_cast<std::int64_t>(v.size()));
    for (int x : v) i32(x);
  }
  std::vector<char> out;

 private:
  void put(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    out.insert(out.end(), c, c + n);
  }
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : b_(b) {}
  std::int32_t i32(const char* field) {
    std::int32_t x;
    get(&x, sizeof x, field);
    return x;
  }
  double f64(const char* field) {
    double x;
    get(&x, sizeof x, field);
    return x;
  }
  int count(const char* field, std::int64_t most) {
    const std::int32_t n = i32(field);
    if (n < 0 || n > most) throw InputError(std::string("step plan: ") + field + " " + std::to_string(n) + " out of range");
    return n;
  }
  std::vector<int> ints(const char* field) {
    const int n = count(field, static_cast<std::int64_t>((b_.size() - at_) / 4));
    std::vector<int> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = i32(field);
    return v;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  void get(void* p, std::size_t n, const char* field) {
    if (at_ + n > b_.size()) throw InputError(std::string("step plan: truncated at ") + field);
    std::memcpy(p, b_.data() + at_, n);
    at_ += n;
  }
  const std::vector<char>& b_;
  std::size_t at_ = 0;
};

}  // namespace

StepPlan make_step_plan(StepPlan::Kind kind, const std::vector<SeqChunk>& chunks, int micro_batches,
                        const std::vector<TokenChoice>& choices) {
  StepPlan p;
  p.kind = kind;
  p.micro_batches = micro_batches;
  p.choices = choices;
  p.tables.reserve(chunks.size());
  for (const SeqChunk& c : chunks) p.tables.push_back(c.blocks ? *c.blocks : std::vector<int>{});
  p.chunks = chunks;
  for (std::size_t i = 0; i < chunks.size(); ++i) p.chunks[i].blocks = &p.tables[i];
  return p;
}

std::vector<char> encode_step_plan(const StepPlan& p) {
  Writer w;
  w.i32(static_cast<std::int32_t>(p.kind));
  w.i32(p.micro_batches);
  w.i32(static_cast<std::int64_t>(p.chunks.size()));
  for (std::size_t i = 0; i < p.chunks.size(); ++i) {
    const SeqChunk& c = p.chunks[i];
    w.i32(c.start_pos);
    w.i32(c.want_logits ? 1 : 0);
    w.ints(c.tokens);
    w.ints(c.blocks ? *c.blocks : std::vector<int>{});
  }
  w.i32(static_cast<std::int64_t>(p.choices.size()));
  for (const TokenChoice& c : p.choices) {
    w.f64(c.temperature);
    w.f64(c.top_p);
    w.f64(c.uniform);
  }
  return std::move(w.out);
}

StepPlan decode_step_plan(const std::vector<char>& bytes) {
  Reader r(bytes);
  StepPlan p;
  const std::int32_t kind = r.i32("kind");
  if (kind < 0 || kind > 2) throw InputError("step plan: kind " + std::to_string(kind) + " unknown");
  p.kind = static_cast<StepPlan::Kind>(kind);
  p.micro_batches = r.count("micro_batches", 1 << 16);
  const int n = r.count("chunks", static_cast<std::int64_t>(bytes.size()));
  p.chunks.resize(static_cast<std::size_t>(n));
  p.tables.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    SeqChunk& c = p.chunks[static_cast<std::size_t>(i)];
    c.start_pos = r.i32("start_pos");
    c.want_logits = r.i32("want_logits") != 0;
    c.tokens = r.ints("tokens");
    p.tables[static_cast<std::size_t>(i)] = r.ints("blocks");
    c.blocks = &p.tables[static_cast<std::size_t>(i)];
  }
  const int nc = r.count("choices", static_cast<std::int64_t>(bytes.size()));
  p.choices.resize(static_cast<std::size_t>(nc));
  for (auto& c : p.choices) {
    c.temperature = static_cast<float>(r.f64("temperature"));
    c.top_p = static_cast<float>(r.f64("top_p"));
    c.uniform = r.f64("uniform");
  }
  if (!r.done()) throw InputError("step plan: " + std::to_string(bytes.size()) + " bytes, more than the plan holds");
  return p;
}

void Placement::send_plan(const StepPlan& plan) const {
  const std::vector<char> body = encode_step_plan(plan);
  const std::uint64_t n = body.size();
  for (int p = 0; p < group->size(); ++p) {
    if (p == self) continue;
    group->send(p, &n, sizeof n, step_tag::plan_size);
    group->send(p, body.data(), body.size(), step_tag::plan);
  }
}

StepPlan Placement::recv_plan(std::chrono::milliseconds timeout) const {
  std::uint64_t n = 0;
  group->recv(0, &n, sizeof n, step_tag::plan_size, timeout);
  if (n > (1ull << 30)) throw InputError("step plan: " + std::to_string(n) + " bytes, more than 1 GiB");
  std::vector<char> body(n);
  group->recv(0, body.data(), body.size(), step_tag::plan);
  return decode_step_plan(body);
}

}  // namespace ftp::engine
