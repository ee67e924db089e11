// SPDX-License-Identifier: Apache-2.0
// Gloo (libgloo, TCP transport) for CPU ranks in different processes.
#include "comm/gloo.hpp"

#include <gloo/allgather.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.hpp"

namespace ftp::comm {
namespace {

/// Gloo's store interface over ours, with the group's prefix.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore& s, std::string prefix, std::chrono::milliseconds timeout)
      : s_(s), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { s_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return s_.get(prefix_ + key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) s_.get(prefix_ + k, timeout);
  }

 private:
  RendezvousStore& s_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

/// One TCP device (its event loop thread) per address, shared by the
/// process's groups.
std::shared_ptr<gloo::transport::Device> device_for(const std::string& hostname) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<gloo::transport::Device>> devices;
  std::lock_guard lk(mu);
  auto& d = devices[hostname];
  if (!d) {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    try {
      d = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw Error("gloo: cannot bind a TCP device on \"" + hostname + "\": " + e.what());
    }
  }
  return d;
}

}  // namespace

struct GlooGroup::Impl {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::vector<float> gathered;  // allgather's output, [size][count]
  std::chrono::milliseconds timeout{};
  std::atomic<bool> aborted{false};
  std::mutex pending_mu;        // the buffers being waited for, for abort()
  gloo::transport::UnboundBuffer* pending = nullptr;
  std::vector<gloo::transport::UnboundBuffer*> pending_recvs, pending_sends;  // gather_columns'
  std::vector<float> staging;  // gather_columns: a peer's rows before they are placed
  struct Posted {
    std::unique_ptr<std::vector<char>> data;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    int dst;
  };
  std::vector<Posted> posted;
};

GlooGroup::GlooGroup(RendezvousStore& store, const std::string& prefix, int rank, int size, const GlooOptions& options)
    : impl_(std::make_unique<Impl>()), rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw InputError("gloo group " + prefix + ": rank " + std::to_string(rank) + " of " + std::to_string(size));
  impl_->timeout = options.timeout;
  auto dev = device_for(options.hostname);
  impl_->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  impl_->ctx->setTimeout(options.timeout);
  StoreAdapter st(store, prefix + "/", options.timeout);
  try {
    impl_->ctx->connectFullMesh(st, dev);
  } catch (const std::exception& e) {
    throw Error("gloo group " + prefix + ": rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " could not connect: " + e.what());
  }
}

GlooGroup::~GlooGroup() = default;

bool GlooGroup::aborted() const noexcept { return impl_->aborted.load(); }

void GlooGroup::abort() noexcept {
  impl_->aborted.store(true);
  std::lock_guard lk(impl_->pending_mu);
  if (impl_->pending) impl_->pending->abortWaitRecv();
  for (auto* b : impl_->pending_recvs) b->abortWaitRecv();
  for (auto* b : impl_->pending_sends) b->abortWaitSend();
}

namespace {
void check_live(const std::atomic<bool>& aborted, const char* op) {
  if (aborted.load()) throw Error(std::string("gloo ") + op + ": communicator aborted");
}
}  // namespace

void GlooGroup::all_reduce_sum(float* data, std::size_t count) {
  check_live(impl_->aborted, "all_reduce_sum");
  if (size_ == 1 || count == 0) return;
  auto& g = impl_->gathered;
  if (g.size() < count * static_cast<std::size_t>(size_)) g.resize(count * static_cast<std::size_t>(size_));
  try {
    gloo::AllgatherOptions opts(impl_->ctx);
    opts.setInput(data, count);
    opts.setOutput(g.data(), count * static_cast<std::size_t>(size_));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    throw Error(std::string("gloo all_reduce_sum: ") + e.what());
  }
  // Rank order, as InprocCommunicator: acc = x0; acc += x1; ...
  std::memcpy(data, g.data(), count * sizeof(float));
  for (int j = 1; j < size_; ++j) {
    const float* src = g.data() + static_cast<std::size_t>(j) * count;
    for (std::size_t i = 0; i < count; ++i) data[i] += src[i];
  }
}

