// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: one rank per CUDA device and stream; kernels/ for the
// layer operations, cuBLAS for large matmuls, NCCL or the same-GPU
// communicator for all-reduce, CUDA graphs for small decode batches.
#include "engine/cuda/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <sstream>
#include <string>

#include "comm/inproc.hpp"
#include "comm/nccl.hpp"
#include "core/error.hpp"
#include "engine/cuda/cuda_check.hpp"
#include "engine/cuda/device_weights.hpp"
#include "kernels/add.cuh"
#include "kernels/add_rmsnorm.cuh"
#include "kernels/argmax.cuh"
#include "kernels/attention_decode.cuh"
#include "kernels/attention_prefill.cuh"
#include "kernels/convert.cuh"
#include "kernels/dequant.cuh"
#include "kernels/embed.cuh"
#include "kernels/kv_write.cuh"
#include "kernels/launch.cuh"
#include "kernels/matvec.cuh"
#include "kernels/quantize_act.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope_kv_write.cuh"
#include "kernels/logprobs.cuh"
#include "kernels/sample.cuh"
#include "kernels/silu_mul.cuh"
#include "kernels/sum_buffers.cuh"

namespace ftp::engine {

namespace {

using cuda::check;

/// "1-32", "1,2,4,8", "off" -> batch sizes.
std::vector<int> parse_graph_batches(const std::string& text) {
  std::vector<int> out;
  if (text == "off" || text == "none" || text == "0") return out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    const auto dash = part.find('-');
    try {
      if (dash == std::string::npos) {
        out.push_back(std::stoi(part));
      } else {
        const int a = std::stoi(part.substr(0, dash)), b = std::stoi(part.substr(dash + 1));
        for (int i = a; i <= b && i - a < 4096; ++i) out.push_back(i);
      }
    } catch (const std::exception&) {
      throw InputError("FTP_CUDA_GRAPHS: '" + part + "' is not a batch size or range (e.g. 1-32, 1,2,4, off)");
    }
  }
  return out;
}

}  // namespace

CudaBackendOptions CudaBackendOptions::from_env() {
  CudaBackendOptions o;
  const char* g = std::getenv("FTP_CUDA_GRAPHS");
  o.graph_batches = parse_graph_batches(g && *g ? g : "1-32");
  if (const char* f = std::getenv("FTP_CUDA_FUSE"); f && *f) o.fuse = std::string(f) != "0" && std::string(f) != "off";
  if (const char* f = std::getenv("FTP_CUDA_INT8_DOTS"); f && *f)
    o.int8_dots = std::string(f) != "0" && std::string(f) != "off";
  if (const char* f = std::getenv("FTP_CUDA_STEP_TIMING"); f && *f)
    o.step_timing = std::string(f) != "0" && std::string(f) != "off";
  if (const char* f = std::getenv("FTP_CUDA_PDL"); f && *f)
    o.programmatic_launch = std::string(f) != "0" && std::string(f) != "off";
  if (const char* m = std::getenv("FTP_GEMV_MAX_ROWS"); m && *m && std::string(m) != "auto") {
    try {
      o.gemv_max_rows = std::stoi(m);
    } catch (const std::exception&) {
      throw InputError(std::string("FTP_GEMV_MAX_ROWS: '") + m + "' is not an integer or auto");
    }
    if (o.gemv_max_rows < 0)
      throw InputError(std::string("FTP_GEMV_MAX_ROWS: '") + m + "' must be 0 (cuBLAS always) or more, or auto");
  }
  if (const char* c = std::getenv("FTP_GEMV_CONFIG"); c && *c && std::string(c) != "auto") {
    // ROWSxWARPS: rows per row group x warps per group (kernels::MatvecConfig).
    int r = 0, w = 0;
    char tail = 0;
    if (std::sscanf(c, "%dx%d%c", &r, &w, &tail) != 2 || !kernels::matvec_config_built({r, w}))
      throw InputError(std::string("FTP_GEMV_CONFIG: '") + c +
                       "' is not a built configuration (auto, 1x1, 2x1, 1x4, 2x4, 4x4, 8x4)");
    o.gemv_rows_per_warp = r;
    o.gemv_warps_per_row = w;
  }
  return o;
}

bool cuda_backend_built() noexcept { return true; }

namespace {
std::atomic<std::uint64_t> g_graph_captures{0}, g_graph_failures{0};
}  // namespace

CudaGraphStats cuda_graph_stats() noexcept { return {g_graph_captures.load(), g_graph_failures.load()}; }

namespace {
std::mutex g_timing_mu;
CudaStepTiming g_timing;
}  // namespace

CudaStepTiming cuda_step_timing() {
  std::lock_guard lk(g_timing_mu);
  return g_timing;
}

