// SPDX-License-Identifier: Apache-2.0
// Every kernel of kernels/ against the CPU: engine::ops where it has the
// operation, else a plain reference here. One line per kernel and case:
// NMSE <= 1e-6 where the kernel computes in float32, <= 1e-3 where it rounds
// to f16/bf16, exact for argmax, sampling, the KV write and the sums, and
// bit for bit the CPU's for the block types' decoding (embed_rows,
// dequant_tile) and the activation quantization; their GEMV against a
// float64 product over the CPU's dequantization (NMSE <= 1e-6).
// Plain main: exit 77 (skip) without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "hardware/gpu.hpp"
#include "engine/kv_cache.hpp"
#include "engine/ops.hpp"
#include "engine/quant_matmul.hpp"
#include "engine/sampler.hpp"
#include "model/quant.hpp"
#include "kernels/add.cuh"
#include "kernels/add_rmsnorm.cuh"
#include "kernels/argmax.cuh"
#include "kernels/attention_decode.cuh"
#include "kernels/attention_prefill.cuh"
#include "kernels/convert.cuh"
#include "kernels/dequant.cuh"
#include "kernels/embed.cuh"
#include "kernels/kv_write.cuh"
#include "kernels/logprobs.cuh"
#include "kernels/matvec.cuh"
#include "kernels/quantize_act.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope_kv_write.cuh"
#include "kernels/sample.cuh"
#include "kernels/silu_mul.cuh"
#include "kernels/sum_buffers.cuh"
#include "synthetic_gguf.hpp"
#include "gpu_tests.hpp"

namespace k = ftp::kernels;
using ftp::model::DType;

