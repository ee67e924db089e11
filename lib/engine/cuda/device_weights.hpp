// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/weight_store.hpp"
#include "kernels/weight_view.cuh"

namespace ftp::engine::cuda {

/// The resident copy of a WeightStore's tensors on one CUDA device: each
/// tensor in its stored dtype in its own plain cudaMalloc allocation (never
/// trimmed, never managed memory), uploaded once, then viewed by every
/// domain of every gear on that device: a rank's MatView (a row or column
/// range of a tensor) becomes a kernels::WeightView of the same range of
/// the device copy. Shared by the ranks that use it; freed with the last.
class DeviceWeights {
 public:
  /// The copy of `w` on `device`, made (empty) on first request.
  static std::shared_ptr<DeviceWeights> get(const WeightStore& w, int device);
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  /// Uploads what a stage needs that is not resident yet: the matrices and
  /// norm vectors of layers [first, first + n), the token embedding
  /// (`embedding`), the output norm and classifier (`output`).
  /// Throws ftp::BackendError (out of device memory names the tensor).
  void ensure(int first, int n, bool embedding, bool output);

  /// A range of layers with the embedding and the output, as ensure() takes it.
  struct Span {
    int first = 0, n = 0;
    bool embedding = false, output = false;
  };
  /// Bytes that ensure() of every span would upload now (each tensor once).
  std::uint64_t missing_bytes(const std::vector<Span>& spans) const;

  /// Device address of a resident tensor's data, or null.
  const void* tensor(const model::TensorView* t) const;
  /// Device copy of a float vector of the store (norm weights), or null.
  const float* vec(const float* host) const;

  /// Bytes resident on the device; seconds spent uploading so far.
  std::uint64_t bytes() const;
  double upload_s() const;

 private:
  DeviceWeights(const WeightStore& w, int device);
  void upload(const model::TensorView* t);
  void upload_vec(const float* host, std::size_t n, const char* what);
  /// Calls tensor(t) for each matrix and embedding/classifier tensor a span
  /// needs and vec(host, n, what) for each float32 norm vector.
  template <class Tensor, class Vec>
  void for_each_needed(const Span& sp, Tensor&& tensor, Vec&& vec) const;

  const WeightStore& w_;
  int device_;
  mutable std::mutex mu_;
  std::unordered_map<const void*, void*> dev_;  // host tensor view / vector -> device copy
  std::uint64_t bytes_ = 0;
  double upload_s_ = 0;
};

/// Refuses a model with a matrix of a type the CUDA kernels do not run
/// (they run F32, F16, BF16 and Q8_0; the CPU backend runs Q4_0..Q6_K too):
/// an ftp::InputError naming the tensor and its type, before any upload.
void check_kernel_dtypes(const WeightStore& w);

/// A MatView of the store as a view of the device copy (its tensor must be
/// resident: ensure()). Throws ftp::BackendError otherwise.
kernels::WeightView device_view(const DeviceWeights& dw, const MatView& m);

}  // namespace ftp::engine::cuda
