// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/weight_store.hpp"

/// The CPU backend's operations of the Llama forward pass, on float32.
/// Each works on one rank's slice; the caller arranges the parallelism.
namespace ftp::engine::ops {

/// out[i] = w[i] * x[i] / sqrt(mean(x^2) + eps), for one row of n.
void rmsnorm(const float* x, const float* w, float* out, int n, float eps);

/// out[t][w.rows] = x[t][w.cols] . W^T for a view W of a weight tensor in
/// any dtype: float32 goes to BLAS sgemm in place (the view's leading
/// dimension is the tensor's row length). F16, BF16 and Q8_0 go, where the
/// CPU has AVX2/FMA/F16C, to fused kernels that convert each weight in
/// registers once and use it for every token (memory reads each weight
/// once, whatever t) -- AVX-512 ones (F/BW/VL/DQ/VNNI, checked at run time)
/// where the CPU has them; elsewhere (and for Q8_0 views that do not start
/// on a block of 32) to matmul_reference. Each output element is summed in
/// the same order whatever t, so a token's result does not depend on the
/// batch it is in. FTP_MATMUL=reference in the environment forces
/// matmul_reference everywhere (for A/B measurements), FTP_MATMUL=avx2 the
/// AVX2 kernels (both also turn matmul_packed into matmul). The CPU backend
/// sends Q8_0 matrices that its store packed to matmul_packed instead.
/// The other block types (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K) quantize the
/// activations as llama.cpp does (quantize_activations), then dot them with
/// the weights: matmul_quant (engine/quant_matmul.hpp; integer dots for
/// Q4_0, Q4_K and Q6_K, float32 with the dequantized weights for the rest)
/// where the CPU has AVX2/FMA, matmul_reference (float32) elsewhere and
/// under FTP_MATMUL=reference.
void matmul(const float* x, const MatView& w, float* out, int t);

/// matmul for a view of a Q8_0 tensor whose packed copy (PackedWeights,
/// the CPU backend's one-time preparation) is `p`: the AVX-512 VNNI kernel
/// over 16 rows at a time, 64 multiply-adds per dpbusd, the activations
/// quantised per block of 32 as matmul's Q8_0 kernels do. Any row range;
/// columns starting on a block of 32 and holding whole blocks (otherwise,
/// or where packed_kernels_available() is false, it is matmul on the
/// mapped tensor). Each output is summed over blocks in block order
/// whatever t: a token's result does not depend on the batch it is in, and
/// t = 1 and t > 1 give bit-identical outputs. Results differ from matmul's
/// Q8_0 kernels by float rounding (they sum 8 lanes per row, then across).
void matmul_packed(const float* x, const PackedQ8& p, const MatView& w, float* out, int t);

/// Whether matmul_packed runs its packed kernel here: the CPU has AVX-512
/// (F/BW/VL/DQ/VNNI) and matmul_kernels() is `best`.
bool packed_kernels_available();

/// Which kernels matmul uses: best (what the CPU has), avx2 (no AVX-512),
/// reference. Starts from FTP_MATMUL; the tests set it.
enum class MatmulKernels { best, avx2, reference };
void set_matmul_kernels(MatmulKernels k);
MatmulKernels matmul_kernels();

/// The portable path and the reference of the tests: float32 to sgemm in
/// place; other dtypes converted tile by tile (64 rows) by model::to_f32
/// into a per-thread buffer, then sgemm.
void matmul_reference(const float* x, const MatView& w, float* out, int t);

/// Rotary embedding of each head's first n_rot dimensions, pair i (i <
/// n_rot/2) turned by angle = pos x theta^(-2i / n_rot) / freq_factors[i]
/// (freq_factors null: 1). The pairs are (v[2i], v[2i+1]) for RopeType::norm
/// and (v[i], v[i + n_rot/2]) for RopeType::neox, as llama.cpp's
/// rope_yarn without extrapolation.
void rope(float* v, int n_heads, int head_dim, int n_rot, int pos, float theta,
          model::RopeType type = model::RopeType::norm, const float* freq_factors = nullptr);

/// g[i] = silu(g[i]) * u[i].
void silu_mul(float* g, const float* u, std::size_t n);

/// One query head's attention over positions [0, n) held in KV pages of
/// `B` positions each: `kp[b]` is page b's K of this head transposed,
/// [head_dim][B], `vp[b]` its V, [B][head_dim]. out[head_dim] =
/// sum_p softmax(q . k_p x scale)_p v_p. Each score sums over d in order and
/// each output over p in order, whatever the vector width (16 positions of
/// a K page at a time where the CPU has AVX-512). `scores`: n floats.
void attention_head(const float* q, const float* const* kp, const float* const* vp, int n, int head_dim, int B,
                    float scale, float* scores, float* out);

/// In-place softmax of one row of n.
///
/// rmsnorm, silu_mul, softmax and attention_head run 16 floats at a time
/// where the CPU has AVX-512 and the kernels are the best (e^x by a
/// polynomial within 2 ulp; sums in 16 partial lanes added in a fixed
/// order), scalar elsewhere and under FTP_MATMUL=avx2|reference: the same
/// results for the same inputs and kernels, whatever the gear or the batch.
void softmax(float* x, int n);

/// out[i] = h[i] widened from IEEE half to float, exact: the values
/// model::quant::f16_to_f32 gives (a NaN stays a NaN), eight at a time
/// with F16C where the CPU has it. The CPU backend widens its 16-bit KV
/// pages with it for attention every step: the scalar conversion took
/// 5 % of a batch-1 Q4_K_M step (docs/benchmarks.md, 2026-12-06).
void widen_f16(const std::uint16_t* h, float* out, std::size_t n);

/// Sets the BLAS library to run single-threaded in each caller: a virtual
/// device's rank thread is its compute. Called once by the engine.
void blas_single_threaded();

}  // namespace ftp::engine::ops