namespace {

int failures = 0;

void report(const std::string& what, double nmse, double limit) {
  const bool ok = nmse <= limit;
  std::printf("%-4s %-52s nmse=%.3g (limit %.0e)\n", ok ? "ok" : "FAIL", what.c_str(), nmse, limit);
  if (!ok) ++failures;
}

void report_exact(const std::string& what, std::size_t mismatches, std::size_t total) {
  std::printf("%-4s %-52s %zu/%zu equal\n", mismatches == 0 ? "ok" : "FAIL", what.c_str(), total - mismatches, total);
  if (mismatches) ++failures;
}

void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    if (!std::isfinite(got[i])) return INFINITY;
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

/// Device memory freed on scope exit.
template <class T>
class Dev {
 public:
  explicit Dev(std::size_t n) : n_(n) { cu(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void put(const std::vector<T>& h) { cu(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "H2D"); }
  std::vector<T> get() const {
    std::vector<T> h(n_);
    cu(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
  T* p() const { return p_; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

void done(cudaError_t launch, const char* what) {
  cu(launch, what);
  cu(cudaDeviceSynchronize(), what);
}

std::mt19937 rng(12345);
std::vector<float> randn(std::size_t n, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// A host weight tensor of any dtype with random values, and its device copy.
struct Tensor {
  std::vector<std::uint8_t> bytes;
  ftp::model::TensorView view;
};

Tensor make_tensor(DType dt, std::int64_t rows, std::int64_t cols) {
  Tensor t;
  const std::int64_t n = rows * cols;
  t.bytes.resize(ftp::model::dtype_bytes(dt, n));
  std::vector<float> v = randn(static_cast<std::size_t>(n), 0.5f);
  for (std::int64_t i = 0; i < n; ++i) {
    switch (dt) {
      case DType::f32: std::memcpy(&t.bytes[i * 4], &v[i], 4); break;
      case DType::f16: {
        std::uint16_t h = ftp::testing::f32_to_f16(v[i]);
        std::memcpy(&t.bytes[i * 2], &h, 2);
        break;
      }
      case DType::bf16: {
        std::uint16_t h = ftp::testing::f32_to_bf16(v[i]);
        std::memcpy(&t.bytes[i * 2], &h, 2);
        break;
      }
      default: break;  // block types: below
    }
  }
  if (dt != DType::q8_0 && ftp::model::dtype_block(dt) > 1)
    ftp::testing::random_blocks(dt, t.bytes.data(), n / ftp::model::dtype_block(dt), rng(), 0.5f);
  if (dt == DType::q8_0)
    for (std::int64_t b = 0; b < n / 32; ++b) {
      std::uint16_t d = ftp::testing::f32_to_f16(0.01f + 0.001f * static_cast<float>(b % 7));
      std::memcpy(&t.bytes[b * 34], &d, 2);
      for (int j = 0; j < 32; ++j)
        t.bytes[b * 34 + 2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(rng() % 255 - 127));
    }
  t.view.name = "w";
  t.view.dtype = dt;
  t.view.rows = rows;
  t.view.cols = cols;
  t.view.data = t.bytes.data();
  t.view.bytes = t.bytes.size();
  return t;
}

k::WeightDType kdt(DType d) {
  switch (d) {
    case DType::f32: return k::WeightDType::f32;
    case DType::f16: return k::WeightDType::f16;
    case DType::bf16: return k::WeightDType::bf16;
    case DType::q8_0: return k::WeightDType::q8_0;
    case DType::q4_0: return k::WeightDType::q4_0;
    case DType::q4_1: return k::WeightDType::q4_1;
    case DType::q5_0: return k::WeightDType::q5_0;
    case DType::q5_1: return k::WeightDType::q5_1;
    case DType::q2_k: return k::WeightDType::q2_k;
    case DType::q3_k: return k::WeightDType::q3_k;
    case DType::q4_k: return k::WeightDType::q4_k;
    case DType::q5_k: return k::WeightDType::q5_k;
    case DType::q6_k: return k::WeightDType::q6_k;
  }
  return k::WeightDType::f32;
}

const DType kDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::q8_0};
/// The block types (kernels/quant_blocks.cuh), Q4_K_M's first.
const DType kBlockTypes[] = {DType::q4_k, DType::q6_k, DType::q4_0, DType::q4_1, DType::q5_0,
                             DType::q5_1, DType::q2_k, DType::q3_k, DType::q5_k};

void test_embed() {
  for (DType dt : kDTypes) {
    Tensor t = make_tensor(dt, 50, 96);
    Dev<std::uint8_t> dw(t.bytes);
    std::vector<int> tokens = {0, 49, 7, 7, 23};
    Dev<int> dtok(tokens);
    Dev<float> dout(tokens.size() * 96);
    k::WeightView v{dw.p(), kdt(dt), 96, 0, 50, 0, 96};
    done(k::embed_rows(v, dtok.p(), static_cast<int>(tokens.size()), dout.p(), nullptr), "embed_rows");
    std::vector<float> want(tokens.size() * 96);
    for (std::size_t i = 0; i < tokens.size(); ++i) ftp::model::to_f32(t.view, tokens[i] * 96, 96, &want[i * 96]);
    report(std::string("embed_rows ") + ftp::model::dtype_name(dt), nmse(dout.get(), want), 1e-6);
  }
}

void test_rmsnorm() {
  for (int n : {300, 4096}) {
    const int t = 5;
    auto x = randn(static_cast<std::size_t>(t) * n), w = randn(n);
    Dev<float> dx(x), dw(w), dout(x.size());
    done(k::rmsnorm_f32(dx.p(), dw.p(), dout.p(), t, n, 1e-5f, nullptr), "rmsnorm_f32");
    std::vector<float> want(x.size());
    for (int r = 0; r < t; ++r) ftp::engine::ops::rmsnorm(&x[r * n], w.data(), &want[r * n], n, 1e-5f);
    report("rmsnorm_f32 n=" + std::to_string(n), nmse(dout.get(), want), 1e-6);
  }
}

void test_add_rmsnorm() {
  const int t = 3, n = 4096;
  auto x = randn(static_cast<std::size_t>(t) * n), y = randn(x.size()), w = randn(n);
  Dev<float> dx(x), dy(y), dw(w), dout(x.size());
  done(k::add_rmsnorm_f32(dx.p(), dy.p(), dw.p(), dout.p(), t, n, 1e-5f, nullptr), "add_rmsnorm_f32");
  std::vector<float> sum(x.size()), want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + y[i];
  for (int r = 0; r < t; ++r) ftp::engine::ops::rmsnorm(&sum[r * n], w.data(), &want[r * n], n, 1e-5f);
  report("add_rmsnorm_f32 n=4096: the normed sum", nmse(dout.get(), want), 1e-6);
  std::vector<float> got_sum = dx.get();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < sum.size(); ++i) bad += got_sum[i] != sum[i];
  report_exact("add_rmsnorm_f32 n=4096: x holds the sum", bad, sum.size());
}

/// RoPE variants the kernels take: llama's adjacent pairs or NEOX halves,
/// with or without Llama 3 frequency factors (n_rot / 2 of them).
struct RopeMode {
  ftp::model::RopeType type;
  bool factors;
  std::string name() const {
    return std::string(type == ftp::model::RopeType::neox ? "neox" : "norm") + (factors ? "+freq_factors" : "");
  }
};
const RopeMode kRopeModes[] = {{ftp::model::RopeType::norm, false},
                               {ftp::model::RopeType::neox, false},
                               {ftp::model::RopeType::norm, true},
                               {ftp::model::RopeType::neox, true}};

/// Llama-3-like factors: 1 for the fast pairs, up to 8 for the slow ones.
std::vector<float> rope_factors(int n_rot) {
  std::vector<float> f(static_cast<std::size_t>(n_rot / 2));
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + 7.0f * static_cast<float>(i) / static_cast<float>(f.size());
  return f;
}

/// rope of q and k and the KV write in one launch, against ops::rope and
/// KvStore's layout; n_rot < head_dim leaves dimensions unrotated.
void test_rope_kv_write() {
  const int nq = 4, nkv = 2, hd = 16, n_rot = 12, B = 4, n_blocks = 6;
  std::vector<int> pos = {0, 5, 6, 300}, slots = {9, 2, 3, 20};
  const int t = static_cast<int>(pos.size());
  for (const RopeMode& mode : kRopeModes) {
    auto q = randn(static_cast<std::size_t>(t) * nq * hd), kx = randn(static_cast<std::size_t>(t) * nkv * hd),
         vx = randn(static_cast<std::size_t>(t) * nkv * hd);
    const std::size_t page_floats = static_cast<std::size_t>(n_blocks) * nkv * B * hd;
    const std::vector<float> ff = rope_factors(n_rot);
    Dev<float> dq(q), dk(kx), dv(vx), dkp(page_floats), dvp(page_floats), dff(ff);
    Dev<int> dpos(pos), dslots(slots);
    const bool neox = mode.type == ftp::model::RopeType::neox;
    const float* factors = mode.factors ? ff.data() : nullptr;
    cu(cudaMemset(dkp.p(), 0, page_floats * 4), "memset");
    cu(cudaMemset(dvp.p(), 0, page_floats * 4), "memset");
    done(k::rope_kv_write_f32(dq.p(), nq, dk.p(), dv.p(), nkv, t, hd, n_rot, dpos.p(), 10000.0f, neox,
                              mode.factors ? dff.p() : nullptr, dkp.p(), dvp.p(), B, dslots.p(), nullptr),
         "rope_kv_write_f32");
    std::vector<float> wq = q, wk = kx, wkp(page_floats, 0.0f), wvp(page_floats, 0.0f);
    for (int r = 0; r < t; ++r) {
      ftp::engine::ops::rope(&wq[static_cast<std::size_t>(r) * nq * hd], nq, hd, n_rot, pos[r], 10000.0f, mode.type,
                             factors);
      ftp::engine::ops::rope(&wk[static_cast<std::size_t>(r) * nkv * hd], nkv, hd, n_rot, pos[r], 10000.0f, mode.type,
                             factors);
      const int blk = slots[r] / B, slot = slots[r] % B;
      for (int h = 0; h < nkv; ++h)
        for (int d = 0; d < hd; ++d) {
          const std::size_t dst = ((static_cast<std::size_t>(blk) * nkv + h) * B + slot) * hd + d;
          wkp[dst] = wk[(static_cast<std::size_t>(r) * nkv + h) * hd + d];
          wvp[dst] = vx[(static_cast<std::size_t>(r) * nkv + h) * hd + d];
        }
    }
    const std::string m = "rope_kv_write_f32 " + mode.name();
    report(m + ": q rotated", nmse(dq.get(), wq), 1e-6);
    report(m + ": k rotated", nmse(dk.get(), wk), 1e-6);
    report(m + ": K pages", nmse(dkp.get(), wkp), 1e-6);
    std::vector<float> gv = dvp.get();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < page_floats; ++i) bad += gv[i] != wvp[i];
    report_exact(m + ": V pages", bad, page_floats);
  }
}

void test_rope() {
  const int heads = 6, hd = 16, ld = heads * hd + 8;
  for (const RopeMode& mode : kRopeModes)
    for (int n_rot : {16, 12}) {
      std::vector<int> pos = {0, 1, 17, 1000, 4095};
      const int t = static_cast<int>(pos.size());
      auto v = randn(static_cast<std::size_t>(t) * ld);
      const std::vector<float> ff = rope_factors(n_rot);
      Dev<float> dv(v), dff(ff);
      Dev<int> dpos(pos);
      done(k::rope_f32(dv.p(), ld, t, heads, hd, n_rot, dpos.p(), 10000.0f, mode.type == ftp::model::RopeType::neox,
                       mode.factors ? dff.p() : nullptr, nullptr),
           "rope_f32");
      std::vector<float> want = v;
      for (int r = 0; r < t; ++r)
        ftp::engine::ops::rope(&want[r * ld], heads, hd, n_rot, pos[r], 10000.0f, mode.type,
                               mode.factors ? ff.data() : nullptr);
      report("rope_f32 " + mode.name() + " n_rot=" + std::to_string(n_rot) + " pos<=4095", nmse(dv.get(), want), 1e-6);
    }
}

/// The q/k/v bias add over rows, exactly.
void test_add_bias() {
  const int t = 5, n = 96;
  auto x = randn(static_cast<std::size_t>(t) * n), b = randn(static_cast<std::size_t>(n));
  Dev<float> dx(x), db(b);
  done(k::add_bias_f32(dx.p(), db.p(), t, n, nullptr), "add_bias_f32");
  std::vector<float> want = x;
  for (int r = 0; r < t; ++r)
    for (int i = 0; i < n; ++i) want[static_cast<std::size_t>(r) * n + i] += b[static_cast<std::size_t>(i)];
  std::vector<float> got = dx.get();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
  report_exact("add_bias_f32", bad, want.size());
}

void test_elementwise() {
  const std::size_t n = 100003;
  auto g = randn(n, 3.0f), u = randn(n);
  Dev<float> dg(g), du(u);
  done(k::silu_mul_f32(dg.p(), du.p(), n, nullptr), "silu_mul_f32");
  std::vector<float> want = g;
  ftp::engine::ops::silu_mul(want.data(), u.data(), n);
  report("silu_mul_f32 n=100003", nmse(dg.get(), want), 1e-6);

  Dev<float> dx(g);
  done(k::add_f32(dx.p(), du.p(), n, nullptr), "add_f32");
  std::vector<float> got = dx.get();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += got[i] != g[i] + u[i];
  report_exact("add_f32 n=100003", bad, n);

  std::vector<Dev<float>*> bufs;
  std::vector<std::vector<float>> host;
  for (int j = 0; j < 3; ++j) {
    host.push_back(randn(n));
    bufs.push_back(new Dev<float>(host.back()));
  }
  float* ptrs[3] = {bufs[0]->p(), bufs[1]->p(), bufs[2]->p()};
  done(k::sum_buffers_f32(ptrs, 3, n, nullptr), "sum_buffers_f32");
  bad = 0;
  for (int j = 0; j < 3; ++j) {
    std::vector<float> r = bufs[static_cast<std::size_t>(j)]->get();
    for (std::size_t i = 0; i < n; ++i) bad += r[i] != (host[0][i] + host[1][i]) + host[2][i];
  }
  for (auto* b : bufs) delete b;
  report_exact("sum_buffers_f32 3 buffers (rank order)", bad, 3 * n);

  for (auto to : {k::HalfType::f16, k::HalfType::bf16}) {
    Dev<float> din(g);
    Dev<std::uint16_t> dh(n);
    done(k::convert_f32(din.p(), dh.p(), to, n, nullptr), "convert_f32");
    std::vector<std::uint16_t> h = dh.get();
    ftp::model::TensorView tv{"x", to == k::HalfType::f16 ? DType::f16 : DType::bf16, 1, static_cast<std::int64_t>(n),
                              h.data(), n * 2};
    std::vector<float> back(n);
    ftp::model::to_f32(tv, 0, static_cast<std::int64_t>(n), back.data());
    report(std::string("convert_f32 -> ") + (to == k::HalfType::f16 ? "f16" : "bf16"), nmse(back, g), 1e-3);
  }
}

void test_matvec() {
  // Enough rows for the two-rows-per-warp path (rows / 2 >= 16 x SMs), odd.
  int sms = 0;
  cu(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "multiprocessor count");
  const std::int64_t R = 32 * static_cast<std::int64_t>(sms) + 45, C = 512;
  struct Case {
    const char* name;
    std::int64_t r0, rows, c0, cols;
  };
  const Case cases[] = {{"full", 0, R, 0, C},
                        {"rows 5..R-2 (column-parallel, odd count)", 5, R - 7, 0, C},
                        {"cols 256..512 (row-parallel)", 0, R, 256, 256},
                        {"cols 3..484 (unaligned: scalar path)", 0, R, 3, 481}};
  for (DType dt : kDTypes) {
    Tensor w = make_tensor(dt, R, C);
    Dev<std::uint8_t> dw(w.bytes);
    for (const Case& c : cases) {
      for (int t : {1, 2, 3, 5, 8, 13}) {
        auto x = randn(static_cast<std::size_t>(t) * c.cols);
        Dev<float> dx(x), dout(static_cast<std::size_t>(t) * c.rows);
        k::WeightView v{dw.p(), kdt(dt), C, c.r0, c.rows, c.c0, c.cols};
        done(k::matvec(dx.p(), static_cast<int>(c.cols), v, dout.p(), static_cast<int>(c.rows), t, nullptr), "matvec");
        std::vector<float> want(static_cast<std::size_t>(t) * c.rows);
        ftp::engine::MatView mv{&w.view, c.r0, c.rows, c.c0, c.cols};
        ftp::engine::ops::matmul_reference(x.data(), mv, want.data(), t);
        report(std::string("matvec ") + ftp::model::dtype_name(dt) + " " + c.name + " t=" + std::to_string(t),
               nmse(dout.get(), want), 1e-6);
      }
    }
  }
}

/// Every built GEMV configuration (rows per row group x warps per group)
/// against the reference: a view of odd rows starting at row 5, batches
/// across the pass widths, and three targets in one launch; a configuration
/// that is not built is refused.
void test_matvec_configs() {
  const k::MatvecConfig configs[] = {{1, 1}, {2, 1}, {1, 4}, {2, 4}, {4, 4}, {8, 4}};
  // 768 columns: one step of the column loop per lane or less; 4160: several
  // (the unrolled body, a partial last step).
  for (const std::int64_t C : {std::int64_t{768}, std::int64_t{4160}}) {
    const std::int64_t R = 333;
    for (DType dt : kDTypes) {
      Tensor w = make_tensor(dt, R, C);
      Dev<std::uint8_t> dw(w.bytes);
      for (const k::MatvecConfig& c : configs) {
        double worst = 0;
        for (int t : {1, 2, 3, 4, 7, 8, 13}) {
          auto x = randn(static_cast<std::size_t>(t) * C);
          Dev<float> dx(x);
          // Rows 5..R-2 in one product; rows 0..99, 100..199, 200..332 as three targets.
          const std::int64_t rows = R - 7;
          Dev<float> dout(static_cast<std::size_t>(t) * rows);
          // NaN first: an output the kernel misses cannot keep an earlier
          // configuration's correct value from the same allocation.
          cu(cudaMemset(dout.p(), 0xff, static_cast<std::size_t>(t) * rows * sizeof(float)), "memset");
          done(k::matvec(dx.p(), static_cast<int>(C), k::WeightView{dw.p(), kdt(dt), C, 5, rows, 0, C}, dout.p(),
                         static_cast<int>(rows), t, nullptr, c),
               "matvec (config)");
          std::vector<float> want(static_cast<std::size_t>(t) * rows);
          ftp::engine::MatView mv{&w.view, 5, rows, 0, C};
          ftp::engine::ops::matmul_reference(x.data(), mv, want.data(), t);
          worst = std::max(worst, nmse(dout.get(), want));
          const std::int64_t r0[3] = {0, 100, 200}, n[3] = {100, 100, R - 200};
          std::vector<std::unique_ptr<Dev<float>>> outs;
          k::MatvecTarget targets[3];
          for (int j = 0; j < 3; ++j) {
            outs.push_back(std::make_unique<Dev<float>>(static_cast<std::size_t>(t) * n[j]));
            cu(cudaMemset(outs.back()->p(), 0xff, static_cast<std::size_t>(t) * n[j] * sizeof(float)), "memset");
            targets[j] = {k::WeightView{dw.p(), kdt(dt), C, r0[j], n[j], 0, C}, outs.back()->p(), static_cast<int>(n[j])};
          }
          done(k::matvec_multi(dx.p(), static_cast<int>(C), targets, 3, t, nullptr, c), "matvec_multi (config)");
          for (int j = 0; j < 3; ++j) {
            std::vector<float> want_j(static_cast<std::size_t>(t) * n[j]);
            ftp::engine::MatView mj{&w.view, r0[j], n[j], 0, C};
            ftp::engine::ops::matmul_reference(x.data(), mj, want_j.data(), t);
            worst = std::max(worst, nmse(outs[static_cast<std::size_t>(j)]->get(), want_j));
          }
        }
        report(std::string("matvec config ") + std::to_string(c.rows_per_warp) + "x" + std::to_string(c.warps_per_row) + " " +
                   ftp::model::dtype_name(dt) + " " + std::to_string(C) + " cols t=1..13, 1 and 3 targets",
               worst, 1e-6);
      }
    }
  }
  // Not built: refused, nothing launched.
  const std::int64_t R = 333, C = 768;
  Dev<float> dx(static_cast<std::size_t>(C)), dout(static_cast<std::size_t>(R));
  const cudaError_t e = k::matvec(dx.p(), static_cast<int>(C), k::WeightView{nullptr, k::WeightDType::f32, C, 0, R, 0, C},
                                  dout.p(), static_cast<int>(R), 1, nullptr, k::MatvecConfig{8, 1});
  report_exact("matvec config 8x1 (not built) refused", e == cudaErrorInvalidValue ? 0 : 1, 1);
}

/// q, k, v of one activation in one launch: row ranges of three tensors
/// (the small ones share the grid with the large one), each against the
/// reference, for every dtype and batch size.
void test_matvec_multi() {
  const std::int64_t C = 256;
  const std::int64_t R[3] = {512, 128, 128};
  for (DType dt : kDTypes) {
    std::vector<Tensor> w;
    std::vector<std::unique_ptr<Dev<std::uint8_t>>> dw;
    for (std::int64_t r : R) {
      w.push_back(make_tensor(dt, r, C));
      dw.push_back(std::make_unique<Dev<std::uint8_t>>(w.back().bytes));
    }
    for (int t : {1, 5}) {
      auto x = randn(static_cast<std::size_t>(t) * C);
      Dev<float> dx(x);
      std::vector<std::unique_ptr<Dev<float>>> outs;
      k::MatvecTarget targets[3];
      for (int j = 0; j < 3; ++j) {
        // Rank 1 of TP 2: the second half of each tensor's rows.
        const std::int64_t rows = R[j] / 2;
        outs.push_back(std::make_unique<Dev<float>>(static_cast<std::size_t>(t) * rows));
        targets[j] = {k::WeightView{dw[j]->p(), kdt(dt), C, rows, rows, 0, C}, outs.back()->p(), static_cast<int>(rows)};
      }
      done(k::matvec_multi(dx.p(), static_cast<int>(C), targets, 3, t, nullptr), "matvec_multi");
      double worst = 0;
      for (int j = 0; j < 3; ++j) {
        const std::int64_t rows = R[j] / 2;
        std::vector<float> want(static_cast<std::size_t>(t) * rows);
        ftp::engine::MatView mv{&w[j].view, rows, rows, 0, C};
        ftp::engine::ops::matmul_reference(x.data(), mv, want.data(), t);
        worst = std::max(worst, nmse(outs[j]->get(), want));
      }
      report(std::string("matvec_multi ") + ftp::model::dtype_name(dt) + " q,k,v rows of rank 1 t=" + std::to_string(t),
             worst, 1e-6);
    }
  }
}

void test_dequant() {
  const std::int64_t R = 64, C = 256;
  for (DType dt : {DType::q8_0, DType::f16, DType::bf16, DType::f32}) {
    Tensor w = make_tensor(dt, R, C);
    Dev<std::uint8_t> dw(w.bytes);
    for (auto to : {k::HalfType::f16, k::HalfType::bf16}) {
      // A column-parallel slice of rows 8..56, tile rows 4..36 of it.
      k::WeightView v{dw.p(), kdt(dt), C, 8, 48, 0, C};
      Dev<std::uint16_t> dt16(32 * C);
      done(k::dequant_tile(v, 4, 32, dt16.p(), to, nullptr), "dequant_tile");
      std::vector<std::uint16_t> h = dt16.get();
      ftp::model::TensorView tv{"t", to == k::HalfType::f16 ? DType::f16 : DType::bf16, 32, C, h.data(), h.size() * 2};
      std::vector<float> got(32 * C), want(32 * C);
      ftp::model::to_f32(tv, 0, 32 * C, got.data());
      ftp::model::to_f32(w.view, 12 * C, 32 * C, want.data());
      report(std::string("dequant_tile ") + ftp::model::dtype_name(dt) + " -> " + (to == k::HalfType::f16 ? "f16" : "bf16"),
             nmse(got, want), 1e-3);
      // A row-parallel view: columns 16..C (a Q8_0 view starting mid-block).
      const std::int64_t c0 = 16, cols = C - c0;
      k::WeightView vr{dw.p(), kdt(dt), C, 8, 48, c0, cols};
      done(k::dequant_tile(vr, 4, 32, dt16.p(), to, nullptr), "dequant_tile");
      h = dt16.get();
      ftp::model::TensorView tr{"t", to == k::HalfType::f16 ? DType::f16 : DType::bf16, 32, cols, h.data(), h.size() * 2};
      std::vector<float> got_r(static_cast<std::size_t>(32 * cols)), want_r(static_cast<std::size_t>(32 * cols)), row(C);
      ftp::model::to_f32(tr, 0, 32 * cols, got_r.data());
      for (int i = 0; i < 32; ++i) {
        ftp::model::to_f32(w.view, (12 + i) * C, C, row.data());
        std::copy(row.begin() + c0, row.end(), want_r.begin() + static_cast<std::ptrdiff_t>(i) * cols);
      }
      report(std::string("dequant_tile ") + ftp::model::dtype_name(dt) + " cols 16.. -> " +
                 (to == k::HalfType::f16 ? "f16" : "bf16"),
             nmse(got_r, want_r), 1e-3);
    }
  }
}

// ---------------------------------------------------------------------------
// The block types (Q4_0 .. Q6_K): every kernel against the CPU's
// model::quant::dequantize (ggml's reference, bit for bit).

/// Bits equal (the device decodes each weight as ggml does).
std::size_t bit_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
  return bad;
}

/// Rows [r0, r0 + rows) x columns [c0, c0 + cols) of a tensor, dequantized
/// on the CPU (whole rows, then the columns).
std::vector<float> dequantized(const Tensor& w, std::int64_t r0, std::int64_t rows, std::int64_t c0, std::int64_t cols) {
  const std::int64_t C = w.view.cols;
  std::vector<float> row(static_cast<std::size_t>(C)), out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i) {
    ftp::model::to_f32(w.view, (r0 + i) * C, C, row.data());
    std::copy(row.begin() + c0, row.begin() + c0 + cols, out.begin() + i * cols);
  }
  return out;
}

/// out[u][i] = x[u] . W[i] in double over the dequantized weights.
std::vector<float> gemv_ref(const std::vector<float>& x, const std::vector<float>& w, int t, std::int64_t rows,
                            std::int64_t cols) {
  std::vector<float> out(static_cast<std::size_t>(t * rows));
  for (int u = 0; u < t; ++u)
    for (std::int64_t i = 0; i < rows; ++i) {
      double s = 0;
      for (std::int64_t j = 0; j < cols; ++j) s += static_cast<double>(x[u * cols + j]) * w[i * cols + j];
      out[u * rows + i] = static_cast<float>(s);
    }
  return out;
}

/// embed_rows of block-type tables: the rows bit for bit as the CPU
/// dequantizes them; a vocabulary-parallel view (rows 20..39 as ids
/// 20..39) gives zeros for the ids outside it.
void test_embed_blocks() {
  for (DType dt : kBlockTypes) {
    const std::int64_t C = 512;
    Tensor t = make_tensor(dt, 50, C);
    Dev<std::uint8_t> dw(t.bytes);
    std::vector<int> tokens = {0, 49, 7, 7, 23, 20, 39};
    Dev<int> dtok(tokens);
    Dev<float> dout(tokens.size() * C);
    done(k::embed_rows(k::WeightView{dw.p(), kdt(dt), C, 0, 50, 0, C}, dtok.p(), static_cast<int>(tokens.size()),
                       dout.p(), nullptr),
         "embed_rows");
    std::vector<float> want(tokens.size() * C);
    for (std::size_t i = 0; i < tokens.size(); ++i) ftp::model::to_f32(t.view, tokens[i] * C, C, &want[i * C]);
    report_exact(std::string("embed_rows ") + ftp::model::dtype_name(dt) + " (bits of ggml's dequantization)",
                 bit_mismatches(dout.get(), want), want.size());
    done(k::embed_rows(k::WeightView{dw.p(), kdt(dt), C, 20, 20, 0, C}, dtok.p(), static_cast<int>(tokens.size()),
                       dout.p(), nullptr, 20),
         "embed_rows (vocabulary slice)");
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 20 || tokens[i] >= 40) std::fill(want.begin() + i * C, want.begin() + (i + 1) * C, 0.0f);
    report_exact(std::string("embed_rows ") + ftp::model::dtype_name(dt) + " rows 20..39 (others zero)",
                 bit_mismatches(dout.get(), want), want.size());
  }
}

/// dequant_tile of block types: each weight of ggml's dequantization
/// rounded once to f16 / bf16, bit for bit (the writer's rounding, round to
/// nearest even), for a column-parallel slice and a row-parallel view that
/// starts one block in; a view that starts inside a block is refused.
void test_dequant_blocks() {
  for (DType dt : kBlockTypes) {
    const std::int64_t R = 64, B = ftp::model::dtype_block(dt), C = 4 * B;
    Tensor w = make_tensor(dt, R, C);
    Dev<std::uint8_t> dw(w.bytes);
    for (auto to : {k::HalfType::f16, k::HalfType::bf16}) {
      for (const std::int64_t c0 : {std::int64_t{0}, B}) {
        const std::int64_t cols = C - c0;
        k::WeightView v{dw.p(), kdt(dt), C, 8, 48, c0, cols};
        Dev<std::uint16_t> dt16(static_cast<std::size_t>(32 * cols));
        done(k::dequant_tile(v, 4, 32, dt16.p(), to, nullptr), "dequant_tile");
        const std::vector<std::uint16_t> got = dt16.get();
        const std::vector<float> want = dequantized(w, 12, 32, c0, cols);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < want.size(); ++i)
          bad += got[i] != (to == k::HalfType::f16 ? ftp::testing::f32_to_f16(want[i]) : ftp::testing::f32_to_bf16(want[i]));
        report_exact(std::string("dequant_tile ") + ftp::model::dtype_name(dt) + (c0 ? " cols from one block" : "") +
                         " -> " + (to == k::HalfType::f16 ? "f16" : "bf16") + " (the CPU's values, rounded)",
                     bad, want.size());
      }
    }
    Dev<std::uint16_t> dt16(static_cast<std::size_t>(R * C));
    const cudaError_t e = k::dequant_tile(k::WeightView{dw.p(), kdt(dt), C, 0, R, 16, C - 16}, 0, 4, dt16.p(),
                                          k::HalfType::bf16, nullptr);
    report_exact(std::string("dequant_tile ") + ftp::model::dtype_name(dt) + " view inside a block refused",
                 e == cudaErrorInvalidValue ? 0 : 1, 1);
  }
}

/// quantize_activations_f32 against engine::ops::quantize_activations,
/// bit for bit: Q8_0 (legacy types) and Q8_K (K-quants), rows of 4096, of
/// 300 (a short last block) and of 64, with a block of zeros, ties of +a
/// and -a (Q8_K takes the first), and tiny values.
void test_quantize_activations() {
  for (DType w : {DType::q4_0, DType::q4_k}) {
    const k::ActQuant kind = k::act_quant_of(kdt(w));
    for (int kk : {4096, 300, 64}) {
      const int t = 5;
      std::vector<float> x = randn(static_cast<std::size_t>(t) * kk, 2.0f);
      std::fill(x.begin(), x.begin() + std::min(kk, 256), 0.0f);
      if (kk >= 300) {
        x[kk + 3] = -9.0f, x[kk + 7] = 9.0f;
        x[kk + 256 + 1] = 9.5f, x[kk + 256 + 30] = -9.5f;
      }
      for (int j = 0; j < kk; ++j) x[static_cast<std::size_t>(2 * kk + j)] *= 1e-30f;
      Dev<float> dx(x), dout(x.size());
      done(k::quantize_activations_f32(dx.p(), dout.p(), t, kk, kind, nullptr), "quantize_activations_f32");
      std::vector<float> want(x.size());
      ftp::engine::ops::quantize_activations(w, x.data(), t, kk, want.data());
      report_exact(std::string("quantize_activations_f32 ") + (kind == k::ActQuant::q8_k ? "Q8_K" : "Q8_0") + " k=" +
                       std::to_string(kk) + " (the CPU's values)",
                   bit_mismatches(dout.get(), want), want.size());
    }
  }
}

/// The block-type GEMV against a float64 product over the CPU's
/// dequantization (the kernel sums in float32: NMSE <= 1e-6, as the float
/// paths): whole matrices, a column-parallel row range, a row-parallel
/// column range from the second block, batches 1-13; every built
/// configuration with three targets in one launch; a Q4_K_M-like group
/// (Q4_K, Q4_K, Q6_K: one launch per dtype); and the refusals (a view
/// inside a block, a configuration not built for the block types).
void test_matvec_blocks() {
  int sms = 0;
  cu(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "multiprocessor count");
  const std::int64_t R = 8 * static_cast<std::int64_t>(sms) + 45;
  for (DType dt : kBlockTypes) {
    const std::int64_t B = ftp::model::dtype_block(dt), C = B == 256 ? 1280 : 544;
    Tensor w = make_tensor(dt, R, C);
    Dev<std::uint8_t> dw(w.bytes);
    struct Case {
      const char* name;
      std::int64_t r0, rows, c0, cols;
    };
    const Case cases[] = {{"full", 0, R, 0, C},
                          {"rows 5..R-2 (column-parallel, odd count)", 5, R - 7, 0, C},
                          {"cols from block 1 (row-parallel)", 0, R, B, C - B}};
    for (const Case& c : cases) {
      const std::vector<float> wf = dequantized(w, c.r0, c.rows, c.c0, c.cols);
      double worst = 0;
      for (int t : {1, 2, 3, 5, 8, 13}) {
        auto x = randn(static_cast<std::size_t>(t) * c.cols);
        Dev<float> dx(x), dout(static_cast<std::size_t>(t) * c.rows);
        cu(cudaMemset(dout.p(), 0xff, static_cast<std::size_t>(t) * c.rows * sizeof(float)), "memset");
        done(k::matvec(dx.p(), static_cast<int>(c.cols), k::WeightView{dw.p(), kdt(dt), C, c.r0, c.rows, c.c0, c.cols},
                       dout.p(), static_cast<int>(c.rows), t, nullptr),
             "matvec");
        worst = std::max(worst, nmse(dout.get(), gemv_ref(x, wf, t, c.rows, c.cols)));
      }
      report(std::string("matvec ") + ftp::model::dtype_name(dt) + " " + c.name + " t=1..13", worst, 1e-6);
    }
    // Every configuration built for the block types, three targets at once.
    const std::vector<float> wf = dequantized(w, 0, R, 0, C);
    for (const k::MatvecConfig cfg : {k::MatvecConfig{1, 4}, k::MatvecConfig{2, 4}, k::MatvecConfig{4, 4}}) {
      double worst = 0;
      for (int t : {1, 4, 7}) {
        auto x = randn(static_cast<std::size_t>(t) * C);
        Dev<float> dx(x);
        const std::int64_t r0[3] = {0, 100, 200}, n[3] = {100, 100, R - 200};
        std::vector<std::unique_ptr<Dev<float>>> outs;
        k::MatvecTarget targets[3];
        for (int j = 0; j < 3; ++j) {
          outs.push_back(std::make_unique<Dev<float>>(static_cast<std::size_t>(t) * n[j]));
          cu(cudaMemset(outs.back()->p(), 0xff, static_cast<std::size_t>(t) * n[j] * sizeof(float)), "memset");
          targets[j] = {k::WeightView{dw.p(), kdt(dt), C, r0[j], n[j], 0, C}, outs.back()->p(), static_cast<int>(n[j])};
        }
        done(k::matvec_multi(dx.p(), static_cast<int>(C), targets, 3, t, nullptr, cfg), "matvec_multi (config)");
        const std::vector<float> all = gemv_ref(x, wf, t, R, C);
        for (int j = 0; j < 3; ++j) {
          std::vector<float> want(static_cast<std::size_t>(t) * n[j]);
          for (int u = 0; u < t; ++u)
            std::copy(all.begin() + u * R + r0[j], all.begin() + u * R + r0[j] + n[j], want.begin() + u * n[j]);
          worst = std::max(worst, nmse(outs[static_cast<std::size_t>(j)]->get(), want));
        }
      }
      report(std::string("matvec config ") + std::to_string(cfg.rows_per_warp) + "x" + std::to_string(cfg.warps_per_row) +
                 " " + ftp::model::dtype_name(dt) + " t=1,4,7, 3 targets",
             worst, 1e-6);
    }
    Dev<float> dx(static_cast<std::size_t>(C)), dout(static_cast<std::size_t>(R));
    const cudaError_t inside = k::matvec(dx.p(), static_cast<int>(C - 16), k::WeightView{dw.p(), kdt(dt), C, 0, R, 16, C - 16},
                                         dout.p(), static_cast<int>(R), 1, nullptr);
    const cudaError_t config = k::matvec(dx.p(), static_cast<int>(C), k::WeightView{dw.p(), kdt(dt), C, 0, R, 0, C},
                                         dout.p(), static_cast<int>(R), 1, nullptr, k::MatvecConfig{1, 1});
    report_exact(std::string("matvec ") + ftp::model::dtype_name(dt) + " view inside a block, config 1x1: refused",
                 (inside == cudaErrorInvalidValue ? 0 : 1) + (config == cudaErrorInvalidValue ? 0 : 1), 2);
  }
  // A Q4_K_M layer's q, k, v: Q4_K, Q4_K and Q6_K asked in one call.
  const std::int64_t C = 1024;
  const std::int64_t rows[3] = {512, 128, 128};
  const DType types[3] = {DType::q4_k, DType::q4_k, DType::q6_k};
  std::vector<Tensor> ws;
  std::vector<std::unique_ptr<Dev<std::uint8_t>>> dws;
  for (int j = 0; j < 3; ++j) {
    ws.push_back(make_tensor(types[j], rows[j], C));
    dws.push_back(std::make_unique<Dev<std::uint8_t>>(ws.back().bytes));
  }
  double worst = 0;
  for (int t : {1, 3}) {
    auto x = randn(static_cast<std::size_t>(t) * C);
    Dev<float> dx(x);
    std::vector<std::unique_ptr<Dev<float>>> outs;
    k::MatvecTarget targets[3];
    for (int j = 0; j < 3; ++j) {
      outs.push_back(std::make_unique<Dev<float>>(static_cast<std::size_t>(t) * rows[j]));
      targets[j] = {k::WeightView{dws[j]->p(), kdt(types[j]), C, 0, rows[j], 0, C}, outs.back()->p(),
                    static_cast<int>(rows[j])};
    }
    done(k::matvec_multi(dx.p(), static_cast<int>(C), targets, 3, t, nullptr), "matvec_multi (Q4_K, Q4_K, Q6_K)");
    for (int j = 0; j < 3; ++j)
      worst = std::max(worst, nmse(outs[static_cast<std::size_t>(j)]->get(),
                                   gemv_ref(x, dequantized(ws[j], 0, rows[j], 0, C), t, rows[j], C)));
  }
  report("matvec_multi Q4_K, Q4_K, Q6_K (q, k, v of Q4_K_M) t=1,3", worst, 1e-6);
}

/// The integer-dot GEMV (every block type, with the activations' int8
/// quants and scales from quantize_activations_f32) against a float64
/// product of the CPU's quantized activations (ops::quantize_activations)
/// and its dequantized weights, NMSE <= 1e-6: whole matrices, a row-parallel
/// view from block 1 (its activations quantized from the view's first
/// column, as the backend does), batches 1-13, every built configuration.
void test_matvec_int_dots() {
  int sms = 0;
  cu(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "multiprocessor count");
  const std::int64_t R = 8 * static_cast<std::int64_t>(sms) + 45;
  for (DType dt : kBlockTypes) {
    const std::int64_t B = ftp::model::dtype_block(dt), C = B == 256 ? 1280 : 544;
    const k::ActQuant kind = k::act_quant_of(kdt(dt));
    Tensor w = make_tensor(dt, R, C);
    Dev<std::uint8_t> dw(w.bytes);
    for (const std::int64_t c0 : {std::int64_t{0}, B}) {
      const std::int64_t cols = C - c0;
      const std::vector<float> wf = dequantized(w, 0, R, c0, cols);
      for (const k::MatvecConfig cfg : {k::MatvecConfig{0, 0}, k::MatvecConfig{1, 4}, k::MatvecConfig{2, 4}, k::MatvecConfig{4, 4}}) {
        double worst = 0;
        for (int t : {1, 2, 3, 5, 8, 13}) {
          const std::vector<float> x = randn(static_cast<std::size_t>(t) * cols);
          std::vector<float> xq(x.size());
          ftp::engine::ops::quantize_activations(dt, x.data(), t, static_cast<int>(cols), xq.data());
          const int blocks = static_cast<int>(cols / B);
          Dev<float> dx(x), dvals(x.size()), dscales(static_cast<std::size_t>(t) * blocks), dout(static_cast<std::size_t>(t) * R);
          Dev<std::int8_t> dquants(x.size());
          done(k::quantize_activations_f32(dx.p(), dvals.p(), t, static_cast<int>(cols), kind, nullptr, dquants.p(),
                                           dscales.p()),
               "quantize_activations_f32 (quants, scales)");
          const k::Q8Acts q8{dquants.p(), dscales.p(), static_cast<int>(cols), blocks, kind};
          cu(cudaMemset(dout.p(), 0xff, static_cast<std::size_t>(t) * R * sizeof(float)), "memset");
          done(k::matvec(dvals.p(), static_cast<int>(cols), k::WeightView{dw.p(), kdt(dt), C, 0, R, c0, cols}, dout.p(),
                         static_cast<int>(R), t, nullptr, cfg, &q8),
               "matvec (int8 dots)");
          worst = std::max(worst, nmse(dout.get(), gemv_ref(xq, wf, t, R, cols)));
        }
        report(std::string("matvec int8 dots ") + ftp::model::dtype_name(dt) + (c0 ? " cols from block 1" : " full") +
                   " config " + std::to_string(cfg.rows_per_warp) + "x" + std::to_string(cfg.warps_per_row) + " t=1..13",
               worst, 1e-6);
      }
    }
  }
}

void test_argmax_and_sampling() {
  const int t = 6, n = 32000;
  std::vector<float> x = randn(static_cast<std::size_t>(t) * n, 2.0f);
  // Ties: row 1 has its maximum twice (the lower index wins), row 2 is constant.
  x[1 * n + 100] = 50.0f;
  x[1 * n + 9000] = 50.0f;
  std::fill(x.begin() + 2 * n, x.begin() + 3 * n, 0.25f);
  Dev<float> dx(x);
  Dev<int> dout(t);
  done(k::argmax_rows(dx.p(), t, n, dout.p(), nullptr), "argmax_rows");
  std::vector<int> got = dout.get();
  std::size_t bad = 0;
  for (int r = 0; r < t; ++r)
    bad += got[r] != ftp::engine::argmax(std::vector<float>(x.begin() + r * n, x.begin() + (r + 1) * n));
  report_exact("argmax_rows n=32000 (ties)", bad, t);

  // Sampling: the CPU Sampler's algorithm with a given uniform draw.
  auto reference = [](std::vector<float> l, float temp, float top_p, double r) {
    if (temp <= 0.0f) return ftp::engine::argmax(l);
    std::vector<int> idx(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[a] > l[b]; });
    std::vector<double> prob(idx.size());
    double mx = l[idx[0]], sum = 0;
    for (std::size_t i = 0; i < idx.size(); ++i) sum += prob[i] = std::exp((l[idx[i]] - mx) / temp);
    for (auto& p : prob) p /= sum;
    if (top_p < 1.0f) {
      double acc = 0;
      std::size_t keep = prob.size();
      for (std::size_t i = 0; i < prob.size(); ++i) {
        acc += prob[i];
        if (acc >= top_p) {
          keep = i + 1;
          break;
        }
      }
      prob.resize(keep);
      double s = std::accumulate(prob.begin(), prob.end(), 0.0);
      for (auto& p : prob) p /= s;
    }
    double acc = 0;
    for (std::size_t i = 0; i < prob.size(); ++i) {
      acc += prob[i];
      if (r < acc) return idx[i];
    }
    return idx[prob.size() - 1];
  };
  const int rows = 64, vocab = 4096;
  std::vector<float> logits = randn(static_cast<std::size_t>(rows) * vocab, 3.0f);
  // Odd rows rounded to integers: many tokens of equal probability (ties
  // cut by the nucleus, picked in id order as the CPU's stable sort does).
  for (int r = 1; r < rows; r += 2)
    for (int i = 0; i < vocab; ++i) logits[static_cast<std::size_t>(r) * vocab + i] = std::round(logits[static_cast<std::size_t>(r) * vocab + i]);
  std::vector<float> temp(rows), top_p(rows), u(rows);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  const float temps[] = {0.0f, 0.7f, 1.0f, 1.5f};
  const float tops[] = {1.0f, 0.9f, 0.5f, 0.0f};
  for (int r = 0; r < rows; ++r) {
    temp[r] = temps[r % 4];
    top_p[r] = tops[(r / 4) % 4];
    u[r] = U(rng);
  }
  Dev<float> dl(logits), dtemp(temp), dtop(top_p), du(u);
  Dev<int> dtok(rows);
  done(k::sample_top_p(dl.p(), vocab, rows, vocab, dtemp.p(), dtop.p(), du.p(), dtok.p(), nullptr), "sample_top_p");
  std::vector<int> tok = dtok.get();
  bad = 0;
  for (int r = 0; r < rows; ++r) {
    int want = reference(std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab), temp[r],
                         top_p[r], u[r]);
    if (tok[r] != want) {
      std::printf("     sample row %d (T=%.1f top_p=%.1f u=%.4f): gpu %d, cpu %d\n", r, temp[r], top_p[r], u[r], tok[r],
                  want);
      ++bad;
    }
  }
  report_exact("sample_top_p n=4096 (temperature x top_p x u)", bad, rows);
}

