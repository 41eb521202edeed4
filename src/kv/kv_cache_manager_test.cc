#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

Ids Range(int32_t from, int32_t n) {
  Ids v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Admits `seq` with its cached prefix and room for all of `tokens`.
bool Admit(KvCacheManager& m, int64_t seq, const Ids& tokens) {
  ComputedBlocks c = m.GetComputedBlocks(tokens);
  std::vector<BlockCopy> copies;
  return m.AllocateSlots(seq, c.num_tokens, static_cast<int64_t>(tokens.size()) - c.num_tokens,
                         &c, &copies);
}

TEST(KvCacheManagerTest, AllocatesInOrderAndFreesTailFirst) {
  KvCacheManager m(8, 4, true);
  ASSERT_TRUE(Admit(m, 1, Range(0, 6)));
  ASSERT_TRUE(Admit(m, 2, Range(100, 5)));
  EXPECT_EQ(m.block_table(1), (Ids{0, 1}));
  EXPECT_EQ(m.block_table(2), (Ids{2, 3}));
  EXPECT_EQ(m.num_used_blocks(), 4);
  m.Free(1);
  EXPECT_EQ(m.pool().FreeListForTesting(), (Ids{4, 5, 6, 7, 1, 0}));
  ASSERT_TRUE(Admit(m, 3, Range(200, 12)));
  EXPECT_EQ(m.block_table(3), (Ids{4, 5, 6}));
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.AllocateSlots(3, 12, 1, nullptr, &copies));  // grows by one block
  EXPECT_EQ(m.block_table(3), (Ids{4, 5, 6, 7}));
  EXPECT_TRUE(copies.empty());
  m.CheckInvariants();
}

TEST(KvCacheManagerTest, PrefixCacheHitsAndLruEviction) {
  KvCacheManager m(8, 4, true);
  const Ids p = Range(0, 10);
  ASSERT_TRUE(Admit(m, 1, p));
  EXPECT_EQ(m.block_table(1), (Ids{0, 1, 2}));
  m.CacheFullBlocks(1, p, 10);  // blocks 0 and 1 are full
  ComputedBlocks c = m.GetComputedBlocks(p);
  EXPECT_EQ(c.blocks, (Ids{0, 1}));
  EXPECT_EQ(c.num_tokens, 8);
  ASSERT_TRUE(Admit(m, 2, p));
  EXPECT_EQ(m.block_table(2), (Ids{0, 1, 3}));
  EXPECT_EQ(m.pool().ref_count(0), 2);
  EXPECT_EQ(m.prefix_cache_queries(), 20);
  EXPECT_EQ(m.prefix_cache_hits(), 8);
  m.Free(1);
  m.Free(2);
  EXPECT_EQ(m.num_used_blocks(), 0);
  EXPECT_EQ(m.pool().FreeListForTesting(), (Ids{4, 5, 6, 7, 2, 3, 1, 0}));
  // Cached blocks survive on the free list and are taken back by a third request.
  ASSERT_TRUE(Admit(m, 3, p));
  EXPECT_EQ(m.block_table(3), (Ids{0, 1, 4}));
  EXPECT_EQ(m.pool().FreeListForTesting(), (Ids{5, 6, 7, 2, 3}));
  // A prompt that is exactly two blocks reuses only the first: its last token is computed.
  EXPECT_EQ(m.GetComputedBlocks(Range(0, 8)).blocks, (Ids{0}));
  // Different tokens after block 0: only block 0 hits.
  Ids q = p;
  q[5] = 99;
  EXPECT_EQ(m.GetComputedBlocks(q).blocks, (Ids{0}));
  m.Free(3);
  // Filling the pool evicts in LRU order: 5 6 7 2 3 4 first, then the cached 1, 0.
  ASSERT_TRUE(Admit(m, 4, Range(500, 28)));
  EXPECT_EQ(m.block_table(4), (Ids{5, 6, 7, 2, 3, 4, 1}));
  EXPECT_TRUE(m.pool().is_cached(0));
  EXPECT_FALSE(m.pool().is_cached(1));
  EXPECT_EQ(m.GetComputedBlocks(p).blocks, (Ids{0}));
  m.CheckInvariants();
}

