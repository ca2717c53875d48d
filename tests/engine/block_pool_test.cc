#include "engine/block_pool.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

TEST(BlockPoolTest, StartsFreeInIdOrderAndAllocatesFromHead) {
  BlockPool pool(4, 2);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  EXPECT_THAT(pool.FreeListOrder(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(pool.Allocate(), 0);
  EXPECT_EQ(pool.Allocate(), 1);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_EQ(pool.block(0).ref_count, 1);
  EXPECT_TRUE(pool.CheckIntegrity().ok());
}

TEST(BlockPoolTest, UnhashedFreeGoesToHeadHashedToTail) {
  BlockPool pool(4, 2);
  const int32_t a = pool.Allocate();  // 0
  const int32_t b = pool.Allocate();  // 1
  ASSERT_TRUE(pool.CacheBlock(a, 111, Tokens(0, 2), BlockLink{}));
  pool.Free(a);  // cached: tail, kept for reuse
  pool.Free(b);  // worthless: head, reused first
  EXPECT_THAT(pool.FreeListOrder(), ElementsAre(1, 2, 3, 0));
  EXPECT_TRUE(pool.CheckIntegrity().ok()) << pool.CheckIntegrity();
}

TEST(BlockPoolTest, LazyEvictionKeepsHashUntilReallocated) {
  BlockPool pool(2, 2);
  const int32_t a = pool.Allocate();
  ASSERT_TRUE(pool.CacheBlock(a, 7, Tokens(5, 2), BlockLink{}));
  pool.Free(a);
  EXPECT_EQ(pool.block(a).ref_count, 0);
  EXPECT_TRUE(pool.block(a).has_hash);
  EXPECT_EQ(pool.Lookup(7, Tokens(5, 2), BlockLink{}), a);  // still findable
  // Hit on a free cached block: Touch() takes it out of the free list in O(1).
  pool.Touch(a);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_THAT(pool.FreeListOrder(), ElementsAre(1));
  pool.Free(a);
  EXPECT_THAT(pool.FreeListOrder(), ElementsAre(1, 0));
  // Allocating both evicts the cached one last, and drops its hash then.
  EXPECT_EQ(pool.Allocate(), 1);
  EXPECT_TRUE(pool.block(a).has_hash);
  const uint32_t gen = pool.block(a).generation;
  EXPECT_EQ(pool.Allocate(), a);
  EXPECT_FALSE(pool.block(a).has_hash);
  EXPECT_EQ(pool.block(a).generation, gen + 1);
  EXPECT_EQ(pool.Lookup(7, Tokens(5, 2), BlockLink{}), kNoBlock);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
  EXPECT_TRUE(pool.CheckIntegrity().ok());
}

TEST(BlockPoolTest, ChainFreedTailFirstEvictsTailFirst) {
  BlockPool pool(4, 1);
  std::vector<int32_t> chain;
  for (int i = 0; i < 3; ++i) {
    chain.push_back(pool.Allocate());
    ASSERT_TRUE(pool.CacheBlock(chain.back(), 100 + i, Tokens(i, 1), BlockLink{}));
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) pool.Free(*it);
  EXPECT_THAT(pool.FreeListOrder(), ElementsAre(3, 2, 1, 0));
  EXPECT_EQ(pool.Allocate(), 3);
  EXPECT_EQ(pool.Allocate(), 2);  // the chain's tail is evicted before its head
  EXPECT_FALSE(pool.block(2).has_hash);
  EXPECT_TRUE(pool.block(0).has_hash);
}

TEST(BlockPoolTest, LookupComparesTokensAndParent) {
  BlockPool pool(3, 2);
  const int32_t a = pool.Allocate();
  const BlockLink parent{2, 5};
  ASSERT_TRUE(pool.CacheBlock(a, 42, Tokens(1, 2), parent));
  EXPECT_EQ(pool.Lookup(42, Tokens(1, 2), parent), a);
  EXPECT_EQ(pool.Lookup(42, Tokens(2, 2), parent), kNoBlock);           // same hash, other tokens
  EXPECT_EQ(pool.Lookup(42, Tokens(1, 2), BlockLink{2, 6}), kNoBlock);  // stale parent
  EXPECT_EQ(pool.Lookup(43, Tokens(1, 2), parent), kNoBlock);
}

TEST(BlockPoolTest, DuplicateHashKeepsFirstBlock) {
  BlockPool pool(2, 1);
  const int32_t a = pool.Allocate();
  const int32_t b = pool.Allocate();
  EXPECT_TRUE(pool.CacheBlock(a, 9, Tokens(0, 1), BlockLink{}));
  EXPECT_FALSE(pool.CacheBlock(b, 9, Tokens(0, 1), BlockLink{}));
  EXPECT_FALSE(pool.block(b).has_hash);
  EXPECT_EQ(pool.Lookup(9, Tokens(0, 1), BlockLink{}), a);
  EXPECT_TRUE(pool.CheckIntegrity().ok());
}

TEST(BlockPoolTest, SharedBlockFreedOnlyAtLastReference) {
  BlockPool pool(2, 1);
  const int32_t a = pool.Allocate();
  pool.Touch(a);
  EXPECT_EQ(pool.block(a).ref_count, 2);
  pool.Free(a);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.Free(a);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_TRUE(pool.CheckIntegrity().ok());
}

TEST(BlockPoolTest, ResetPrefixCacheDropsFreeHashesOnly) {
  BlockPool pool(2, 1);
  const int32_t a = pool.Allocate();
  const int32_t b = pool.Allocate();
  ASSERT_TRUE(pool.CacheBlock(a, 1, Tokens(0, 1), BlockLink{}));
  ASSERT_TRUE(pool.CacheBlock(b, 2, Tokens(1, 1), BlockLink{}));
  pool.Free(a);
  pool.ResetPrefixCache();
  EXPECT_FALSE(pool.block(a).has_hash);
  EXPECT_TRUE(pool.block(b).has_hash);
  EXPECT_TRUE(pool.CheckIntegrity().ok());
}

}  // namespace
}  // namespace tandem::engine