/// sample_top_p against answers computed by hand (tests/engine/test_sampler.cpp
/// has the same cases for the CPU): a few logits with known draws, and the
/// frequencies of 10000 evenly spread draws against the renormalized
/// distribution (each within 2/10000: a draw u picks token i exactly when u
/// falls in i's interval of the cumulative mass).
void test_sampling_by_hand() {
  struct Case {
    std::vector<double> probs;  // softmax at temperature 1 (logits = log)
    float temperature, top_p;
    float u;
    int want;
  };
  const std::vector<double> p3 = {0.5, 0.3, 0.2, 1e-30}, p4 = {0.4, 0.3, 0.2, 0.1};
  const std::vector<Case> cases = {
      // Temperature 1: cumulative 0.5, 0.8, 1.
      {p3, 1.0f, 1.0f, 0.49f, 0}, {p3, 1.0f, 1.0f, 0.51f, 1}, {p3, 1.0f, 1.0f, 0.81f, 2},
      // Temperature 2: 0.41545, 0.32180, 0.26275 (square roots, renormalized).
      {p3, 2.0f, 1.0f, 0.42f, 1}, {p3, 2.0f, 1.0f, 0.74f, 2},
      // Temperature 0.5: 0.65789, 0.23684, 0.10526 (squares, renormalized).
      {p3, 0.5f, 1.0f, 0.65f, 0}, {p3, 0.5f, 1.0f, 0.66f, 1}, {p3, 0.5f, 1.0f, 0.90f, 2},
      // Top-p 0.9 keeps all three (0.5, 0.8 fall short).
      {p3, 1.0f, 0.9f, 0.85f, 2},
      // Top-p 0.7 keeps two: 0.625, 0.375.
      {p3, 1.0f, 0.7f, 0.62f, 0}, {p3, 1.0f, 0.7f, 0.63f, 1}, {p3, 1.0f, 0.7f, 0.99f, 1},
      // Top-p 0.4 keeps one.
      {p3, 1.0f, 0.4f, 0.99f, 0},
      // 0.4 / 0.3 / 0.2 / 0.1, top-p 0.85 keeps three: 0.44444, 0.33333, 0.22222.
      {p4, 1.0f, 0.85f, 0.44f, 0}, {p4, 1.0f, 0.85f, 0.45f, 1}, {p4, 1.0f, 0.85f, 0.78f, 2}, {p4, 1.0f, 0.85f, 0.999f, 2},
      // Temperature 2 then top-p 0.7: two, 0.56351 and 0.43649.
      {p3, 2.0f, 0.7f, 0.56f, 0}, {p3, 2.0f, 0.7f, 0.57f, 1}, {p3, 2.0f, 0.7f, 0.99f, 1},
      // Temperature 0: greedy.
      {p3, 0.0f, 1.0f, 0.99f, 0},
  };
  const int n = 4, rows = static_cast<int>(cases.size());
  std::vector<float> logits, temp, top, u;
  for (const auto& c : cases) {
    for (double p : c.probs) logits.push_back(static_cast<float>(std::log(p)));
    temp.push_back(c.temperature);
    top.push_back(c.top_p);
    u.push_back(c.u);
  }
  Dev<float> dl(logits), dt(temp), dp(top), du(u);
  Dev<int> dtok(rows);
  done(k::sample_top_p(dl.p(), n, rows, n, dt.p(), dp.p(), du.p(), dtok.p(), nullptr), "sample_top_p");
  std::vector<int> tok = dtok.get();
  std::size_t bad = 0;
  for (int r = 0; r < rows; ++r)
    if (tok[r] != cases[r].want) {
      std::printf("     by hand row %d (T=%.1f top_p=%.2f u=%.3f): gpu %d, want %d\n", r, cases[r].temperature,
                  cases[r].top_p, cases[r].u, tok[r], cases[r].want);
      ++bad;
    }
  report_exact("sample_top_p by hand (temperature, top-p, draws)", bad, rows);

  // Frequencies: 0.4 / 0.25 / 0.15 / 0.1 / 0.06 / 0.04 at top-p 0.75 keep
  // three, 0.5 / 0.3125 / 0.1875.
  const int m = 6, draws = 10000;
  const std::vector<double> probs = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
  std::vector<float> fl, ft(draws, 1.0f), fp(draws, 0.75f), fu(draws);
  for (int i = 0; i < draws; ++i) {
    for (double p : probs) fl.push_back(static_cast<float>(std::log(p)));
    fu[i] = (static_cast<float>(i) + 0.5f) / draws;
  }
  Dev<float> gl(fl), gt(ft), gp(fp), gu(fu);
  Dev<int> gtok(draws);
  done(k::sample_top_p(gl.p(), m, draws, m, gt.p(), gp.p(), gu.p(), gtok.p(), nullptr), "sample_top_p");
  std::vector<int> picks = gtok.get();
  std::vector<double> freq(m, 0.0);
  for (int t : picks)
    if (t >= 0 && t < m) freq[t] += 1.0 / draws;
  const std::vector<double> want = {0.5, 0.3125, 0.1875, 0, 0, 0};
  bad = 0;
  for (int i = 0; i < m; ++i)
    if (std::fabs(freq[i] - want[i]) > 2.0 / draws) {
      std::printf("     token %d: frequency %.4f, want %.4f\n", i, freq[i], want[i]);
      ++bad;
    }
  report_exact("sample_top_p frequencies of 10000 spread draws (top-p 0.75)", bad, m);
}

