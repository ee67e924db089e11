// SPDX-License-Identifier: Apache-2.0
// The KV pages' element types (lib/engine/kv_cache): names, sizes, the
// resolution of `auto`, BF16 rounding against hand-computed bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "engine/kv_cache.hpp"

using namespace ftp::engine;

TEST(KvDtype, NamesSizesAndAuto) {
  EXPECT_EQ(kv_dtype_from_string("auto"), KvDtype::automatic);
  EXPECT_EQ(kv_dtype_from_string("bf16"), KvDtype::bf16);
  EXPECT_EQ(to_string(KvDtype::f16), "f16");
  try {
    kv_dtype_from_string("fp8", "--kv-cache-dtype");
    FAIL() << "fp8 accepted";
  } catch (const ftp::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--kv-cache-dtype: \"fp8\" is not one of auto, f16, bf16, f32");
  }
  EXPECT_EQ(kv_element_bytes(KvDtype::f32), 4u);
  EXPECT_EQ(kv_element_bytes(KvDtype::automatic), 2u);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::automatic, ftp::model::DType::bf16), KvDtype::bf16);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::automatic, ftp::model::DType::f32), KvDtype::f16);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::automatic, ftp::model::DType::q8_0), KvDtype::f16);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::f32, ftp::model::DType::bf16), KvDtype::f32);
}

TEST(KvDtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 x 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  // Just above halfway: up.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(0x3F81), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
}

TEST(KvStore, SixteenBitPagesTakeHalfTheBytes) {
  // 2 layers x 3 blocks x 2 heads x 16 slots x 8 dims = 1536 elements of K, as many of V.
  const KvStore f32(2, 3, 16, 2, 8, KvDtype::f32), f16(2, 3, 16, 2, 8, KvDtype::f16), bf16(2, 3, 16, 2, 8, KvDtype::bf16);
  EXPECT_EQ(f32.bytes(), 2u * 1536 * 4);
  EXPECT_EQ(f16.bytes(), 2u * 1536 * 2);
  EXPECT_EQ(bf16.bytes(), f16.bytes());
  KvStore s(2, 3, 16, 2, 8, KvDtype::bf16);
  // Page (layer 1, block 2, head 1) starts ((1 x 3 + 2) x 2 + 1) x 16 x 8 elements in: 2 bytes each.
  EXPECT_EQ(static_cast<char*>(s.k(1, 2, 1)) - static_cast<char*>(s.k(0, 0, 0)), 11 * 128 * 2);
  EXPECT_THROW(KvStore(1, 1, 16, 1, 8, KvDtype::automatic), ftp::InputError);
}

TEST(BlockAllocator, ManyAtOnceAsOneByOne) {
  // Pages taken and given back in bulk come and go in the order of single
  // calls: a domain's page ids (and so its replay) do not depend on which.
  BlockAllocator one(10), bulk(10);
  std::vector<int> a, b;
  for (int i = 0; i < 4; ++i) a.push_back(one.allocate());
  EXPECT_EQ(bulk.allocate(4, b), 4);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, (std::vector<int>{0, 1, 2, 3}));
  const std::vector<int> back = {2, 0, 3};
  for (int x : back) one.free(x);
  bulk.free(back);
  EXPECT_EQ(one.free_blocks(), bulk.free_blocks());
  // Short of pages: as many as there are, appended after what `b` holds.
  std::vector<int> c;
  for (int x = one.allocate(); x >= 0; x = one.allocate()) c.push_back(x);
  const std::vector<int> held = b;
  EXPECT_EQ(bulk.allocate(20, b), 9);
  EXPECT_EQ(std::vector<int>(b.begin(), b.begin() + 4), held);
  EXPECT_EQ(std::vector<int>(b.begin() + 4, b.end()), c);
  EXPECT_EQ(bulk.allocate(1, b), 0);
  EXPECT_EQ(bulk.free_blocks(), 0);
}

TEST(BlockAllocator, BulkFreeOfAFreeBlockIsAnError) {
  BlockAllocator a(4);
  std::vector<int> got;
  a.allocate(2, got);
  EXPECT_THROW(a.free(std::vector<int>{got[0], 3}), ftp::Error);
}