namespace {

/// The all-reduce of one stage's ranks, and the gather of the
/// vocabulary-parallel head's slices into rank 0.
class StageComm {
 public:
  virtual ~StageComm() = default;
  virtual void all_reduce(int rank, float* x, std::size_t n, cudaStream_t s) = 0;
  /// RankBackend::gather_columns; `staging`: rank 0's rows x (the other
  /// ranks' widths) floats for slices received whole (NCCL at rows > 1),
  /// else null.
  virtual void gather_columns(int rank, const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                              float* full, float* staging, cudaStream_t s) = 0;
  /// Whether gather_columns needs rank 0's staging buffer for `rows` rows.
  virtual bool gather_stages(std::size_t rows) const noexcept { return rows > 1; }
  virtual void abort() noexcept = 0;
  /// Whether a rank's all-reduce can be captured in a CUDA graph.
  virtual bool graph_safe() const noexcept = 0;
};

/// Several ranks on one GPU: each rank records an event after its part;
/// after a host barrier rank 0's stream waits for all of them, sums every
/// buffer in place (kernels::sum_buffers_f32, rank order) and records a
/// second event that the other ranks' streams wait on after a second
/// barrier. Nothing blocks on the device; the barriers only order the host
/// enqueueing (so not capturable in a graph).
class SameGpuComm final : public StageComm {
 public:
  SameGpuComm(int n, int device) : n_(n), device_(device), barrier_(n), ptrs_(static_cast<std::size_t>(n)) {
    const std::string where = "cuda:" + std::to_string(device) + " same-GPU communicator";
    cuda::DeviceGuard g(device, where);
    events_.assign(static_cast<std::size_t>(n) + 1, nullptr);
    for (auto& e : events_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", where);
  }
  ~SameGpuComm() override {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    for (auto e : events_)
      if (e) cudaEventDestroy(e);
    if (prev >= 0) cudaSetDevice(prev);
  }
  void all_reduce(int rank, float* x, std::size_t n, cudaStream_t s) override {
    const std::string where = "cuda:" + std::to_string(device_) + " rank " + std::to_string(rank) + " all-reduce";
    const auto r = static_cast<std::size_t>(rank);
    check(cudaEventRecord(events_[r], s), "cudaEventRecord", where);
    ptrs_[r] = x;
    barrier_.barrier(rank);  // every part is enqueued and its event recorded
    cudaEvent_t done = events_[static_cast<std::size_t>(n_)];
    if (rank == 0) {
      for (int p = 1; p < n_; ++p) check(cudaStreamWaitEvent(s, events_[static_cast<std::size_t>(p)], 0), "cudaStreamWaitEvent", where);
      check(kernels::sum_buffers_f32(ptrs_.data(), n_, n, s), "sum_buffers_f32", where);
      check(cudaEventRecord(done, s), "cudaEventRecord", where);
    }
    barrier_.barrier(rank);  // the sum is enqueued
    if (rank != 0) check(cudaStreamWaitEvent(s, done, 0), "cudaStreamWaitEvent", where);
  }
  /// As all_reduce: after the first barrier rank 0's stream waits for
  /// every slice and copies each into its columns of `full` (one GPU: no
  /// staging); the others' streams wait for those copies before they may
  /// write their slices again.
  void gather_columns(int rank, const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                      float* full, float* staging, cudaStream_t s) override {
    (void)staging;
    const std::string where = "cuda:" + std::to_string(device_) + " rank " + std::to_string(rank) + " gather";
    const auto r = static_cast<std::size_t>(rank);
    if (widths.size() != static_cast<std::size_t>(n_))
      throw InputError(where + ": " + std::to_string(widths.size()) + " widths for " + std::to_string(n_) + " ranks");
    check(cudaEventRecord(events_[r], s), "cudaEventRecord", where);
    ptrs_[r] = const_cast<float*>(slice);
    barrier_.barrier(rank);
    cudaEvent_t done = events_[static_cast<std::size_t>(n_)];
    if (rank == 0) {
      std::size_t ld = 0;
      for (std::size_t w : widths) ld += w;
      std::size_t c0 = 0;
      for (int p = 0; p < n_; ++p) {
        const std::size_t w = widths[static_cast<std::size_t>(p)];
        if (p > 0) check(cudaStreamWaitEvent(s, events_[static_cast<std::size_t>(p)], 0), "cudaStreamWaitEvent", where);
        if (rows && w)
          check(cudaMemcpy2DAsync(full + c0, ld * sizeof(float), ptrs_[static_cast<std::size_t>(p)], w * sizeof(float),
                                  w * sizeof(float), rows, cudaMemcpyDeviceToDevice, s),
                "cudaMemcpy2DAsync (logits slice)", where);
        c0 += w;
      }
      check(cudaEventRecord(done, s), "cudaEventRecord", where);
    }
    barrier_.barrier(rank);
    if (rank != 0) check(cudaStreamWaitEvent(s, done, 0), "cudaStreamWaitEvent", where);
  }
  bool gather_stages(std::size_t) const noexcept override { return false; }
  void abort() noexcept override { barrier_.abort(); }
  bool graph_safe() const noexcept override { return false; }

 private:
  int n_, device_;
  comm::InprocCommunicator barrier_;
  std::vector<float*> ptrs_;
  std::vector<cudaEvent_t> events_;  // one per rank, then "done"
};

/// Ranks on distinct GPUs: NCCL communicators of the pool for the set.
class NcclStageComm final : public StageComm {
 public:
  explicit NcclStageComm(std::vector<int> devices)
      : devices_(std::move(devices)), comms_(comm::NcclPool::instance().group(devices_)) {}
  ~NcclStageComm() override {
    // An aborted set was dropped from the pool: a later hold is someone else's.
    if (!aborted_.load()) comm::NcclPool::instance().release(devices_);
  }
  void all_reduce(int rank, float* x, std::size_t n, cudaStream_t s) override {
    if (aborted_.load()) throw BackendError("nccl all-reduce: the stage's communicator was aborted (a peer failed)");
    comm::nccl_all_reduce_sum(comms_[static_cast<std::size_t>(rank)], x, n, s, devices_[static_cast<std::size_t>(rank)]);
  }
  void gather_columns(int rank, const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                      float* full, float* staging, cudaStream_t s) override {
    if (aborted_.load()) throw BackendError("nccl gather: the stage's communicator was aborted (a peer failed)");
    comm::nccl_gather_columns(comms_[static_cast<std::size_t>(rank)], rank, slice, rows, widths, full, staging, s,
                              devices_[static_cast<std::size_t>(rank)]);
  }
  void abort() noexcept override {
    if (!aborted_.exchange(true)) comm::NcclPool::instance().drop(devices_);
  }
  bool graph_safe() const noexcept override { return true; }