/// KV write, then decode and prefill attention over the pages, against the
/// executor's attention loop on a KvStore with the same layout. A rank of
/// TP 2 of a model with 8 query heads and 4 KV heads: query heads 4..7,
/// KV heads 2..3 (group 2).
void test_attention(int hd) {
  const int n_head = 8, n_head_kv = 4, group = n_head / n_head_kv;
  const int q_head0 = 4, nq = 4, kv_head0 = 2, kvh = 2;
  // 300 positions: several tiles of keys per row (the online softmax rescales).
  const int B = 16, n_blocks = 48;
  const std::vector<int> lens = {1, 37, 70, 300};
  const int n_seq = static_cast<int>(lens.size());
  const int bt_ld = 20;
  // Each sequence's pages: a shuffled set of blocks.
  std::vector<int> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int>> tables(n_seq);
  std::vector<int> flat(static_cast<std::size_t>(n_seq) * bt_ld, -1);
  int next = 0;
  for (int s = 0; s < n_seq; ++s)
    for (int b = 0; b < (lens[s] + B - 1) / B; ++b) {
      tables[s].push_back(perm[next++]);
      flat[s * bt_ld + b] = tables[s].back();
    }
  // Rows: every position of every sequence, in chunk order.
  std::vector<int> row_seq, row_pos, slots;
  for (int s = 0; s < n_seq; ++s)
    for (int p = 0; p < lens[s]; ++p) {
      row_seq.push_back(s);
      row_pos.push_back(p);
      slots.push_back(tables[s][p / B] * B + p % B);
    }
  const int t = static_cast<int>(row_seq.size());
  const int kvn = kvh * hd, qn = nq * hd;
  auto kx = randn(static_cast<std::size_t>(t) * kvn), vx = randn(static_cast<std::size_t>(t) * kvn);
  auto q = randn(static_cast<std::size_t>(t) * qn);

  const std::size_t page_floats = static_cast<std::size_t>(n_blocks) * kvh * B * hd;
  Dev<float> dkp(page_floats), dvp(page_floats), dk(kx), dv(vx), dq(q), dout(static_cast<std::size_t>(t) * qn);
  cu(cudaMemset(dkp.p(), 0, page_floats * 4), "memset");
  cu(cudaMemset(dvp.p(), 0, page_floats * 4), "memset");
  Dev<int> dslots(slots), dseq(row_seq), dpos(row_pos), dtab(flat);
  done(k::kv_write_f32(dkp.p(), dvp.p(), dk.p(), dv.p(), kvn, t, kvh, hd, B, dslots.p(), nullptr), "kv_write_f32");

  ftp::engine::KvStore kv(1, n_blocks, B, kvh, hd);
  // float32 pages (the store's k() and v() are untyped).
  auto kpage = [&](int b, int j) { return static_cast<float*>(kv.k(0, b, j)); };
  auto vpage = [&](int b, int j) { return static_cast<float*>(kv.v(0, b, j)); };
  for (std::size_t b = 0; b < static_cast<std::size_t>(n_blocks); ++b)
    for (int j = 0; j < kvh; ++j) {
      std::fill_n(kpage(static_cast<int>(b), j), B * hd, 0.0f);
      std::fill_n(vpage(static_cast<int>(b), j), B * hd, 0.0f);
    }
  for (int r = 0; r < t; ++r) {
    const int blk = slots[r] / B, slot = slots[r] % B;
    for (int j = 0; j < kvh; ++j) {
      std::copy_n(&kx[static_cast<std::size_t>(r) * kvn + j * hd], hd, kpage(blk, j) + slot * hd);
      std::copy_n(&vx[static_cast<std::size_t>(r) * kvn + j * hd], hd, vpage(blk, j) + slot * hd);
    }
  }
  std::vector<float> gk = dkp.get(), gv = dvp.get();
  std::size_t bad = 0;
  const float* ck = kpage(0, 0);
  const float* cv = vpage(0, 0);
  for (std::size_t i = 0; i < page_floats; ++i) bad += (gk[i] != ck[i]) + (gv[i] != cv[i]);
  report_exact("kv_write_f32 hd=" + std::to_string(hd) + " (pages as KvStore)", bad, 2 * page_floats);

  // The executor's attention, per row and head.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> want(static_cast<std::size_t>(t) * qn), scores(512);
  for (int r = 0; r < t; ++r) {
    const int s = row_seq[r], pos = row_pos[r];
    for (int h = 0; h < nq; ++h) {
      const float* qh = &q[static_cast<std::size_t>(r) * qn + h * hd];
      const int kvj = (q_head0 + h) / group - kv_head0;
      for (int p = 0; p <= pos; ++p) {
        const float* kp = kpage(tables[s][p / B], kvj) + (p % B) * hd;
        float d = 0;
        for (int e = 0; e < hd; ++e) d += qh[e] * kp[e];
        scores[p] = d * scale;
      }
      ftp::engine::ops::softmax(scores.data(), pos + 1);
      float* out = &want[static_cast<std::size_t>(r) * qn + h * hd];
      for (int p = 0; p <= pos; ++p) {
        const float* vp = vpage(tables[s][p / B], kvj) + (p % B) * hd;
        for (int e = 0; e < hd; ++e) out[e] += scores[p] * vp[e];
      }
    }
  }
  k::AttentionArgs a;
  a.q = dq.p();
  a.q_ld = qn;
  a.out = dout.p();
  a.out_ld = qn;
  a.k_pages = dkp.p();
  a.v_pages = dvp.p();
  a.block_tables = dtab.p();
  a.bt_ld = bt_ld;
  a.row_seq = dseq.p();
  a.row_pos = dpos.p();
  a.t = t;
  a.n_q_heads = nq;
  a.q_head0 = q_head0;
  a.group = group;
  a.kv_head0 = kv_head0;
  a.kv_heads = kvh;
  a.head_dim = hd;
  a.block_tokens = B;
  a.scale = scale;
  done(k::attention_decode(a, nullptr), "attention_decode");
  report("attention_decode hd=" + std::to_string(hd) + " GQA 2, kv-head offset 2", nmse(dout.get(), want), 1e-6);
  cu(cudaMemset(dout.p(), 0, static_cast<std::size_t>(t) * qn * 4), "memset");
  done(k::attention_prefill(a, nullptr), "attention_prefill");
  report("attention_prefill hd=" + std::to_string(hd) + " 4 chunks of 1, 37, 70, 300", nmse(dout.get(), want), 1e-6);

  // Chunks that start mid-sequence (chunked prefill, a decode after it):
  // positions >= 30 of sequence 1 and >= 250 of sequence 3, over the pages
  // written above.
  std::vector<int> sub_seq, sub_pos;
  std::vector<float> sub_q, sub_want;
  for (int r = 0; r < t; ++r) {
    if (!((row_seq[r] == 1 && row_pos[r] >= 30) || (row_seq[r] == 3 && row_pos[r] >= 250))) continue;
    sub_seq.push_back(row_seq[r]);
    sub_pos.push_back(row_pos[r]);
    sub_q.insert(sub_q.end(), q.begin() + static_cast<std::ptrdiff_t>(r) * qn, q.begin() + static_cast<std::ptrdiff_t>(r + 1) * qn);
    sub_want.insert(sub_want.end(), want.begin() + static_cast<std::ptrdiff_t>(r) * qn,
                    want.begin() + static_cast<std::ptrdiff_t>(r + 1) * qn);
  }
  const int t2 = static_cast<int>(sub_seq.size());
  Dev<int> dseq2(sub_seq), dpos2(sub_pos);
  Dev<float> dq2(sub_q), dout2(static_cast<std::size_t>(t2) * qn);
  a.q = dq2.p();
  a.out = dout2.p();
  a.row_seq = dseq2.p();
  a.row_pos = dpos2.p();
  a.t = t2;
  done(k::attention_prefill(a, nullptr), "attention_prefill");
  report("attention_prefill hd=" + std::to_string(hd) + " chunks starting at 30 and 250", nmse(dout2.get(), sub_want), 1e-6);
  done(k::attention_decode(a, nullptr), "attention_decode");
  report("attention_decode hd=" + std::to_string(hd) + " rows at 30.. and 250..", nmse(dout2.get(), sub_want), 1e-6);
}

