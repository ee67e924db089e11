// SPDX-License-Identifier: Apache-2.0
// The block-type GEMV (matvec_quant_impl.cuh) for Q4_K_M's types (Q4_K, Q6_K).
#include "matvec_quant_impl.cuh"

namespace ftp::kernels::detail {

template bool matvec_quant<qb::QType::q4_k>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);
template bool matvec_quant<qb::QType::q6_k>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);

}  // namespace ftp::kernels::detail
