// SPDX-License-Identifier: Apache-2.0
// The block-type GEMV (matvec_quant_impl.cuh) for the other K-quants.
#include "matvec_quant_impl.cuh"

namespace ftp::kernels::detail {

template bool matvec_quant<qb::QType::q2_k>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);
template bool matvec_quant<qb::QType::q3_k>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);
template bool matvec_quant<qb::QType::q5_k>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);

}  // namespace ftp::kernels::detail
