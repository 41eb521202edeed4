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

TEST(BlockTableTest, GrowsByWholeBlocks) {
  BlockPool pool(3);
  BlockTable t;
  EXPECT_TRUE(t.EnsureCapacity(&pool, 16, 1));
  EXPECT_EQ(t.blocks(), (Ids{0}));
  EXPECT_TRUE(t.EnsureCapacity(&pool, 16, 16));
  EXPECT_EQ(t.blocks(), (Ids{0}));
  EXPECT_TRUE(t.EnsureCapacity(&pool, 16, 33));
  EXPECT_EQ(t.blocks(), (Ids{0, 1, 2}));
  EXPECT_FALSE(t.EnsureCapacity(&pool, 16, 49));
  EXPECT_EQ(t.blocks().size(), 3u);
  t.Clear(&pool);
  EXPECT_EQ(pool.num_free(), 3);
  pool.CheckInvariants();
}

}  // namespace
}  // namespace peng
