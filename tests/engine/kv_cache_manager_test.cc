#include "engine/kv_cache_manager.h"

#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/kv_cache.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// Allocates and "computes" a whole sequence.
void Prefill(KvCacheManager* kv, SeqId seq, const std::vector<int32_t>& tokens,
             uint64_t extra_key = 0) {
  const int64_t cached = kv->FindCachedPrefix(tokens, extra_key);
  ASSERT_TRUE(kv->AllocateNew(seq, tokens, extra_key, cached, tokens.size() - cached));
  kv->MarkComputed(seq, tokens, tokens.size());
}

TEST(KvCacheManagerTest, PrefixHitIsCappedBelowTheWholePrompt) {
  KvCacheManager kv(8, 4, true);
  const std::vector<int32_t> prompt = Range(0, 8);  // exactly two blocks
  Prefill(&kv, 1, prompt);
  EXPECT_EQ(kv.FindCachedPrefix(prompt, 0), 4);  // last token must still run
  std::vector<int32_t> longer = Range(0, 10);
  EXPECT_EQ(kv.FindCachedPrefix(longer, 0), 8);
  EXPECT_EQ(kv.FindCachedPrefix(longer, 1), 0);  // other extra key
  std::vector<int32_t> other = Range(1, 10);
  EXPECT_EQ(kv.FindCachedPrefix(other, 0), 0);
  // The hit survives Free (lazy eviction) and shares the blocks.
  kv.Free(1);
  ASSERT_TRUE(kv.AllocateNew(2, longer, 0, 8, 2));
  EXPECT_EQ(kv.prefix_cache_stats().num_hit_tokens, 8);
  EXPECT_EQ(kv.prefix_cache_stats().num_query_tokens, 8 + 10);
  EXPECT_EQ(kv.block_table(2).size(), 3u);
  EXPECT_TRUE(kv.CheckIntegrity().ok()) << kv.CheckIntegrity();
}

TEST(KvCacheManagerTest, PrefixCachingOff) {
  KvCacheManager kv(8, 4, false);
  Prefill(&kv, 1, Range(0, 9));
  EXPECT_EQ(kv.FindCachedPrefix(Range(0, 9), 0), 0);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 0);
}

TEST(KvCacheManagerTest, AllocationIsAllOrNothing) {
  KvCacheManager kv(3, 4, true);
  ASSERT_TRUE(kv.AllocateNew(1, Range(0, 8), 0, 0, 8));
  EXPECT_FALSE(kv.AllocateNew(2, Range(100, 8), 0, 0, 8));  // needs 2, 1 free
  EXPECT_FALSE(kv.Contains(2));
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(kv.AllocateSlots(1, 0, 13, &copies));  // needs 2 more
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_TRUE(kv.AllocateSlots(1, 8, 4, &copies));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_THAT(copies, IsEmpty());
  EXPECT_TRUE(kv.CheckIntegrity().ok());
}

TEST(KvCacheManagerTest, CachedFreeBlocksCountAgainstTheFreePool) {
  KvCacheManager kv(3, 4, true);
  Prefill(&kv, 1, Range(0, 9));  // 3 blocks, 2 cached
  kv.Free(1);
  // Reusing 2 free cached blocks + 1 new needs all 3 free blocks.
  ASSERT_EQ(kv.FindCachedPrefix(Range(0, 9), 0), 8);
  EXPECT_TRUE(kv.AllocateNew(2, Range(0, 9), 0, 8, 1));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_TRUE(kv.CheckIntegrity().ok());
}