namespace {
// Slots of gather_columns' messages (collectives use slots with a prefix
// in their high bytes; the executor's step messages use other tags).
constexpr std::uint32_t kGatherHeaderTag = 0x67630001u;
constexpr std::uint32_t kGatherRowsTag = 0x67630002u;
}  // namespace

void GlooGroup::gather_columns(const float* slice, std::size_t rows, std::span<const std::size_t> widths, float* full) {
  check_live(impl_->aborted, "gather_columns");
  if (widths.size() != static_cast<std::size_t>(size_))
    throw Error("gloo gather_columns: " + std::to_string(widths.size()) + " widths for " + std::to_string(size_) +
                " ranks");
  std::size_t ld = 0, col0 = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) col0 = ld;
    ld += widths[static_cast<std::size_t>(r)];
  }
  auto place = [&](const float* src, std::size_t c0, std::size_t w) {
    if (w == 0 || src == full + c0) return;
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(full + r * ld + c0, src + r * w, w * sizeof(float));
  };
  Impl& im = *impl_;
  // Waits for `b` with abort() able to wake it; false: aborted.
  auto wait = [&](gloo::transport::UnboundBuffer* b, bool recv) {
    auto& list = recv ? im.pending_recvs : im.pending_sends;
    {
      std::lock_guard lk(im.pending_mu);
      list.push_back(b);
    }
    if (im.aborted.load()) recv ? b->abortWaitRecv() : b->abortWaitSend();
    bool done = false;
    std::exception_ptr err;
    try {
      done = recv ? b->waitRecv(im.timeout) : b->waitSend(im.timeout);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard lk(im.pending_mu);
      list.erase(std::find(list.begin(), list.end(), b));
    }
    if (err) std::rethrow_exception(err);
    return done;
  };
  const std::size_t w = widths[static_cast<std::size_t>(rank_)];
  if (size_ == 1) {
    place(slice, 0, w);
    return;
  }
  if (rank_ != 0) {
    try {
      std::uint64_t header[2] = {rows, w};
      auto hb = im.ctx->createUnboundBuffer(header, sizeof header);
      hb->send(0, kGatherHeaderTag);
      std::unique_ptr<gloo::transport::UnboundBuffer> db;
      if (rows * w > 0) {
        db = im.ctx->createUnboundBuffer(const_cast<float*>(slice), rows * w * sizeof(float));
        db->send(0, kGatherRowsTag);
      }
      bool ok = wait(hb.get(), false);
      if (ok && db) ok = wait(db.get(), false);
      if (!ok) throw Error("communicator aborted");
    } catch (const std::exception& e) {
      throw Error(std::string("gloo gather_columns: rank ") + std::to_string(rank_) + " sending to rank 0: " + e.what());
    }
    return;
  }
  place(slice, 0, w);
  // Every header is posted at once; each peer's rows as its header comes.
  std::vector<std::array<std::uint64_t, 2>> headers(static_cast<std::size_t>(size_));
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> hbs(static_cast<std::size_t>(size_));
  std::string mismatch;
  int peer = 1;
  try {
    for (int r = 1; r < size_; ++r) {
      hbs[static_cast<std::size_t>(r)] = im.ctx->createUnboundBuffer(headers[static_cast<std::size_t>(r)].data(),
                                                                     sizeof(std::uint64_t) * 2);
      hbs[static_cast<std::size_t>(r)]->recv(r, kGatherHeaderTag);
    }
    std::size_t c0 = w;
    for (peer = 1; peer < size_; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      if (!wait(hbs[p].get(), true)) throw Error("communicator aborted");
      const std::uint64_t got_rows = headers[p][0], got_w = headers[p][1];
      const bool match = got_rows == rows && got_w == widths[p];
      if (!match && mismatch.empty())
        mismatch = "rank " + std::to_string(peer) + " sends " + std::to_string(got_rows) + " rows of " +
                   std::to_string(got_w) + " columns, rank 0 expects " + std::to_string(rows) + " of " +
                   std::to_string(widths[p]);
      const std::size_t n = static_cast<std::size_t>(got_rows * got_w);
      if (n > 0) {
        // Straight into the full row where the slice is contiguous there.
        float* dst = match && rows == 1 ? full + c0 : nullptr;
        if (!dst) {
          if (im.staging.size() < n) im.staging.resize(n);
          dst = im.staging.data();
        }
        auto db = im.ctx->createUnboundBuffer(dst, n * sizeof(float));
        db->recv(peer, kGatherRowsTag);
        if (!wait(db.get(), true)) throw Error("communicator aborted");
        if (match) place(dst, c0, widths[p]);
      }
      c0 += widths[p];
    }
  } catch (const std::exception& e) {
    throw Error("gloo gather_columns: rank 0 receiving from rank " + std::to_string(peer) + ": " + e.what());
  }
  if (!mismatch.empty()) throw Error("gloo gather_columns: ranks disagree: " + mismatch);
}

