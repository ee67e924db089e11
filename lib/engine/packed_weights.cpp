// SPDX-License-Identifier: Apache-2.0
#include "engine/packed_weights.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.hpp"
#include "engine/ops.hpp"
#include "model/quant.hpp"

namespace ftp::engine {

namespace {

constexpr std::size_t kQ8Block = 34;  // bytes: f16 scale + 32 int8

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

constexpr std::size_t kHugePage = std::size_t{2} << 20;  // x86-64's PMD size

}  // namespace

std::size_t PackedWeights::packed_size(const model::TensorView& t) {
  const std::size_t blocks = static_cast<std::size_t>(t.cols / 32);
  const std::size_t groups = static_cast<std::size_t>((t.rows + PackedQ8::kGroup - 1) / PackedQ8::kGroup);
  const std::size_t quant_offset = round_up(blocks * PackedQ8::kGroup * 2, 64);
  return groups * round_up(quant_offset + blocks * PackedQ8::kGroup * 32, 64);
}

void PackedWeights::pack(const model::TensorView& t, std::uint8_t* out, PackedQ8& p) {
  if (t.dtype != model::DType::q8_0 || t.cols % 32 != 0)
    throw Error("pack " + t.name + ": a Q8_0 matrix whose width is a multiple of 32");
  constexpr int G = PackedQ8::kGroup;
  p.rows = t.rows;
  p.cols = t.cols;
  p.blocks = t.cols / 32;
  p.groups = (t.rows + G - 1) / G;
  p.quant_offset = round_up(static_cast<std::size_t>(p.blocks) * G * 2, 64);
  p.group_stride = round_up(p.quant_offset + static_cast<std::size_t>(p.blocks) * G * 32, 64);
  p.data = out;
  const auto* src = static_cast<const std::uint8_t*>(t.data);
  for (std::int64_t g = 0; g < p.groups; ++g) {
    std::uint8_t* base = out + static_cast<std::size_t>(g) * p.group_stride;
    auto* sc = reinterpret_cast<std::uint16_t*>(base);
    std::uint8_t* q = base + p.quant_offset;
    // Padding between the scales and the quants, and after the quants.
    std::memset(base + p.blocks * G * 2, 0, p.quant_offset - static_cast<std::size_t>(p.blocks) * G * 2);
    std::memset(q + p.blocks * G * 32, 0, p.group_stride - p.quant_offset - static_cast<std::size_t>(p.blocks) * G * 32);
    for (int r = 0; r < G; ++r) {
      const std::int64_t row = g * G + r;
      const std::uint8_t* rs = row < t.rows ? src + static_cast<std::size_t>(row * p.blocks) * kQ8Block : nullptr;
      for (std::int64_t b = 0; b < p.blocks; ++b) {
        std::uint8_t* qb = q + static_cast<std::size_t>(b) * G * 32 + static_cast<std::size_t>(r) * 4;
        if (!rs) {  // past the last row: scale 0, weights 0 (stored 0 + 128)
          sc[b * G + r] = 0;
          for (int j = 0; j < 8; ++j) std::memset(qb + j * G * 4, 0x80, 4);
          continue;
        }
        const std::uint8_t* blk = rs + static_cast<std::size_t>(b) * kQ8Block;
        std::memcpy(&sc[b * G + r], blk, 2);
        for (int j = 0; j < 8; ++j) {
          std::uint32_t w;
          std::memcpy(&w, blk + 2 + 4 * j, 4);
          w ^= 0x80808080u;
          std::memcpy(qb + j * G * 4, &w, 4);
        }
      }
    }
  }
}

bool PackedWeights::wanted() {
  const char* e = std::getenv("FTP_Q8_PACK");
  if (e && std::string_view(e) == "0") return false;
  return ops::packed_kernels_available();
}

bool PackedWeights::copies_wanted() {
  const char* e = std::getenv("FTP_HUGE_COPY");
  if (e && std::string_view(e) == "0") return false;
  // Without huge pages a copy reads no faster than the mapped file.
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  return std::getline(f, modes) && modes.find("[never]") == std::string::npos;
}

void PackedWeights::release_source(const model::Model& m, const model::TensorView& t) {
  if (!m.weights_file_mapped) return;
  // Whole pages inside the tensor's span only: never a neighbour's.
  const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<std::uintptr_t>(t.data), b = a + t.bytes;
  const std::uintptr_t pa = (a + page - 1) / page * page, pb = b / page * page;
  if (pb > pa && ::madvise(reinterpret_cast<void*>(pa), pb - pa, MADV_DONTNEED) == 0) released_ += pb - pa;
}

void PackedWeights::copy_quantized(const model::Model& m, const std::vector<const model::TensorView*>& todo) {
  std::vector<const model::TensorView*> mine;
  std::size_t len = 0;
  for (const model::TensorView* t : todo) {
    if (t->empty() || !model::quant::is_quantized(t->dtype) || t->dtype == model::DType::q8_0 ||
        std::find(mine.begin(), mine.end(), t) != mine.end())
      continue;
    mine.push_back(t);
    len += round_up(t->bytes, 64);
  }
  if (mine.empty()) return;
  // One region, on a huge-page boundary, so that the small matrices (a
  // layer's K and V) share huge pages with their neighbours.
  const std::size_t map_len = round_up(len, kHugePage) + kHugePage;
  void* mem = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    throw Error("copying the quantized matrices for the CPU backend: cannot map " + std::to_string(map_len) + " bytes");
  regions_.push_back(Region{mem, map_len});
  auto* at = reinterpret_cast<std::uint8_t*>(round_up(reinterpret_cast<std::uintptr_t>(mem), kHugePage));
  ::madvise(at, round_up(len, kHugePage), MADV_HUGEPAGE);
  for (const model::TensorView* t : mine) {
    model::TensorView c = *t;
    std::memcpy(at, t->data, t->bytes);
    c.data = at;
    copies_.emplace(t, std::move(c));
    at += round_up(t->bytes, 64);
    bytes_ += t->bytes;
    release_source(m, *t);
  }
}

PackedWeights::PackedWeights(const model::Model& m) {
  std::vector<const model::TensorView*> todo;
  for (const auto& l : m.weights.layers)
    for (const model::TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) todo.push_back(t);
  // The classifier as WeightStore::output() names it (the embedding when tied).
  todo.push_back(m.weights.output.data ? &m.weights.output : &m.weights.tok_embd);
  const std::vector<const model::TensorView*> none;
  try {
    for (const model::TensorView* t : wanted() ? todo : none) {
      if (t->empty() || t->dtype != model::DType::q8_0 || t->cols % 32 != 0 || packed_.count(t)) continue;
      const std::size_t len = packed_size(*t);
      void* mem = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mem == MAP_FAILED)
        throw Error("packing " + t->name + " for the CPU backend: cannot map " + std::to_string(len) + " bytes");
      regions_.push_back(Region{mem, len});
      // Large pages where the kernel offers them: the kernels stream the
      // whole copy every decode step, and fewer TLB misses help.
      ::madvise(mem, len, MADV_HUGEPAGE);
      PackedQ8 p;
      pack(*t, static_cast<std::uint8_t*>(mem), p);
      packed_.emplace(t, p);
      bytes_ += len;
      release_source(m, *t);
    }
    if (copies_wanted()) copy_quantized(m, todo);
  } catch (...) {
    for (const Region& r : regions_) ::munmap(r.addr, r.len);
    throw;
  }
}

PackedWeights::~PackedWeights() {
  for (const Region& r : regions_) ::munmap(r.addr, r.len);
}

const PackedQ8* PackedWeights::find(const model::TensorView* t) const noexcept {
  auto it = packed_.find(t);
  return it == packed_.end() ? nullptr : &it->second;
}

const model::TensorView* PackedWeights::copy_of(const model::TensorView* t) const noexcept {
  auto it = copies_.find(t);
  return it == copies_.end() ? nullptr : &it->second;
}

}  // namespace ftp::engine
