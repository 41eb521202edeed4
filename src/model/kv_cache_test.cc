// KvCache's sizes and layout for each cache type: the bytes a token and a block take, where a
// layer's K and V arrays lie, copy-on-write of a block, and the types and shapes it refuses.
#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>

namespace peng {
namespace {

// Two GQA layers (2 kv heads of 64 / V 64, 1 of 128 / V 96) and an MLA layer (one row of 576
// values, the first 512 its latent).
KvCacheSpec Spec() {
  KvCacheSpec spec;
  spec.layers = {{2, 64, 64}, {1, 128, 96}, {1, 576, 0, 512}};
  return spec;
}

TEST(KvCache, BytesPerTokenOfEachType) {
  const KvCacheSpec spec = Spec();
  const int64_t values = 2 * 64 * 2 + 128 + 96 + 576;  // 1056
  EXPECT_EQ(spec.BytesPerToken(DType::kF32), values * 4);
  EXPECT_EQ(spec.BytesPerToken(DType::kF16), values * 2);
  EXPECT_EQ(spec.BytesPerToken(DType::kQ8_0), values / 32 * 34);  // 1122
  EXPECT_EQ(KvCache::BlocksForBudget(spec, 16, DType::kQ8_0, 1122 * 16 * 10 + 1), 10);
}

TEST(KvCache, Q8_0LayoutAndCopyBlock) {
  auto kv = KvCache::Create(Spec(), 3, 16, DType::kQ8_0);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ((*kv)->bytes(), 1122 * 16 * 3);
  const kernels::KvLayerView& l0 = (*kv)->layer(0);
  const kernels::KvLayerView& l1 = (*kv)->layer(1);
  const kernels::KvLayerView& l2 = (*kv)->layer(2);
  // Layer 0: K then V, each 3 blocks x 16 slots x 2 heads x 68 bytes; then layer 1 ...
  auto* base = static_cast<uint8_t*>(l0.k);
  EXPECT_EQ(static_cast<uint8_t*>(l0.v) - base, 3 * 16 * 136);
  EXPECT_EQ(static_cast<uint8_t*>(l1.k) - base, 2 * 3 * 16 * 136);
  EXPECT_EQ(static_cast<uint8_t*>(l1.v) - static_cast<uint8_t*>(l1.k), 3 * 16 * 136);
  EXPECT_EQ(static_cast<uint8_t*>(l2.k) - static_cast<uint8_t*>(l1.v), 3 * 16 * 102);
  EXPECT_EQ(l2.dtype, DType::kQ8_0);
  // Copy-on-write copies exactly block 2's bytes to block 0 in every array.
  const int64_t kb2 = 16 * 612;  // layer 2's K block: 16 rows of 18 blocks
  auto* k2 = static_cast<uint8_t*>(l2.k);
  auto* v1 = static_cast<uint8_t*>(l1.v);
  const int64_t vb1 = 16 * 102;
  for (int64_t i = 0; i < kb2; ++i) k2[2 * kb2 + i] = static_cast<uint8_t>(i * 7 + 1);
  for (int64_t i = 0; i < vb1; ++i) v1[2 * vb1 + i] = static_cast<uint8_t>(i * 3 + 2);
  (*kv)->CopyBlock(2, 0);
  EXPECT_EQ(std::memcmp(k2, k2 + 2 * kb2, kb2), 0);
  EXPECT_EQ(std::memcmp(v1, v1 + 2 * vb1, vb1), 0);
  EXPECT_EQ(k2[kb2], 0);  // block 1 untouched
}

TEST(KvCache, RefusedTypesAndShapes) {
  EXPECT_TRUE(Spec().CheckDtype(DType::kF16).ok());
  EXPECT_TRUE(Spec().CheckDtype(DType::kQ8_0).ok());
  const Status bf16 = Spec().CheckDtype(DType::kBF16);
  EXPECT_EQ(bf16.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bf16.message().find("f16, f32 or q8_0"), std::string::npos) << bf16.message();
  // A head of 80 values (and an MLA latent of 500) is not whole 32-value blocks.
  for (const KvCacheSpec::Layer& bad :
       {KvCacheSpec::Layer{2, 80, 80}, KvCacheSpec::Layer{1, 576, 0, 500}}) {
    KvCacheSpec spec = Spec();
    spec.layers.push_back(bad);
    EXPECT_TRUE(spec.CheckDtype(DType::kF16).ok());
    const Status s = spec.CheckDtype(DType::kQ8_0);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("layer 3"), std::string::npos) << s.message();
    EXPECT_FALSE(KvCache::Create(spec, 2, 16, DType::kQ8_0).ok());
  }
}

}  // namespace
}  // namespace peng