/// 16-bit KV pages (ftp-serve's default, --kv-cache-dtype f16|bf16): the
/// KV write rounds each value to nearest even (bits equal to the CPU's
/// model::quant::f32_to_f16 / engine::f32_to_bf16), and decode and prefill
/// attention over those pages equal a float32 attention over the rounded
/// values (what the CPU backend computes from its 16-bit pages). One
/// sequence of 300 positions, 2 KV heads, group 2, blocks in order.
void test_attention_16bit(int hd, k::KvElem elem) {
  const int B = 16, kvh = 2, nq = 4, group = 2, len = 300, n_blocks = (len + B - 1) / B;
  const int kvn = kvh * hd, qn = nq * hd, t = len;
  const char* what = elem == k::KvElem::f16 ? "f16" : "bf16";
  auto kx = randn(static_cast<std::size_t>(t) * kvn), vx = randn(static_cast<std::size_t>(t) * kvn);
  auto q = randn(static_cast<std::size_t>(t) * qn);
  auto round16 = [&](float x) -> std::uint16_t {
    return elem == k::KvElem::f16 ? ftp::model::quant::f32_to_f16(x) : ftp::engine::f32_to_bf16(x);
  };
  auto widen = [&](std::uint16_t b) {
    return elem == k::KvElem::f16 ? ftp::model::quant::f16_to_f32(b) : ftp::engine::bf16_to_f32(b);
  };
  std::vector<int> slots(t), seq(t, 0), pos(t), table(n_blocks);
  std::iota(table.begin(), table.end(), 0);
  for (int p = 0; p < t; ++p) slots[p] = p, pos[p] = p;
  const std::size_t page_elems = static_cast<std::size_t>(n_blocks) * kvh * B * hd;
  Dev<std::uint16_t> dkp(page_elems), dvp(page_elems);
  Dev<float> dk(kx), dv(vx), dq(q), dout(static_cast<std::size_t>(t) * qn);
  Dev<int> dslots(slots), dseq(seq), dpos(pos), dtab(table);
  done(k::kv_write(dkp.p(), dvp.p(), elem, dk.p(), dv.p(), kvn, t, kvh, hd, B, dslots.p(), nullptr), "kv_write");
  // Expected pages: [block][kv_head][slot][head_dim], each value rounded.
  std::vector<std::uint16_t> wk(page_elems), wv(page_elems);
  for (int p = 0; p < t; ++p)
    for (int j = 0; j < kvh; ++j)
      for (int d = 0; d < hd; ++d) {
        const std::size_t dst = ((static_cast<std::size_t>(p / B) * kvh + j) * B + p % B) * hd + d;
        wk[dst] = round16(kx[static_cast<std::size_t>(p) * kvn + j * hd + d]);
        wv[dst] = round16(vx[static_cast<std::size_t>(p) * kvn + j * hd + d]);
      }
  const auto gk = dkp.get(), gv = dvp.get();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < page_elems; ++i) bad += (gk[i] != wk[i]) + (gv[i] != wv[i]);
  report_exact(std::string("kv_write ") + what + " hd=" + std::to_string(hd) + " (rounded as the CPU)", bad,
               2 * page_elems);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> want(static_cast<std::size_t>(t) * qn, 0.0f), scores(len);
  for (int r = 0; r < t; ++r)
    for (int h = 0; h < nq; ++h) {
      const int kvj = h / group;
      for (int p = 0; p <= r; ++p) {
        float dsum = 0;
        for (int d = 0; d < hd; ++d)
          dsum += q[static_cast<std::size_t>(r) * qn + h * hd + d] *
                  widen(wk[((static_cast<std::size_t>(p / B) * kvh + kvj) * B + p % B) * hd + d]);
        scores[p] = dsum * scale;
      }
      ftp::engine::ops::softmax(scores.data(), r + 1);
      for (int p = 0; p <= r; ++p)
        for (int d = 0; d < hd; ++d)
          want[static_cast<std::size_t>(r) * qn + h * hd + d] +=
              scores[p] * widen(wv[((static_cast<std::size_t>(p / B) * kvh + kvj) * B + p % B) * hd + d]);
    }
  k::AttentionArgs a;
  a.q = dq.p();
  a.q_ld = qn;
  a.out = dout.p();
  a.out_ld = qn;
  a.k_pages = dkp.p();
  a.v_pages = dvp.p();
  a.kv_elem = elem;
  a.block_tables = dtab.p();
  a.bt_ld = n_blocks;
  a.row_seq = dseq.p();
  a.row_pos = dpos.p();
  a.t = t;
  a.n_q_heads = nq;
  a.group = group;
  a.kv_heads = kvh;
  a.head_dim = hd;
  a.block_tokens = B;
  a.scale = scale;
  done(k::attention_decode(a, nullptr), "attention_decode");
  report(std::string("attention_decode ") + what + " pages hd=" + std::to_string(hd), nmse(dout.get(), want), 1e-6);
  cu(cudaMemset(dout.p(), 0, static_cast<std::size_t>(t) * qn * 4), "memset");
  done(k::attention_prefill(a, nullptr), "attention_prefill");
  report(std::string("attention_prefill ") + what + " pages hd=" + std::to_string(hd), nmse(dout.get(), want), 1e-6);
}

