// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "engine/weight_store.hpp"
#include "model/model.hpp"

namespace ftp::engine::ops {

/// The activations as llama.cpp's CPU backend quantizes them before its
/// integer dot products with weights of type `w`, given back as floats
/// (q x d): Q8_0 values for Q4_0 and Q5_0, Q8_1 (the same values) for
/// Q4_1 and Q5_1 -- blocks of 32, d = max|x| / 127 rounded to f16, q =
/// x x 127 / max|x| rounded to nearest even --, Q8_K for the K-quants --
/// blocks of 256, d = -max / 127 with max the value of largest magnitude,
/// q = min(127, x / d rounded to nearest even), d kept in float. t rows of
/// k floats, blocks from each row's start (a row of k not a multiple of the
/// block ends with a shorter one). Dotted with the bit-exact dequantized
/// weights, this gives llama.cpp's products up to float rounding of the
/// sums (its integer block dots are exact; the Q8_1 sum term it rounds to
/// f16 is exact here).
void quantize_activations(model::DType w, const float* x, int t, int k, float* out);

/// out[u][i] = x[u] . W[i] (t tokens, w.rows outputs) for a view of a
/// block-quantized tensor other than Q8_0 (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K ..
/// Q6_K): the activations first go through quantize_activations (so the
/// results follow llama.cpp's), then four rows at a time, the blocks each
/// row has in the view are decoded once per call by model::quant::dequantize
/// (bit-exact with ggml) into a per-thread buffer that stays in L1/L2, then
/// dotted with every token's activations. The weights stay in the file's
/// packed blocks: no copy of a matrix, only a few rows of floats at a time.
///
/// Each output sums the view's columns in one order whatever t and whatever
/// rows it is computed with (16 lanes in two 8-lane accumulators, added,
/// then across, then the columns past the last multiple of 8), so a token's
/// result does not depend on its batch. A column range may start or end
/// inside a block: the blocks it touches are decoded whole and only the
/// view's columns are used (the activation blocks then start at the view's
/// first column; WeightStore refuses such row-parallel splits, so a gear's
/// ranks quantize the activations as one rank would).
/// Q4_0, Q4_K and Q6_K views of whole blocks take llama.cpp's integer
/// scheme instead, for every t: the activations as Q8_0 (Q4_0) or Q8_K
/// integers, int8 dots per block or group (maddubs; for Q4_K times the
/// groups' 6-bit scales and the mins against the quant sums, for Q6_K the
/// unsigned 6-bit weights times the int8 scales less 32 x scales . quant
/// sums, in int32) scaled by d_w x d_x in float (the same values up to
/// float rounding of the sums; vec_dot_q4_0_q8_0, vec_dot_q4_K_q8_K,
/// vec_dot_q6_K_q8_K). These read 4 rows at a time and prefetch the next
/// 4 rows' bytes as they go.
/// Uses AVX2/FMA where the CPU has them (callers check, see ops::matmul);
/// matmul_quant_scalar is the same sum order in plain C++.
void matmul_quant(const float* x, const MatView& w, float* out, int t);

/// matmul_quant with AVX-512 (F/BW/VL/DQ/VNNI; callers check the CPU):
/// Q4_0, Q4_K and Q6_K views of whole blocks take AVX-512 VNNI forms of
/// the integer kernels, bit for bit the same outputs as matmul_quant's
/// (the same integer lanes, the same float steps); every other view is
/// matmul_quant.
void matmul_quant512(const float* x, const MatView& w, float* out, int t);

/// matmul_quant without AVX2: the same buffers, plain scalar dots in
/// column order (the portable path where the CPU lacks AVX2/FMA).
void matmul_quant_scalar(const float* x, const MatView& w, float* out, int t);

}  // namespace ftp::engine::ops