TEST(KvCacheManagerTest, HashCollisionIsRejectedByTokenCheck) {
  KvCacheManager m(8, 4, true);
  m.pool().SetHashFnForTesting([](uint64_t, std::span<const int32_t>) -> uint64_t { return 7; });
  const Ids a = Range(0, 9), b = Range(50, 9);
  ASSERT_TRUE(Admit(m, 1, a));
  m.CacheFullBlocks(1, a, 9);
  EXPECT_TRUE(m.pool().is_cached(0));
  EXPECT_FALSE(m.pool().is_cached(1));  // same hash as block 0: not cached
  ComputedBlocks c = m.GetComputedBlocks(b);
  EXPECT_TRUE(c.blocks.empty());  // hash hit, tokens differ: miss
  ASSERT_TRUE(Admit(m, 2, b));
  EXPECT_EQ(m.block_table(2), (Ids{3, 4, 5}));
  EXPECT_EQ(m.prefix_cache_hits(), 0);
  EXPECT_EQ(m.GetComputedBlocks(a).blocks, (Ids{0}));
  m.CheckInvariants();
}

TEST(KvCacheManagerTest, ForkSharesBlocksAndCopiesOnWrite) {
  KvCacheManager m(8, 4, true);
  const Ids p = Range(0, 6);
  ASSERT_TRUE(Admit(m, 1, p));
  m.CacheFullBlocks(1, p, 6);
  m.Fork(1, 2);
  EXPECT_EQ(m.block_table(2), (Ids{0, 1}));
  EXPECT_EQ(m.pool().ref_count(1), 2);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.AllocateSlots(2, 6, 1, nullptr, &copies));  // child writes slot 6: block 1
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(m.block_table(2), (Ids{0, 2}));
  EXPECT_EQ(m.pool().ref_count(1), 1);
  EXPECT_EQ(m.pool().ref_count(0), 2);  // the full prompt block stays shared
  copies.clear();
  ASSERT_TRUE(m.AllocateSlots(1, 6, 1, nullptr, &copies));  // parent now owns block 1 alone
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(m.block_table(1), (Ids{0, 1}));
  ASSERT_TRUE(m.AllocateSlots(1, 7, 2, nullptr, &copies));
  EXPECT_EQ(m.block_table(1), (Ids{0, 1, 3}));
  m.Free(2);
  EXPECT_EQ(m.pool().ref_count(0), 1);
  m.Free(1);
  EXPECT_EQ(m.num_used_blocks(), 0);
  m.CheckInvariants();
}

TEST(KvCacheManagerTest, ShortPoolChangesNothingAndPreemptionFreesForReallocation) {
  KvCacheManager m(4, 4, true);
  const Ids a = Range(0, 8), b = Range(100, 8);
  ASSERT_TRUE(Admit(m, 1, a));
  ASSERT_TRUE(Admit(m, 2, b));
  m.CacheFullBlocks(1, a, 8);
  m.CacheFullBlocks(2, b, 8);
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(m.AllocateSlots(1, 8, 1, nullptr, &copies));
  EXPECT_EQ(m.block_table(1), (Ids{0, 1}));
  EXPECT_EQ(m.num_free_blocks(), 0);
  m.Free(2);  // preempt the newest
  EXPECT_EQ(m.pool().FreeListForTesting(), (Ids{3, 2}));
  ASSERT_TRUE(m.AllocateSlots(1, 8, 1, nullptr, &copies));
  EXPECT_EQ(m.block_table(1), (Ids{0, 1, 3}));
  // Seq 2 comes back: block 2 is still cached, but the pool is one block short.
  ComputedBlocks c = m.GetComputedBlocks(b);
  EXPECT_EQ(c.blocks, (Ids{2}));
  EXPECT_FALSE(m.AllocateSlots(2, 4, 4, &c, &copies));
  EXPECT_FALSE(m.has_seq(2));
  EXPECT_EQ(m.pool().FreeListForTesting(), (Ids{2}));
  EXPECT_EQ(m.prefix_cache_hits(), 0);
  m.Free(1);
  c = m.GetComputedBlocks(b);
  ASSERT_TRUE(m.AllocateSlots(2, 4, 4, &c, &copies));
  EXPECT_EQ(m.block_table(2), (Ids{2, 3}));
  EXPECT_EQ(m.prefix_cache_hits(), 4);
  m.CheckInvariants();
}

}  // namespace
}  // namespace peng