/// GEMV bandwidth at batch 1 on a BF16 matrix of 8192 x 8192 (128 MiB,
/// several times the L2), and on Q4_K and Q6_K matrices of 32768 and 16384
/// x 8192 (151 and 110 MB; the float path and the integer path, with
/// activation quants of zero), against the triad bandwidth of the same run. Printed, not asserted (timings are
/// not a unit test's business).
void report_matvec_bandwidth() {
  const auto triad = ftp::hardware::measure_gpu_triad_gbs(0, true);
  struct Shape {
    k::WeightDType dt;
    DType model;
    std::int64_t rows;
  };
  const std::int64_t C = 8192;
  for (const Shape& sh : {Shape{k::WeightDType::bf16, DType::bf16, 8192}, Shape{k::WeightDType::q4_k, DType::q4_k, 32768},
                          Shape{k::WeightDType::q6_k, DType::q6_k, 16384}}) {
    const std::int64_t R = sh.rows;
    const std::size_t bytes = ftp::model::dtype_bytes(sh.model, R * C);
    Dev<std::uint8_t> w(bytes);
    // 0x3c bytes: BF16 1.17; as block-type halves 0x3c3c = 1.06, finite.
    cu(cudaMemset(w.p(), 0x3c, bytes), "memset");
    Dev<float> x(C), out(R), xd(C / 32);
    Dev<std::int8_t> xq(C);
    cu(cudaMemset(x.p(), 0, C * 4), "memset");
    cu(cudaMemset(xq.p(), 0, C), "memset");
    cu(cudaMemset(xd.p(), 0, C / 32 * 4), "memset");
    const k::Q8Acts q8{xq.p(), xd.p(), static_cast<int>(C), static_cast<int>(C / k::block_elems(sh.dt)),
                       k::act_quant_of(sh.dt)};
    k::WeightView v{w.p(), sh.dt, C, 0, R, 0, C};
    for (const bool int8 : {false, true}) {
      if (int8 && !k::matvec_int_dots(sh.dt)) continue;
      const k::Q8Acts* a = int8 ? &q8 : nullptr;
      cudaEvent_t e0, e1;
      cu(cudaEventCreate(&e0), "event");
      cu(cudaEventCreate(&e1), "event");
      for (int i = 0; i < 3; ++i) cu(k::matvec(x.p(), C, v, out.p(), R, 1, nullptr, {}, a), "matvec");
      const int reps = 20;
      cu(cudaEventRecord(e0), "event");
      for (int i = 0; i < reps; ++i) cu(k::matvec(x.p(), C, v, out.p(), R, 1, nullptr, {}, a), "matvec");
      cu(cudaEventRecord(e1), "event");
      cu(cudaEventSynchronize(e1), "event");
      float ms = 0;
      cu(cudaEventElapsedTime(&ms, e0, e1), "event");
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      const double gbs = static_cast<double>(bytes) * reps / (ms / 1e3) / 1e9;
      std::printf("info matvec %s%s %lldx%lld t=1: %.0f GB/s = %.2f of triad %.0f GB/s\n", ftp::model::dtype_name(sh.model),
                  int8 ? " (int8 dots)" : "", static_cast<long long>(R), static_cast<long long>(C), gbs, gbs / triad.value,
                  triad.value);
    }
  }
}

}  // namespace

