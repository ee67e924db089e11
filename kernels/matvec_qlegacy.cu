// SPDX-License-Identifier: Apache-2.0
// The block-type GEMV (matvec_quant_impl.cuh) for the legacy block types.
#include "matvec_quant_impl.cuh"

namespace ftp::kernels::detail {

template bool matvec_quant<qb::QType::q4_0>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);
template bool matvec_quant<qb::QType::q4_1>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);
template bool matvec_quant<qb::QType::q5_0>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);
template bool matvec_quant<qb::QType::q5_1>(const float*, int, const Q8Acts*, const MatvecTarget*, int, int, MatvecConfig, int,
                                                  cudaStream_t);

}  // namespace ftp::kernels::detail
