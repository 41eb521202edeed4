#include "kv/block_pool.h"

#include <gtest/gtest.h>

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

TEST(BlockPoolTest, AllocatesInOrderAndReusesLeastRecentlyFreed) {
  BlockPool pool(4);
  EXPECT_EQ(*pool.Allocate(2), (Ids{0, 1}));
  EXPECT_EQ(*pool.Allocate(1), (Ids{2}));
  EXPECT_FALSE(pool.Allocate(2).has_value());  // only block 3 free: nothing taken
  EXPECT_EQ(pool.num_free(), 1);
  pool.Release({1});
  pool.Release({0});
  EXPECT_EQ(*pool.Allocate(3), (Ids{3, 1, 0}));
  pool.CheckInvariants();
}

TEST(BlockPoolTest, RefCountsKeepSharedBlocks) {
  BlockPool pool(2);
  Ids a = *pool.Allocate(1);
  pool.Retain(a[0]);
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.Release(a);
  EXPECT_EQ(pool.num_free(), 1);
  pool.Release(a);
  EXPECT_EQ(pool.num_free(), 2);
  pool.CheckInvariants();
}

}  // namespace
}  // namespace peng

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

TEST(BlockPoolLruTest, FreedBlocksGoToTailAndStayCachedUntilReused) {
  BlockPool pool(4);
  Ids a = *pool.Allocate(3);  // 0 1 2
  const Ids toks = {7, 8};
  const uint64_t h = pool.HashBlock(0, toks);
  pool.Cache(a[1], h, 0, toks);
  pool.Release({2, 1, 0});
  EXPECT_EQ(pool.FreeListForTesting(), (Ids{3, 2, 1, 0}));
  EXPECT_EQ(pool.Lookup(h, 0, toks), 1);  // still cached while free
  pool.Touch(1);                          // a prefix hit takes it off the free list
  EXPECT_EQ(pool.FreeListForTesting(), (Ids{3, 2, 0}));
  EXPECT_EQ(pool.ref_count(1), 1);
  pool.Release({1});
  EXPECT_EQ(pool.FreeListForTesting(), (Ids{3, 2, 0, 1}));
  EXPECT_EQ(*pool.Allocate(3), (Ids{3, 2, 0}));
  EXPECT_TRUE(pool.is_cached(1));
  EXPECT_EQ(*pool.Allocate(1), (Ids{1}));  // reuse evicts the cache entry
  EXPECT_FALSE(pool.is_cached(1));
  EXPECT_FALSE(pool.Lookup(h, 0, toks).has_value());
  pool.CheckInvariants();
}

TEST(BlockPoolLruTest, LookupRechecksTokensAndParent) {
  BlockPool pool(2);
  pool.SetHashFnForTesting([](uint64_t, std::span<const int32_t>) -> uint64_t { return 42; });
  Ids a = *pool.Allocate(2);
  const Ids t1 = {1, 2}, t2 = {3, 4};
  pool.Cache(a[0], pool.HashBlock(0, t1), 0, t1);
  EXPECT_EQ(pool.Lookup(42, 0, t1), 0);
  EXPECT_FALSE(pool.Lookup(42, 0, t2).has_value());  // collision: tokens differ
  EXPECT_FALSE(pool.Lookup(42, 5, t1).has_value());  // different parent
  pool.Cache(a[1], 42, 0, t2);                       // hash taken: not cached
  EXPECT_FALSE(pool.is_cached(a[1]));
  pool.CheckInvariants();
}

}  // namespace
}  // namespace peng