/// logprobs_rows against engine::token_logprobs (the CPU's, itself checked
/// by hand in tests/engine/test_sampler.cpp) on rows of 32000 logits with
/// ties, a -inf mask and an all -inf row, at k = 0, 5 and 20.
void test_logprobs() {
  const int t = 5, n = 32000;
  std::vector<float> x = randn(static_cast<std::size_t>(t) * n, 3.0f);
  x[1 * n + 7] = 40.0f;
  x[1 * n + 31000] = 40.0f;  // a tie: the lower id first
  for (int i = 0; i < n; i += 2) x[2 * n + i] = -INFINITY;
  std::fill(x.begin() + 3 * n, x.begin() + 4 * n, -INFINITY);
  std::vector<int> ids = {0, 31000, 1, 5, 12345};
  Dev<float> dx(x);
  Dev<int> did(ids);
  for (int kk : {0, 5, 20}) {
    Dev<float> dch(t), dtop(static_cast<std::size_t>(t) * std::max(kk, 1));
    Dev<int> dtid(static_cast<std::size_t>(t) * std::max(kk, 1));
    done(k::logprobs_rows(dx.p(), n, t, n, did.p(), kk, dch.p(), dtid.p(), dtop.p(), nullptr), "logprobs_rows");
    auto ch = dch.get();
    auto top = dtop.get();
    auto tid = dtid.get();
    std::size_t bad = 0;
    for (int r = 0; r < t; ++r) {
      auto want = ftp::engine::token_logprobs(x.data() + static_cast<std::size_t>(r) * n, n, ids[r], kk);
      auto near = [](float a, float b) { return (std::isinf(a) && a == b) || std::fabs(a - b) <= 1e-5f; };
      bad += !near(ch[r], want.chosen.logprob);
      for (int j = 0; j < kk; ++j) {
        bad += tid[static_cast<std::size_t>(r) * kk + j] != want.top[static_cast<std::size_t>(j)].token;
        bad += !near(top[static_cast<std::size_t>(r) * kk + j], want.top[static_cast<std::size_t>(j)].logprob);
      }
    }
    report_exact("logprobs_rows n=32000 k=" + std::to_string(kk) + " against token_logprobs", bad,
                 static_cast<std::size_t>(t) * (1 + 2 * kk));
  }
}

int main() {
  std::vector<ftp::hardware::GpuInfo> gpus;
  if (int rc = ftp::test::discover_gpus_or_skip(gpus); rc != 0) return rc;
  try {
    cu(cudaSetDevice(0), "cudaSetDevice");
    std::printf("kernels on cuda:0 %s\n", gpus[0].name.c_str());
    test_embed();
    test_rmsnorm();
    test_rope();
    test_add_rmsnorm();
    test_rope_kv_write();
    test_add_bias();
    test_elementwise();
    test_matvec();
    test_matvec_multi();
    test_matvec_configs();
    test_dequant();
    test_embed_blocks();
    test_dequant_blocks();
    test_quantize_activations();
    test_matvec_blocks();
    test_matvec_int_dots();
    test_argmax_and_sampling();
    test_sampling_by_hand();
    test_logprobs();
    for (int hd : {6, 8, 64, 80, 128, 256}) test_attention(hd);
    for (int hd : {8, 64, 128})
      for (k::KvElem e : {k::KvElem::f16, k::KvElem::bf16}) test_attention_16bit(hd, e);
    report_matvec_bandwidth();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
  return failures == 0 ? 0 : 1;
}