TEST(KvCacheManagerTest, ForkSharesAndCopyOnWriteSplits) {
  KvCacheManager kv(8, 4, true);
  Prefill(&kv, 1, Range(0, 6));  // blocks: [full][2 of 4]
  ASSERT_TRUE(kv.Fork(1, 2).ok());
  EXPECT_FALSE(kv.Fork(1, 2).ok());
  EXPECT_FALSE(kv.Fork(9, 3).ok());
  EXPECT_THAT(kv.block_table(2), ElementsAre(kv.block_table(1)[0], kv.block_table(1)[1]));
  EXPECT_EQ(kv.pool().block(kv.block_table(1)[1]).ref_count, 2);
  EXPECT_TRUE(kv.CheckIntegrity().ok());
  // Parent writes position 6 into the shared partial block: it gets a copy.
  const int32_t shared = kv.block_table(1)[1];
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.AllocateSlots(1, 6, 1, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared);
  EXPECT_EQ(copies[0].dst, kv.block_table(1)[1]);
  EXPECT_EQ(kv.block_table(2)[1], shared);
  EXPECT_EQ(kv.block_table(1)[0], kv.block_table(2)[0]);  // the full block stays shared
  // The child now owns the old block alone: no copy.
  copies.clear();
  ASSERT_TRUE(kv.AllocateSlots(2, 6, 1, &copies));
  EXPECT_THAT(copies, IsEmpty());
  EXPECT_TRUE(kv.CheckIntegrity().ok());
  kv.Free(1);
  kv.Free(2);
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

BlockHash ConstantHash(BlockHash, absl::Span<const int32_t>, uint64_t) { return 1234; }

TEST(KvCacheManagerTest, HashCollisionNeverReturnsWrongBlocks) {
  KvCacheManager kv(16, 4, true);
  kv.SetHashFnForTesting(&ConstantHash);  // every block collides
  Prefill(&kv, 1, Range(0, 12));
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);           // the others lost the hash slot
  EXPECT_EQ(kv.FindCachedPrefix(Range(100, 12), 0), 0);  // same hash, other tokens
  EXPECT_EQ(kv.FindCachedPrefix(Range(0, 12), 0), 4);    // the genuine block still hits
  // Same tokens after a different first block: tokens match, parent does not.
  std::vector<int32_t> shifted = Range(50, 4);
  for (int32_t t : Range(0, 8)) shifted.push_back(t);
  EXPECT_EQ(kv.FindCachedPrefix(shifted, 0), 0);
  EXPECT_TRUE(kv.CheckIntegrity().ok());
}

TEST(KvCacheManagerTest, SlotFollowsTheBlockTable) {
  KvCacheManager kv(4, 4, true);
  ASSERT_TRUE(kv.AllocateNew(1, Range(0, 6), 0, 0, 6));
  const auto table = kv.block_table(1);
  EXPECT_EQ(kv.Slot(1, 0), table[0] * 4);
  EXPECT_EQ(kv.Slot(1, 5), table[1] * 4 + 1);
}

TEST(KvCacheManagerTest, SizingFromABudget) {
  EXPECT_EQ(KvBytesPerToken(30, 3, 64, 4), 46080);
  KvCacheConfig config;
  config.memory_budget_bytes = 46080 * 16 * 10 + 5;
  EXPECT_EQ(*NumBlocksFor(config, 46080), 10);
  config.memory_budget_bytes = 100;
  EXPECT_FALSE(NumBlocksFor(config, 46080).ok());
  config.num_blocks = 7;
  EXPECT_EQ(*NumBlocksFor(config, 46080), 7);
  config.block_size = 0;
  EXPECT_FALSE(config.Validate().ok());
  EXPECT_FALSE(KvCacheConfig{}.Validate().ok());  // no size at all
  EXPECT_THAT(DescribeKvCapacity(46080, 10, 16, true),
              HasSubstr("46080 B/token, 10 blocks x 16 tokens = 160 tokens"));
}

TEST(KvCacheStorageTest, CopyBlockCopiesKAndVOfEveryLayer) {
  auto storage = KvCacheStorage::Create(2, 3, 2, 1, 2);
  ASSERT_TRUE(storage.ok());
  KvCacheStorage& s = **storage;
  const int64_t n = s.block_floats();
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t i = 0; i < n; ++i) {
      s.k(layer)[n + i] = 10.f * layer + i;
      s.v(layer)[n + i] = -10.f * layer - i;
    }
  }
  s.CopyBlock(1, 2);
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(s.k(layer)[2 * n + i], 10.f * layer + i);
      EXPECT_EQ(s.v(layer)[2 * n + i], -10.f * layer - i);
      EXPECT_EQ(s.k(layer)[i], 0.f);  // block 0 untouched
    }
  }
}

