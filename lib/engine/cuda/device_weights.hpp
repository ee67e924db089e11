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

/// The resident weights of a WeightStore on one CUDA device: the union of
/// the shards its ranks serve (WeightStore::shard_union, the rule of
/// plan::device_memory and of the CPU's device-memory mode), each merged
/// segment (rows of a column-parallel matrix, whole-block columns of a
/// row-parallel one, the embedding and head whole where a rank needs them)
/// in its stored dtype in its own plain cudaMalloc allocation, uploaded
/// once, then viewed by every domain of every gear on that device: a
/// rank's MatView becomes a kernels::WeightView into the segment holding
/// it, so a TP shift copies no weight byte. Shared by the ranks that use
/// it; freed with the last (or by release(): GPU release mode).
class DeviceWeights {
 public:
  /// The copy of `w` on `device`, made (empty) on first request.
  static std::shared_ptr<DeviceWeights> get(const WeightStore& w, int device);
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  /// Uploads the union of `shards` that is not resident yet: called with
  /// every shard the device serves over the gear table, before any domain
  /// (CudaBackend::make_resident), each byte is uploaded once. Returns the
  /// bytes uploaded. Throws ftp::BackendError (out of device memory names
  /// the tensor, the bytes and the bytes free).
  std::uint64_t make_resident(const std::vector<RankShard>& shards);
  /// What one rank needs (its shard), where not resident yet: a rank built
  /// without make_resident uploads its own shard only.
  void ensure(const RankShard& shard) { make_resident({shard}); }
  /// Bytes make_resident(shards) would upload now.
  std::uint64_t missing_bytes(const std::vector<RankShard>& shards) const;
  /// GPU release mode: frees every segment and vector (no domain on the
  /// device may be left); returns the bytes freed.
  std::uint64_t release();

  /// Device copy of a float vector of the store (norm weights), or null.
  const float* vec(const float* host) const;
  /// The resident segment holding `m` as a kernel view, or false.
  bool view(const MatView& m, kernels::WeightView& out) const;

  /// Bytes resident on the device now (the accounting tests read:
  /// plan::device_memory's weights for the device, within 1 %); seconds
  /// spent uploading so far; segments resident.
  std::uint64_t bytes() const;
  double upload_s() const;
  std::size_t segments() const;

 private:
  DeviceWeights(const WeightStore& w, int device);
  struct Segment {
    ShardSegment at;
    void* dev = nullptr;
  };
  bool held(const ShardSegment& g) const;  // mu_ held
  void upload(const ShardSegment& g);
  void upload_vec(const float* host, std::size_t n, const char* what);

  const WeightStore& w_;
  int device_;
  mutable std::mutex mu_;
  std::vector<Segment> segments_;
  std::unordered_map<const void*, void*> vecs_;  // host vector -> device copy
  std::uint64_t bytes_ = 0;
  double upload_s_ = 0;
};

/// Refuses a model with a matrix of a type the CUDA kernels do not run
/// (they run every type the loader accepts today: F32, F16, BF16, Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K; a type added to the loader alone
/// would be refused here): an ftp::InputError naming the tensor and its
/// type, before any upload.
void check_kernel_dtypes(const WeightStore& w);

/// A MatView of the store as a view of the device copy (its tensor must be
/// resident: ensure()). Throws ftp::BackendError otherwise.
kernels::WeightView device_view(const DeviceWeights& dw, const MatView& m);

}  // namespace ftp::engine::cuda