void GlooGroup::broadcast(int root, void* data, std::size_t bytes) {
  check_live(impl_->aborted, "broadcast");
  if (size_ == 1 || bytes == 0) return;
  try {
    gloo::BroadcastOptions opts(impl_->ctx);
    opts.setRoot(root);
    opts.setOutput(static_cast<char*>(data), bytes);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    throw Error(std::string("gloo broadcast: ") + e.what());
  }
}

void GlooGroup::send(int dst, const void* data, std::size_t bytes, std::uint32_t tag) {
  check_live(impl_->aborted, "send");
  try {
    auto buf = impl_->ctx->createUnboundBuffer(const_cast<void*>(data), bytes);
    buf->send(dst, tag);
    buf->waitSend(impl_->timeout);
  } catch (const std::exception& e) {
    throw Error("gloo send to rank " + std::to_string(dst) + ": " + e.what());
  }
}

void GlooGroup::post_send(int dst, std::vector<char> data, std::uint32_t tag) {
  check_live(impl_->aborted, "send");
  try {
    Impl::Posted p;
    p.data = std::make_unique<std::vector<char>>(std::move(data));
    p.buf = impl_->ctx->createUnboundBuffer(p.data->data(), p.data->size());
    p.dst = dst;
    p.buf->send(dst, tag);
    impl_->posted.push_back(std::move(p));
  } catch (const std::exception& e) {
    throw Error("gloo send to rank " + std::to_string(dst) + ": " + e.what());
  }
}

void GlooGroup::wait_sends() {
  auto posted = std::move(impl_->posted);
  impl_->posted.clear();
  for (auto& p : posted) {
    try {
      p.buf->waitSend(impl_->timeout);
    } catch (const std::exception& e) {
      throw Error("gloo send to rank " + std::to_string(p.dst) + ": " + e.what());
    }
  }
}

void GlooGroup::recv(int src, void* data, std::size_t bytes, std::uint32_t tag, std::chrono::milliseconds timeout) {
  check_live(impl_->aborted, "recv");
  bool done = false;
  try {
    auto buf = impl_->ctx->createUnboundBuffer(data, bytes);
    buf->recv(src, tag);
    {
      std::lock_guard lk(impl_->pending_mu);
      impl_->pending = buf.get();
    }
    if (impl_->aborted.load()) buf->abortWaitRecv();
    try {
      done = buf->waitRecv(timeout.count() > 0 ? timeout : impl_->timeout);
    } catch (...) {
      std::lock_guard lk(impl_->pending_mu);
      impl_->pending = nullptr;
      throw;
    }
    std::lock_guard lk(impl_->pending_mu);
    impl_->pending = nullptr;
  } catch (const std::exception& e) {
    throw Error("gloo recv from rank " + std::to_string(src) + ": " + e.what());
  }
  if (!done) throw Error("gloo recv from rank " + std::to_string(src) + ": communicator aborted");
}