 private:
  std::vector<int> devices_;
  std::vector<void*> comms_;
  std::atomic<bool> aborted_{false};
};

/// A device allocation that grows by doubling; growth bumps `generation`.
struct DevBuf {
  void* p = nullptr;
  std::size_t cap = 0;  // bytes
};

class CudaRank final : public RankBackend {
 public:
  CudaRank(const WeightStore& w, const RankSpec& spec, int device, std::shared_ptr<StageComm> comm,
           const CudaBackendOptions& opts)
      : w_(w), hp_(w.hparams()), spec_(spec), device_(device), comm_(std::move(comm)) {
    where_ = "cuda:" + std::to_string(device) + " stage " + std::to_string(spec.stage) + " rank " + std::to_string(spec.rank);
    graphs_on_ = !opts.graph_batches.empty() && (spec.tp == 1 || comm_->graph_safe());
    for (int b : opts.graph_batches) graph_batches_.push_back(b);
    gemv_max_rows_ = opts.gemv_max_rows;
    gemv_config_ = {opts.gemv_rows_per_warp, opts.gemv_warps_per_row};
    fuse_ = opts.fuse;
    int8_dots_ = opts.int8_dots;
    timing_ = opts.step_timing;
    cuda::DeviceGuard guard(device, where_);
    try {
      weights_ = cuda::DeviceWeights::get(w, device);
      // Its own shard where the table's union was not made resident first.
      weights_->ensure(RankShard{spec.first_layer, spec.n_layers, spec.tp, spec.rank, spec.first_stage, spec.last_stage});
      neox_ = hp_.rope_type == model::RopeType::neox;
      if (w.rope_freqs()) rope_freqs_ = norm(w.rope_freqs());
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", where_);
      check(cublasCreate(&cublas_), "cublasCreate", where_);
      check(cublasSetStream(cublas_, stream_), "cublasSetStream", where_);
      // A fixed workspace: cuBLAS then allocates nothing inside graph capture.
      check(cudaMalloc(&cublas_ws_, kCublasWorkspace), "cudaMalloc (cuBLAS workspace)", where_);
      check(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace), "cublasSetWorkspace", where_);

      const RankLayerView v = split_rank(hp_, spec.tp, spec.rank);
      kvh_ = v.kv_heads.size();
      kv_dtype_ = resolve_kv_dtype(spec.kv_dtype, w.matrix_dtype());
      kv_elem_ = kv_dtype_ == KvDtype::f32 ? kernels::KvElem::f32
                 : kv_dtype_ == KvDtype::bf16 ? kernels::KvElem::bf16
                                              : kernels::KvElem::f16;
      layer_bytes_ = static_cast<std::size_t>(spec.kv_blocks) * kvh_ * spec.block_tokens * hp_.head_dim *
                     kv_element_bytes(kv_dtype_);
      kv_bytes_ = 2 * layer_bytes_ * spec.n_layers;
      std::size_t free_b = 0, total_b = 0;
      check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", where_);
      if (kv_bytes_ > free_b)
        throw BackendError(where_ + ": KV cache needs " + std::to_string(kv_bytes_ >> 20) + " MiB (" +
                           std::to_string(spec.kv_blocks) + " blocks), the device has " + std::to_string(free_b >> 20) +
                           " MiB free");
      if (kv_bytes_ > 0) {
        check(cudaMalloc(reinterpret_cast<void**>(&kv_k_), kv_bytes_ / 2), "cudaMalloc (KV cache K)", where_);
        check(cudaMalloc(reinterpret_cast<void**>(&kv_v_), kv_bytes_ / 2), "cudaMalloc (KV cache V)", where_);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaRank() override { release(); }

  void bind_thread() override { check(cudaSetDevice(device_), "cudaSetDevice", where_); }
  std::uint64_t kv_bytes() const override { return kv_bytes_; }

  float* buffer(Buf id, std::size_t n) override {
    flush();
    return static_cast<float*>(grow(bufs_[static_cast<std::size_t>(id)], n * sizeof(float), "buffer"));
  }

  void set_batch(const BatchLayout& b) override {
    flush();
    free_deferred();
    mark(0);
    // Sections at fixed offsets while the capacities hold, so that a graph
    // captured for a batch size reads the next step's layout at the same
    // addresses: tokens, pos, seq, slot [rows_cap] then the block table
    // [seq_cap][bt_cap].
    const bool grew = b.n_rows > rows_cap_ || b.n_seq > seq_cap_ || b.max_blocks > bt_cap_;
    if (grew) {
      rows_cap_ = std::max({b.n_rows, 2 * rows_cap_, spec_.max_rows > 0 ? std::min(spec_.max_rows, 4096) : 1});
      seq_cap_ = std::max({b.n_seq, 2 * seq_cap_, 64});
      bt_cap_ = std::max({b.max_blocks, 2 * bt_cap_, 16});
      ++generation_;  // new offsets: captured graphs read the old ones
    }
    const std::size_t ints = 4 * static_cast<std::size_t>(rows_cap_) + static_cast<std::size_t>(seq_cap_) * bt_cap_;
    layout_dev_ = static_cast<int*>(grow(layout_buf_, ints * sizeof(int), "batch layout"));
    host_layout_.assign(ints, -1);
    const auto R = static_cast<std::size_t>(rows_cap_);
    std::copy(b.tokens.begin(), b.tokens.end(), host_layout_.begin());
    std::copy(b.pos.begin(), b.pos.end(), host_layout_.begin() + static_cast<std::ptrdiff_t>(R));
    std::copy(b.seq.begin(), b.seq.end(), host_layout_.begin() + static_cast<std::ptrdiff_t>(2 * R));
    std::copy(b.slot.begin(), b.slot.end(), host_layout_.begin() + static_cast<std::ptrdiff_t>(3 * R));
    for (int s = 0; s < b.n_seq; ++s)
      std::copy_n(b.block_table.begin() + static_cast<std::ptrdiff_t>(s) * b.max_blocks, b.max_blocks,
                  host_layout_.begin() + static_cast<std::ptrdiff_t>(4 * R + static_cast<std::size_t>(s) * bt_cap_));
    const std::size_t used = 4 * R + static_cast<std::size_t>(b.n_seq) * bt_cap_;
    check(cudaMemcpyAsync(layout_dev_, host_layout_.data(), used * sizeof(int), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (batch layout)", where_);
    n_rows_ = b.n_rows;
    decode_only_ = b.decode_only;
    logit_rows_ = b.logit_rows;
  }

  void upload(const float* host, float* dev, std::size_t n) override {
    flush();
    if (n) check(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)", where_);
  }
  void download(const float* dev, float* host, std::size_t n) override {
    float* const dst[1] = {host};
    copy_rows(dev, n, dst, 1, false);  // activations to the next stage: not a step's end
  }
  /// Through pinned host memory above 64 KiB: a copy into pageable memory
  /// is staged by the driver in small pieces (a step's logits at batch 64,
  /// 33 MB, took 11 ms that way on an H200 and 0.6 ms pinned).
  void download_rows(const float* dev, std::size_t row_len, float* const* dst, std::size_t n_rows) override {
    copy_rows(dev, row_len, dst, n_rows, true);
  }
  /// `timed`: the step's end (the logits), for the step timing.
  void copy_rows(const float* dev, std::size_t row_len, float* const* dst, std::size_t n_rows, bool timed) {
    flush();
    const std::size_t n = row_len * n_rows;
    if (n == 0) return sync();
    if (n * sizeof(float) < kPinnedFrom) {
      if (timed) mark(2);
      for (std::size_t i = 0; i < n_rows; ++i)
        check(cudaMemcpyAsync(dst[i], dev + i * row_len, row_len * sizeof(float), cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync (download)", where_);
      if (timed) mark(3);
      sync();
      if (timed) account_step();
      return;
    }
    if (pinned_cap_ < n) {
      if (pinned_) cudaFreeHost(pinned_);
      pinned_ = nullptr;
      pinned_cap_ = 0;
      check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), n * sizeof(float)), "cudaMallocHost (download staging)",
            where_);
      pinned_cap_ = n;
    }
    if (timed) mark(2);
    check(cudaMemcpyAsync(pinned_, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)",
          where_);
    if (timed) mark(3);
    sync();
    if (timed) account_step();
    for (std::size_t i = 0; i < n_rows; ++i) std::memcpy(dst[i], pinned_ + i * row_len, row_len * sizeof(float));
  }

  /// The ids chosen on the device: argmax_rows when every row is greedy,
  /// else sample_top_p with the rows' parameters (their draws as floats,
  /// kept below 1); 4 bytes a row come back instead of the logits. With
  /// `lp` and a row that asks log-probabilities, logprobs_rows runs over
  /// the rows at the largest k asked, and each such row gets its share
  /// (4 + 8 k bytes a row).
  void choose_tokens(const float* logits, std::size_t n_vocab, std::size_t n_rows, const TokenChoice* choices,
                     int* out, TokenLogprobs* lp) override {
    flush();
    if (n_rows == 0) return sync();
    mark(2);
    bool greedy = true;
    for (std::size_t i = 0; i < n_rows; ++i) greedy = greedy && choices[i].temperature <= 0.0f;
    const auto rows = static_cast<int>(n_rows), n = static_cast<int>(n_vocab);
    auto* dev = static_cast<float*>(grow(choice_buf_, n_rows * 4 * sizeof(float), "token choices"));
    int* ids = reinterpret_cast<int*>(dev + 3 * n_rows);
    if (greedy) {
      check(kernels::argmax_rows(logits, rows, n, ids, stream_), "argmax_rows", where_);
    } else {
      host_choices_.resize(3 * n_rows);
      const float below_one = std::nextafter(1.0f, 0.0f);
      for (std::size_t i = 0; i < n_rows; ++i) {
        host_choices_[i] = choices[i].temperature;
        host_choices_[n_rows + i] = choices[i].top_p;
        host_choices_[2 * n_rows + i] = std::min(static_cast<float>(choices[i].uniform), below_one);
      }
      check(cudaMemcpyAsync(dev, host_choices_.data(), 3 * n_rows * sizeof(float), cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync (token choices)", where_);
      check(kernels::sample_top_p(logits, n, rows, n, dev, dev + n_rows, dev + 2 * n_rows, ids, stream_), "sample_top_p",
            where_);
    }
    check(cudaMemcpyAsync(out, ids, n_rows * sizeof(int), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (token ids)",
          where_);
    int k = -1;
    if (lp)
      for (std::size_t i = 0; i < n_rows; ++i) k = std::max(k, std::min({choices[i].logprobs, kMaxTopLogprobs, n}));
    if (k >= 0) {
      // [chosen: rows][top lp: rows x k][top ids: rows x k], floats and ints of 4 bytes.
      const std::size_t per = 1 + 2 * static_cast<std::size_t>(k);
      auto* ldev = static_cast<float*>(grow(logprob_buf_, n_rows * per * sizeof(float), "token logprobs"));
      float* top_lp = ldev + n_rows;
      int* top_ids = reinterpret_cast<int*>(top_lp + n_rows * static_cast<std::size_t>(k));
      check(kernels::logprobs_rows(logits, n, rows, n, ids, k, ldev, top_ids, top_lp, stream_), "logprobs_rows", where_);
      host_logprobs_.resize(n_rows * per);
      check(cudaMemcpyAsync(host_logprobs_.data(), ldev, n_rows * per * sizeof(float), cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (token logprobs)", where_);
    }
    mark(3);
    sync();
    if (k >= 0) {
      const auto K = static_cast<std::size_t>(k);
      const float* h = host_logprobs_.data();
      const float* h_lp = h + n_rows;
      const auto* h_ids = reinterpret_cast<const int*>(h_lp + n_rows * K);
      for (std::size_t i = 0; i < n_rows; ++i) {
        if (choices[i].logprobs < 0) continue;
        TokenLogprobs& r = lp[i];
        r.chosen = {out[i], h[i]};
        r.top.clear();
        const auto ki = std::min(K, static_cast<std::size_t>(choices[i].logprobs));
        for (std::size_t j = 0; j < ki; ++j) r.top.push_back({h_ids[i * K + j], h_lp[i * K + j]});
      }
    }
    account_step();
  }

  void embed(float* x) override {
    flush();
    // Vocabulary-parallel: the rank's rows of the table; a token outside them embeds as zeros.
    const MatView table = w_.embedding(spec_.tp, spec_.rank);
    if (table.rows == 0) {
      check(cudaMemsetAsync(x, 0, static_cast<std::size_t>(n_rows_) * hp_.n_embd * sizeof(float), stream_),
            "cudaMemsetAsync (embedding)", where_);
      return;
    }
    check(kernels::embed_rows(cuda::device_view(*weights_, table), tokens(), n_rows_, x, stream_,
                              w_.vocab_rows(spec_.tp, spec_.rank).begin),
          "embed_rows", where_);
  }
  void gather_columns(const float* slice, std::size_t rows, std::span<const std::size_t> widths,
                      float* full) override {
    flush();
    if (spec_.tp == 1) {
      // One rank: its slice is the whole row.
      if (rows && widths[0] && slice != full)
        check(cudaMemcpyAsync(full, slice, rows * widths[0] * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
              "cudaMemcpyAsync (logits)", where_);
      return;
    }
    float* staging = nullptr;
    if (spec_.rank == 0 && comm_->gather_stages(rows)) {
      std::size_t peers = 0;  // the other ranks' columns
      for (std::size_t r = 1; r < widths.size(); ++r) peers += widths[r];
      staging = buffer(Buf::logits_gather, rows * peers);
    }
    comm_->gather_columns(spec_.rank, slice, rows, widths, full, staging, stream_);
  }
  void rmsnorm(const float* x, const float* w, float* out, int rows) override {
    if (add_.x && add_.x == x && add_.n == static_cast<std::size_t>(rows) * hp_.n_embd && out != add_.x && out != add_.y) {
      float* ax = add_.x;
      const float* ay = add_.y;
      add_ = {};
      check(kernels::add_rmsnorm_f32(ax, ay, norm(w), out, rows, hp_.n_embd, hp_.rms_eps, stream_), "add_rmsnorm_f32",
            where_);
      return;
    }
    flush();
    check(kernels::rmsnorm_f32(x, norm(w), out, rows, hp_.n_embd, hp_.rms_eps, stream_), "rmsnorm_f32", where_);
  }
  void matmul(const float* x, const MatView& w, float* out, int rows) override {
    if (rows <= 0 || w.rows <= 0) return;
    const kernels::WeightView v = cuda::device_view(*weights_, w);
    // The block types (Q4_0 .. Q6_K) take the activations quantized as the
    // CPU backend quantizes them (Q8_0 / Q8_K values, bit for bit), so that
    // a gear's logits do not depend on its backend beyond float rounding;
    // one quantization serves every product of a deferred group.
    const kernels::ActQuant aq = kernels::act_quant_of(v.dtype);
    if (rows <= gemv_max_rows(v.dtype)) {
      // Deferred: consecutive products of the same activations (q, k, v;
      // gate, up) go out as one launch (kernels::matvec_multi).
      bool joins = fuse_ && pending_.n > 0 && pending_.n < kernels::kMaxMatvecTargets && pending_.src == x &&
                   pending_.act == aq && pending_.rows == rows && pending_.t[0].w.cols == v.cols;
      for (int j = 0; joins && j < pending_.n; ++j) joins = pending_.t[j].out != out;
      if (!joins) flush();
      const float* xin = joins ? pending_.x : quantized(x, rows, v.cols, aq);
      const kernels::Q8Acts* q8 = aq != kernels::ActQuant::none && int8_dots_ ? &q8_ : nullptr;
      if (!fuse_) {
        check(kernels::matvec(xin, static_cast<int>(w.cols), v, out, static_cast<int>(w.rows), rows, stream_,
                              gemv_config(v.dtype), q8),
              "matvec",
              where_);
        return;
      }
      pending_.x = xin;
      pending_.src = x;
      pending_.act = aq;
      pending_.rows = rows;
      pending_.t[pending_.n++] = kernels::MatvecTarget{v, out, static_cast<int>(w.rows)};
      return;
    }
    flush();
    gemm(quantized(x, rows, v.cols, aq), v, out, rows);
  }
  void add_bias(float* x, const VecView& b) override {
    flush();
    check(kernels::add_bias_f32(x, norm(b.base) + b.first, n_rows_, static_cast<int>(b.n), stream_), "add_bias_f32",
          where_);
  }
  void head_rmsnorm(float* v, const float* w, int n_heads) override {
    flush();
    check(kernels::rmsnorm_f32(v, norm(w), v, n_rows_ * n_heads, hp_.head_dim, hp_.rms_eps, stream_), "rmsnorm_f32 (heads)",
          where_);
  }
  void rope(float* v, int n_heads) override {
    // Deferred: q then k, joined by the KV write of k (rope_kv_write_f32).
    if (fuse_ && rope_n_ == 1 && rope_[0].v != v) {
      rope_[rope_n_++] = {v, n_heads};
      return;
    }
    flush();
    if (fuse_) {
      rope_[0] = {v, n_heads};
      rope_n_ = 1;
      return;
    }
    rope_now(v, n_heads);
  }
  void rope_now(float* v, int n_heads) {
    check(kernels::rope_f32(v, n_heads * hp_.head_dim, n_rows_, n_heads, hp_.head_dim, hp_.n_rot, pos(), hp_.rope_theta,
                            neox_, rope_freqs_, stream_),
          "rope_f32", where_);
  }
  void kv_write(int layer, const float* k, const float* v) override {
    const std::size_t off = static_cast<std::size_t>(layer) * layer_bytes_;
    if (rope_n_ == 2 && rope_[1].v == k && rope_[1].n_heads == kvh_ && rope_[0].v != v && rope_[1].v != v) {
      rope_n_ = 0;
      check(kernels::rope_kv_write(rope_[0].v, rope_[0].n_heads, rope_[1].v, v, kvh_, n_rows_, hp_.head_dim, hp_.n_rot,
                                   pos(), hp_.rope_theta, neox_, rope_freqs_, kv_k_ + off, kv_v_ + off, kv_elem_,
                                   spec_.block_tokens, slots(), stream_),
            "rope_kv_write", where_);
      return;
    }
    flush();
    check(kernels::kv_write(kv_k_ + off, kv_v_ + off, kv_elem_, k, v, kvh_ * hp_.head_dim, n_rows_, kvh_, hp_.head_dim,
                            spec_.block_tokens, slots(), stream_),
          "kv_write", where_);
  }
  void attention(int layer, const float* q, float* out, int nq, int q_head0, int kv_head0) override {
    flush();
    const std::size_t off = static_cast<std::size_t>(layer) * layer_bytes_;
    kernels::AttentionArgs a;
    a.q = q;
    a.q_ld = nq * hp_.head_dim;
    a.out = out;
    a.out_ld = nq * hp_.head_dim;
    a.k_pages = kv_k_ + off;
    a.v_pages = kv_v_ + off;
    a.kv_elem = kv_elem_;
    a.block_tables = layout_dev_ + 4 * static_cast<std::size_t>(rows_cap_);
    a.bt_ld = bt_cap_;
    a.row_seq = layout_dev_ + 2 * static_cast<std::size_t>(rows_cap_);
    a.row_pos = pos();
    a.t = n_rows_;
    a.n_q_heads = nq;
    a.q_head0 = q_head0;
    a.group = hp_.n_head / hp_.n_head_kv;
    a.kv_head0 = kv_head0;
    a.kv_heads = kvh_;
    a.head_dim = hp_.head_dim;
    a.block_tokens = spec_.block_tokens;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
    if (decode_only_) check(kernels::attention_decode(a, stream_), "attention_decode", where_);
    else check(kernels::attention_prefill(a, stream_), "attention_prefill", where_);
  }
  void silu_mul(float* g, const float* u, std::size_t n) override {
    flush();
    check(kernels::silu_mul_f32(g, u, n, stream_), "silu_mul_f32", where_);
  }
  void zero(float* x, std::size_t n) override {
    flush();
    if (n) check(cudaMemsetAsync(x, 0, n * sizeof(float), stream_), "cudaMemsetAsync", where_);
  }
  void add(float* x, const float* y, std::size_t n) override {
    flush();
    if (fuse_) {
      add_ = {x, y, n};  // deferred: the RMSNorm that follows reads x
      return;
    }
    check(kernels::add_f32(x, y, n, stream_), "add_f32", where_);
  }
  void all_reduce(float* x, std::size_t n) override {
    flush();
    if (spec_.tp > 1 && n) comm_->all_reduce(spec_.rank, x, n, stream_);
  }
  void gather_logit_rows(const float* x, float* out) override {
    flush();
    const std::size_t E = static_cast<std::size_t>(hp_.n_embd);
    for (std::size_t i = 0; i < logit_rows_.size(); ++i)
      check(cudaMemcpyAsync(out + i * E, x + static_cast<std::size_t>(logit_rows_[i]) * E, E * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync (logit rows)", where_);
  }
  void abort() noexcept override {
    if (comm_) comm_->abort();
  }

  void run(int graph_key, const std::function<void()>& ops) override {
    run_layers(graph_key, ops);
    mark(1);
  }
  void run_layers(int graph_key, const std::function<void()>& ops) {
    flush();
    if (graph_key < 0 || !graphs_on_ ||
        std::find(graph_batches_.begin(), graph_batches_.end(), graph_key) == graph_batches_.end()) {
      run_eager(ops);
      return;
    }
    if (graph_generation_ != generation_) {
      drop_graphs();
      graph_generation_ = generation_;
    }
    auto it = graphs_.find(graph_key);
    if (it == graphs_.end()) {
      cudaGraphExec_t exec = capture(ops);
      if (!exec) {
        // The capture failed (a call that cannot be captured here): this
        // rank runs eagerly from now on, starting with this step. Nothing
        // ran during the capture.
        graphs_on_ = false;
        ++g_graph_failures;
        run_eager(ops);
        return;
      }
      it = graphs_.emplace(graph_key, exec).first;
      ++g_graph_captures;
    }
    check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch", where_);
  }
  void sync() override {
    flush();
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", where_);
  }

 private:
  static constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;
  // Q8_0 and block-type matrices go to cuBLAS through dequantised tiles of at most this many bytes.
  static constexpr std::size_t kTileBytes = std::size_t{64} << 20;

  /// Runs `ops` as launches on the stream; what a failure left deferred is dropped.
  void run_eager(const std::function<void()>& ops) {
    try {
      ops();
      flush();
    } catch (...) {
      drop_deferred();
      throw;
    }
  }

  /// Captures `ops` into an executable graph (the capture runs nothing).
  /// Buffers that grow during it bump the generation: the graph is then
  /// kept only until the next run. Null when capturing or instantiating
  /// failed (the error is cleared; the stream is usable).
  cudaGraphExec_t capture(const std::function<void()>& ops) {
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    capturing_ = true;
    cudaGraph_t graph = nullptr;
    bool ok = true;
    try {
      ops();
      flush();  // inside the capture: the deferred calls belong to the graph
    } catch (...) {
      drop_deferred();
      ok = false;
    }
    capturing_ = false;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (ok && e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (!ok || e != cudaSuccess || !exec) {
      if (exec) cudaGraphExecDestroy(exec);
      cudaGetLastError();
      return nullptr;
    }
    return exec;
  }

  /// Launches what is deferred (at most one kind at a time): matrix-vector
  /// products, a residual add, RoPEs.
  void flush() {
    if (pending_.n > 0) {
      const int n = pending_.n;
      pending_.n = 0;
      const kernels::Q8Acts* q8 = pending_.act != kernels::ActQuant::none && int8_dots_ ? &q8_ : nullptr;
      check(kernels::matvec_multi(pending_.x, static_cast<int>(pending_.t[0].w.cols), pending_.t, n, pending_.rows,
                                  stream_, gemv_config(pending_.t[0].w.dtype), q8),
            "matvec", where_);
    }
    if (add_.x) {
      const Add a = add_;
      add_ = {};
      check(kernels::add_f32(a.x, a.y, a.n, stream_), "add_f32", where_);
    }
    if (rope_n_ > 0) {
      const int n = rope_n_;
      rope_n_ = 0;
      for (int i = 0; i < n; ++i) rope_now(rope_[i].v, rope_[i].n_heads);
    }
  }
  /// Forgets what is deferred (after a failure).
  void drop_deferred() noexcept {
    pending_.n = 0;
    add_ = {};
    rope_n_ = 0;
  }

  const int* tokens() const { return layout_dev_; }
  const int* pos() const { return layout_dev_ + rows_cap_; }
  const int* slots() const { return layout_dev_ + 3 * static_cast<std::size_t>(rows_cap_); }

  const float* norm(const float* host) const {
    const float* d = weights_->vec(host);
    if (!d) throw BackendError(where_ + ": a weight vector (norm, bias, rope_freqs) that is not resident on the device");
    return d;
  }

  /// Grows `b` to at least `bytes` (doubling); old memory is freed once the
  /// stream is idle (deferred while a graph is being captured).
  void* grow(DevBuf& b, std::size_t bytes, const char* what) {
    if (b.cap >= bytes && b.p) return b.p;
    const std::size_t cap = std::max(bytes, 2 * b.cap);
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<std::size_t>(cap, 16)), (std::string("cudaMalloc (") + what + ")").c_str(), where_);
    if (b.p) {
      if (capturing_) {
        deferred_.push_back(b.p);
      } else {
        check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", where_);
        cudaFree(b.p);
      }
    }
    b.p = p;
    b.cap = cap;
    ++generation_;
    return p;
  }

  void free_deferred() {
    if (deferred_.empty()) return;
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", where_);
    for (void* p : deferred_) cudaFree(p);
    deferred_.clear();
  }

  /// out[rows][v.rows] = x . W^T with cuBLAS. Row-major out is the
  /// column-major (v.rows x rows) matrix C = W_view^T' ... i.e. C = op(A) B
  /// with A the view read column-major (k x n, lda = ld) transposed, B = x
  /// column-major (k x rows, ldb = k).
  void gemm(const float* x, const kernels::WeightView& v, float* out, int rows) {
    const int n = static_cast<int>(v.rows), k = static_cast<int>(v.cols);
    const auto lda = static_cast<int>(v.ld);
    const float one = 1.0f, zero = 0.0f;
    const std::size_t first = static_cast<std::size_t>(v.r0 * v.ld + v.c0);
    switch (v.dtype) {
      case kernels::WeightDType::f32:
        check(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, static_cast<const float*>(v.data) + first,
                          lda, x, k, &zero, out, n),
              "cublasSgemm", where_);
        return;
      case kernels::WeightDType::f16:
      case kernels::WeightDType::bf16: {
        const bool bf = v.dtype == kernels::WeightDType::bf16;
        const cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_16F;
        void* xh = convert_activations(x, static_cast<std::size_t>(rows) * k, bf ? kernels::HalfType::bf16 : kernels::HalfType::f16);
        check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one,
                           static_cast<const std::uint16_t*>(v.data) + first, dt, lda, xh, dt, k, &zero, out, CUDA_R_32F,
                           n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx", where_);
        return;
      }
      default: {
        // Q8_0 and the block types (their activations already quantized:
        // matmul): BF16 tiles of the weights as ggml dequantizes them.
        void* xh = convert_activations(x, static_cast<std::size_t>(rows) * k, kernels::HalfType::bf16);
        const std::int64_t tile_rows =
            std::max<std::int64_t>(1, std::min<std::int64_t>(n, static_cast<std::int64_t>(kTileBytes / (2 * static_cast<std::size_t>(k)))));
        void* tile = grow(tile_buf_, static_cast<std::size_t>(tile_rows) * k * 2, "dequantised tile");
        for (std::int64_t r0 = 0; r0 < n; r0 += tile_rows) {
          const int nr = static_cast<int>(std::min<std::int64_t>(tile_rows, n - r0));
          check(kernels::dequant_tile(v, r0, nr, tile, kernels::HalfType::bf16, stream_), "dequant_tile", where_);
          check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, nr, rows, k, &one, tile, CUDA_R_16BF, k, xh, CUDA_R_16BF,
                             k, &zero, out + r0, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx (dequantised tile)", where_);
        }
        return;
      }
    }
  }

  /// Step timing (CudaBackendOptions::step_timing): event i of the step
  /// (0 layout staged, 1 layers enqueued, 2 download begins, 3 download
  /// enqueued); nothing when off, or while a graph is being captured.
  /// A measurement, never a step's failure: an error turns it off.
  void mark(int i) {
    if (!timing_ || capturing_) return;
    bool ok = true;
    if (!events_[0])
      for (auto& e : events_) ok = ok && cudaEventCreate(&e) == cudaSuccess;
    ok = ok && cudaEventRecord(events_[i], stream_) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();
      timing_ = false;
      return;
    }
    marked_ |= 1u << i;
  }
  /// After the download's sync: adds this step's spans to the process's
  /// totals (cuda_step_timing) when all four events were recorded.
  void account_step() {
    if (marked_ != 0xfu) {
      marked_ = 0;
      return;
    }
    marked_ = 0;
    float ms[3] = {};
    for (int i = 0; i < 3; ++i)
      if (cudaEventElapsedTime(&ms[i], events_[i], events_[i + 1]) != cudaSuccess) {
        cudaGetLastError();
        timing_ = false;
        return;
      }
    std::lock_guard lk(g_timing_mu);
    ++g_timing.steps;
    g_timing.layers_ms += ms[0];
    g_timing.head_ms += ms[1];
    g_timing.download_ms += ms[2];
  }

  /// x itself where the weights take float activations (ActQuant::none);
  /// else x (rows of cols floats) quantized as the CPU backend quantizes
  /// it: the values into act_buf_ (returned), and the int8 quants and block
  /// scales after them, described by q8_ (the integer-dot GEMV's input).
  /// The caller has flushed what read act_buf_ before.
  const float* quantized(const float* x, int rows, std::int64_t cols, kernels::ActQuant aq) {
    if (aq == kernels::ActQuant::none) return x;
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const int block = aq == kernels::ActQuant::q8_k ? 256 : 32;
    const int blocks = static_cast<int>((cols + block - 1) / block);
    // floats | int8 quants | float scales, each part 16-byte aligned.
    const std::size_t quants_at = (n * sizeof(float) + 15) / 16 * 16;
    const std::size_t scales_at = (quants_at + n + 15) / 16 * 16;
    auto* base = static_cast<std::byte*>(
        grow(act_buf_, scales_at + static_cast<std::size_t>(rows) * blocks * sizeof(float), "quantized activations"));
    auto* xq = reinterpret_cast<float*>(base);
    auto* quants = reinterpret_cast<std::int8_t*>(base + quants_at);
    auto* scales = reinterpret_cast<float*>(base + scales_at);
    check(kernels::quantize_activations_f32(x, xq, rows, static_cast<int>(cols), aq, stream_, quants, scales),
          "quantize_activations_f32", where_);
    q8_ = kernels::Q8Acts{quants, scales, static_cast<int>(cols), blocks, aq};
    return xq;
  }

  /// The GEMV configuration asked (FTP_GEMV_CONFIG) where it is built for
  /// weights of type dt, else the automatic one (the block types build
  /// fewer: kernels::matvec_config_built).
  kernels::MatvecConfig gemv_config(kernels::WeightDType dt) const {
    return kernels::matvec_config_built(gemv_config_, dt) ? gemv_config_ : kernels::MatvecConfig{};
  }

  /// Largest batch that takes the GEMV kernels (CudaBackendOptions::gemv_max_rows).
  int gemv_max_rows(kernels::WeightDType dt) const {
    if (gemv_max_rows_ >= 0) return gemv_max_rows_;
    return dt == kernels::WeightDType::f16 || dt == kernels::WeightDType::bf16 ? 2 : 8;
  }

  void* convert_activations(const float* x, std::size_t n, kernels::HalfType to) {
    void* xh = grow(half_buf_, n * 2, "f16/bf16 activations");
    check(kernels::convert_f32(x, xh, to, n, stream_), "convert_f32", where_);
    return xh;
  }

  void drop_graphs() noexcept {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  void release() noexcept {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    drop_graphs();
    for (auto& b : bufs_)
      if (b.p) cudaFree(b.p);
    for (DevBuf* b : {&layout_buf_, &half_buf_, &tile_buf_, &choice_buf_, &act_buf_})
      if (b->p) cudaFree(b->p);
    for (void* p : deferred_) cudaFree(p);
    deferred_.clear();
    if (kv_k_) cudaFree(kv_k_);
    if (kv_v_) cudaFree(kv_v_);
    if (cublas_) cublasDestroy(cublas_);
    if (cublas_ws_) cudaFree(cublas_ws_);
    for (auto& e : events_)
      if (e) cudaEventDestroy(e);
    for (auto& e : events_) e = nullptr;
    if (pinned_) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_cap_ = 0;
    if (stream_) cudaStreamDestroy(stream_);
    kv_k_ = kv_v_ = nullptr;
    cublas_ = nullptr;
    cublas_ws_ = nullptr;
    stream_ = nullptr;
    for (auto& b : bufs_) b = {};
    layout_buf_ = half_buf_ = tile_buf_ = choice_buf_ = act_buf_ = {};
    cudaGetLastError();
    if (prev >= 0) cudaSetDevice(prev);
  }

  const WeightStore& w_;
  const model::HParams& hp_;
  RankSpec spec_;
  int device_;
  std::string where_;
  std::shared_ptr<StageComm> comm_;
  std::shared_ptr<cuda::DeviceWeights> weights_;
  bool neox_ = false;                   // the model's RoPE pairs halves (qwen2, qwen3)
  const float* rope_freqs_ = nullptr;   // device copy of WeightStore::rope_freqs, or null
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  int gemv_max_rows_ = -1;
  kernels::MatvecConfig gemv_config_{};

  int kvh_ = 0;
  KvDtype kv_dtype_ = KvDtype::f16;
  kernels::KvElem kv_elem_ = kernels::KvElem::f16;
  std::size_t layer_bytes_ = 0;  // one layer's K (or V) pages
  std::uint64_t kv_bytes_ = 0;
  std::byte* kv_k_ = nullptr;
  std::byte* kv_v_ = nullptr;

  std::array<DevBuf, static_cast<std::size_t>(Buf::count)> bufs_{};
  DevBuf layout_buf_, half_buf_, tile_buf_, choice_buf_;
  DevBuf act_buf_;  // activations quantized for the block types (quantized())
  kernels::Q8Acts q8_{};  // their int8 quants and scales in act_buf_
  std::vector<float> host_choices_;  // temperature, top_p, draw of each row
  DevBuf logprob_buf_;                // choose_tokens' log-probabilities on the device
  std::vector<float> host_logprobs_;  // and on the host (the ids as their bits)
  bool timing_ = false;
  cudaEvent_t events_[4] = {};
  unsigned marked_ = 0;
  static constexpr std::size_t kPinnedFrom = 64 << 10;  // bytes
  float* pinned_ = nullptr;  // download staging (cudaMallocHost), grown as needed
  std::size_t pinned_cap_ = 0;  // floats
  std::vector<void*> deferred_;
  int* layout_dev_ = nullptr;
  std::vector<int> host_layout_;
  int rows_cap_ = 0, seq_cap_ = 0, bt_cap_ = 0;
  int n_rows_ = 0;
  bool decode_only_ = false;
  std::vector<int> logit_rows_;

  struct Pending {
    const float* x = nullptr;    // what the products read: src, or src quantized (act_buf_)
    const float* src = nullptr;  // the activations the products were asked with
    kernels::ActQuant act = kernels::ActQuant::none;
    int rows = 0;
    int n = 0;
    kernels::MatvecTarget t[kernels::kMaxMatvecTargets];
  } pending_;

  bool fuse_ = true;
  bool int8_dots_ = true;  // CudaBackendOptions::int8_dots
  struct Add {
    float* x = nullptr;
    const float* y = nullptr;
    std::size_t n = 0;
  } add_;
  struct Rope {
    float* v = nullptr;
    int n_heads = 0;
  } rope_[2];
  int rope_n_ = 0;

  bool graphs_on_ = false;
  bool capturing_ = false;
  std::vector<int> graph_batches_;
  std::map<int, cudaGraphExec_t> graphs_;
  std::uint64_t generation_ = 0, graph_generation_ = 0;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(CudaBackendOptions opts) : opts_(std::move(opts)) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
      cudaError_t e = cudaGetLastError();
      throw BackendError(std::string("cuda backend: no CUDA device visible (") + cudaGetErrorString(e) + ")");
    }
    n_devices_ = count;
    kernels::set_programmatic_launch(opts_.programmatic_launch);
  }
  std::string name() const override { return "cuda"; }

  std::vector<std::unique_ptr<RankBackend>> make_stage(const WeightStore& weights,
                                                       const std::vector<RankSpec>& specs) override {
    if (specs.empty()) throw InputError("cuda backend: a stage has at least one rank");
    cuda::check_kernel_dtypes(weights);
    std::vector<int> devices;
    for (const RankSpec& s : specs) {
      const int d = s.gpu < 0 ? 0 : s.gpu;
      if (d >= n_devices_)
        throw InputError("cuda backend: stage " + std::to_string(s.stage) + " rank " + std::to_string(s.rank) +
                         " asks for cuda:" + std::to_string(d) + ", " + std::to_string(n_devices_) + " visible");
      devices.push_back(d);
    }
    std::shared_ptr<StageComm> comm;
    if (specs.size() > 1) {
      std::vector<int> sorted = devices;
      std::sort(sorted.begin(), sorted.end());
      const bool one_gpu = sorted.front() == sorted.back();
      const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
      if (one_gpu) comm = std::make_shared<SameGpuComm>(static_cast<int>(specs.size()), devices[0]);
      else if (distinct) {
        nccl_used_ = true;
        comm = std::make_shared<NcclStageComm>(devices);
      }
      else
        throw InputError("cuda backend: stage " + std::to_string(specs[0].stage) +
                         " places several ranks on some GPUs but not all on one (supported: distinct GPUs, or one GPU)");
    }
    std::vector<std::unique_ptr<RankBackend>> ranks;
    for (std::size_t r = 0; r < specs.size(); ++r)
      ranks.push_back(std::make_unique<CudaRank>(weights, specs[r], devices[r], comm, opts_));
    return ranks;
  }

  std::map<int, std::uint64_t> make_resident(const WeightStore& weights,
                                             const std::map<int, std::vector<RankShard>>& shards) override {
    cuda::check_kernel_dtypes(weights);
    std::map<int, std::uint64_t> out;
    for (const auto& [device, sh] : shards) {
      if (device < 0 || device >= n_devices_)
        throw InputError("cuda backend: device cuda:" + std::to_string(device) + " is not visible (" +
                         std::to_string(n_devices_) + " CUDA devices)");
      auto dw = cuda::DeviceWeights::get(weights, device);
      dw->make_resident(sh);
      resident_.push_back(dw);  // held: the union stays while no domain is built yet
      out[device] = dw->bytes();
    }
    return out;
  }

  void prepare_communicators(const std::vector<std::vector<RankSpec>>& stages) override {
    // Every set of distinct GPUs a stage spans, split from the root
    // communicator now (ncclCommSplit); ranks sharing one GPU need none.
    // The root spans the union of the table's GPUs, and only them: NCCL's
    // contexts and buffers stay off the GPUs no gear uses. A table with no
    // such set needs no root (one made for an earlier table goes).
    std::vector<std::vector<int>> sets;
    std::vector<int> all;
    for (const auto& st : stages) {
      std::vector<int> devices;
      for (const RankSpec& s : st) devices.push_back(s.gpu < 0 ? 0 : s.gpu);
      all.insert(all.end(), devices.begin(), devices.end());
      std::vector<int> sorted = devices;
      std::sort(sorted.begin(), sorted.end());
      if (devices.size() > 1 && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) sets.push_back(devices);
    }
    if (sets.empty() && !nccl_used_) return;
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    nccl_used_ = true;
    comm::NcclPool& pool = comm::NcclPool::instance();
    pool.span(sets.empty() ? std::vector<int>{} : all);
    pool.prepare(sets);
  }

  CommunicatorStats communicator_stats() const override {
    // The pool is made on first use (ncclCommInitAll): not for a question.
    if (!nccl_used_) return {};
    const comm::NcclPool& pool = comm::NcclPool::instance();
    return {pool.communicators_made(), pool.made_ms()};
  }

  std::vector<std::string> communicator_devices() const override {
    if (!nccl_used_) return {};
    std::vector<std::string> out;
    for (int d : comm::NcclPool::instance().devices()) out.push_back("cuda:" + std::to_string(d));
    return out;
  }

  std::vector<int> warm_batch_sizes(int max_running) const override {
    // The graphs' batch sizes: a warm-up captures each (CudaRank::run_layers).
    if (opts_.graph_batches.empty()) return Backend::warm_batch_sizes(max_running);
    std::vector<int> out;
    for (int b : opts_.graph_batches)
      if (b >= 1 && b <= max_running) out.push_back(b);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  std::uint64_t graphs_captured() const override { return g_graph_captures.load(); }

  std::map<int, std::uint64_t> resident_bytes(const WeightStore& weights) const override {
    std::map<int, std::uint64_t> out;
    for (int d = 0; d < n_devices_; ++d) out[d] = cuda::DeviceWeights::get(weights, d)->bytes();
    return out;
  }

  std::uint64_t release_device(const WeightStore& weights, int device) override {
    if (device < 0 || device >= n_devices_) return 0;
    auto dw = cuda::DeviceWeights::get(weights, device);
    resident_.erase(std::remove(resident_.begin(), resident_.end(), dw), resident_.end());
    return dw->release();
  }

  std::vector<std::uint64_t> kv_room_bytes(const WeightStore& weights, const std::vector<RankSpec>& ranks) override {
    cuda::check_kernel_dtypes(weights);
    std::map<int, std::vector<RankShard>> spans;  // device -> what its ranks read
    std::map<int, int> ranks_on;
    for (const RankSpec& r : ranks) {
      const int device = r.gpu < 0 ? 0 : r.gpu;
      if (device >= n_devices_)
        throw InputError("cuda backend: device " + std::to_string(device) + " of stage " + std::to_string(r.stage) +
                         " rank " + std::to_string(r.rank) + " is not visible (" + std::to_string(n_devices_) +
                         " CUDA devices)");
      spans[device].push_back(RankShard{r.first_layer, r.n_layers, r.tp, r.rank, r.first_stage, r.last_stage});
      ++ranks_on[device];
    }
    std::map<int, std::uint64_t> share;
    for (const auto& [device, sp] : spans) {
      const std::string where = "cuda:" + std::to_string(device);
      cuda::DeviceGuard guard(device, where);
      // Missing first: weights another rank uploads between the two
      // readings then count as missing and free at once (room understated),
      // never as neither (room overstated).
      const std::uint64_t missing = cuda::DeviceWeights::get(weights, device)->missing_bytes(sp);
      std::size_t free_b = 0, total_b = 0;
      check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", where);
      const std::uint64_t room = free_b > missing ? free_b - missing : 0;
      share[device] = room / static_cast<std::uint64_t>(ranks_on[device]);
    }
    std::vector<std::uint64_t> out;
    for (const RankSpec& r : ranks) out.push_back(share[r.gpu < 0 ? 0 : r.gpu]);
    return out;
  }

 private:
  CudaBackendOptions opts_;
  int n_devices_ = 0;
  std::vector<std::shared_ptr<cuda::DeviceWeights>> resident_;  // make_resident's unions, kept
  std::atomic<bool> nccl_used_{false};  // the NCCL pool exists (a stage or prepare asked for it)
};

}  // namespace

Backend& cuda_backend() {
  static CudaBackend b(CudaBackendOptions::from_env());
  return b;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

double cuda_nccl_pool_create_ms() {
  try {
    return comm::NcclPool::instance().create_ms();
  } catch (const Error&) {
    return 0.0;
  }
}

}  // namespace ftp::engine