// Random allocate / compute / fork / free / cache-hit operations against a
// shadow KV store holding the token id written at each slot: every computed
// position of every sequence must read back its own token, whatever blocks
// were shared, cached, copied or evicted.
TEST(KvCacheManagerTest, RandomOperationsKeepInvariantsAndContent) {
  constexpr int32_t kBlocks = 48;
  constexpr int32_t kBlockSize = 4;
  KvCacheManager kv(kBlocks, kBlockSize, true);
  std::vector<int32_t> shadow(kBlocks * kBlockSize, -1);
  struct Model {
    std::vector<int32_t> tokens;
    int64_t computed = 0;
  };
  absl::flat_hash_map<SeqId, Model> seqs;
  std::mt19937 rng(12345);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  // A few shared prefixes make prefix hits common.
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(Range(1000 * i, 4 * (i + 1) + 1));

  auto compute = [&](SeqId id, Model& m, int64_t from, int64_t to) {
    for (int64_t p = from; p < to; ++p) shadow[kv.Slot(id, p)] = m.tokens[p];
    m.computed = to;
    kv.MarkComputed(id, m.tokens, to);
  };
  SeqId next_id = 0;
  int64_t hits = 0;
  for (int op = 0; op < 5000; ++op) {
    const int64_t kind = uniform(0, 9);
    if (kind <= 2 || seqs.empty()) {  // new sequence, maybe with a cached prefix
      std::vector<int32_t> tokens = prefixes[uniform(0, 3)];
      const int64_t extra = uniform(0, 6);
      for (int64_t i = 0; i < extra; ++i) tokens.push_back(static_cast<int32_t>(uniform(0, 50)));
      const int64_t cached = kv.FindCachedPrefix(tokens, 0);
      hits += cached > 0;
      const int64_t n = uniform(1, tokens.size() - cached);
      const SeqId id = next_id++;
      if (kv.AllocateNew(id, tokens, 0, cached, n)) {
        Model& m = seqs[id];
        m.tokens = tokens;
        m.computed = cached;
        compute(id, m, cached, cached + n);
      } else {
        ASSERT_FALSE(kv.Contains(id));
      }
    } else {
      auto it = seqs.begin();
      std::advance(it, uniform(0, seqs.size() - 1));
      const SeqId id = it->first;
      Model& m = it->second;
      if (kind <= 6) {  // step: compute some tokens, append one when caught up
        if (m.computed == static_cast<int64_t>(m.tokens.size())) {
          m.tokens.push_back(static_cast<int32_t>(uniform(0, 50)));
        }
        const int64_t n = uniform(1, m.tokens.size() - m.computed);
        std::vector<BlockCopy> copies;
        if (kv.AllocateSlots(id, m.computed, n, &copies)) {
          for (const BlockCopy& c : copies) {
            std::copy_n(shadow.begin() + c.src * kBlockSize, kBlockSize,
                        shadow.begin() + c.dst * kBlockSize);
          }
          compute(id, m, m.computed, m.computed + n);
        } else {
          ASSERT_TRUE(copies.empty());
        }
      } else if (kind == 7) {  // fork
        const SeqId child = next_id++;
        ASSERT_TRUE(kv.Fork(id, child).ok());
        Model copy = m;
        seqs[child] = std::move(copy);
      } else {  // free
        kv.Free(id);
        seqs.erase(it);
      }
    }
    ASSERT_TRUE(kv.CheckIntegrity().ok()) << "op " << op << ": " << kv.CheckIntegrity();
    for (const auto& [id, m] : seqs) {
      for (int64_t p = 0; p < m.computed; ++p) {
        ASSERT_EQ(shadow[kv.Slot(id, p)], m.tokens[p])
            << "op " << op << " seq " << id << " pos " << p;
      }
    }
  }
  EXPECT_GT(hits, 100);
  for (const auto& [id, m] : seqs) kv.Free(id);
  EXPECT_EQ(kv.num_sequences(), 0);
  EXPECT_EQ(kv.num_free_blocks(), kBlocks);
  EXPECT_TRUE(kv.CheckIntegrity().ok());
}

}  // namespace
}  // namespace tandem::engine