GlooCommunicator::GlooCommunicator(RendezvousStore& store, const std::string& prefix, int tp,
                                   const std::vector<int>& local_ranks, const GlooOptions& options)
    : tp_(tp) {
  // Each local rank connects on its own thread: Gloo's rendezvous waits for
  // every rank of the group, and two of them may be here.
  std::vector<std::unique_ptr<GlooGroup>> made(local_ranks.size());
  std::vector<std::exception_ptr> errs(local_ranks.size());
  std::vector<std::thread> th;
  for (std::size_t i = 0; i < local_ranks.size(); ++i)
    th.emplace_back([&, i] {
      try {
        made[i] = std::make_unique<GlooGroup>(store, prefix, local_ranks[i], tp, options);
      } catch (...) {
        errs[i] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  for (std::size_t i = 0; i < local_ranks.size(); ++i) groups_[local_ranks[i]] = std::move(made[i]);
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::all_reduce_sum(int rank, float* data, std::size_t count) {
  auto it = groups_.find(rank);
  if (it == groups_.end()) throw InputError("gloo communicator: rank " + std::to_string(rank) + " is not held here");
  it->second->all_reduce_sum(data, count);
}

void GlooCommunicator::gather_columns(int rank, const float* slice, std::size_t rows,
                                      std::span<const std::size_t> widths, float* full) {
  auto it = groups_.find(rank);
  if (it == groups_.end()) throw InputError("gloo communicator: rank " + std::to_string(rank) + " is not held here");
  it->second->gather_columns(slice, rows, widths, full);
}

void GlooCommunicator::abort() noexcept {
  for (auto& [r, g] : groups_) g->abort();
}

AllReduceMeasurement measure_gloo_allreduce(int n_ranks, std::size_t bytes, bool quick) {
  if (n_ranks < 1) throw InputError("gloo all-reduce: n_ranks must be >= 1, got " + std::to_string(n_ranks));
  const std::size_t count = bytes / sizeof(float);
  if (count == 0) throw InputError("gloo all-reduce: bytes must be >= 4, got " + std::to_string(bytes));
  using Clock = std::chrono::steady_clock;
  LocalStore store;
  std::vector<int> all(static_cast<std::size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r) all[static_cast<std::size_t>(r)] = r;
  GlooCommunicator comm(store, "bench", n_ranks, all);
  AllReduceMeasurement m;
  m.n_ranks = n_ranks;
  m.bytes = count * sizeof(float);
  m.method = "gloo float32 sum (loopback TCP)";
  const double target_s = quick ? 0.1 : 0.5;
  std::atomic<int> iterations{0};
  double total_seconds = 0;
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r)
    th.emplace_back([&, r] {
      try {
        std::vector<float> buf(count, 0.0f);
        auto t0 = Clock::now();
        for (int i = 0; i < 2; ++i) comm.all_reduce_sum(r, buf.data(), count);
        // Rank 0's warm-up time decides, and every rank learns it from a sum.
        float it = 0;
        if (r == 0) {
          double warm = std::chrono::duration<double>(Clock::now() - t0).count() / 2;
          it = static_cast<float>(std::clamp(target_s / std::max(warm, 1e-9), 3.0, 1000.0));
        }
        comm.all_reduce_sum(r, &it, 1);
        const int iters = static_cast<int>(it);
        t0 = Clock::now();
        for (int i = 0; i < iters; ++i) comm.all_reduce_sum(r, buf.data(), count);
        float sync = 0;
        comm.all_reduce_sum(r, &sync, 1);
        if (r == 0) {
          total_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
          iterations = iters;
        }
      } catch (...) {
        errs[static_cast<std::size_t>(r)] = std::current_exception();
        comm.abort();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  m.iterations = iterations;
  finish_allreduce_measurement(m, total_seconds);
  return m;
}

}  // namespace ftp::comm
