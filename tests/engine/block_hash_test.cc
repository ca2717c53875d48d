#include "engine/block_hash.h"

#include <bit>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

BlockHash Chain(const std::vector<int32_t>& tokens, int block_size, uint64_t extra_key,
                int num_blocks) {
  BlockHash h = kRootBlockHash;
  for (int i = 0; i < num_blocks; ++i) {
    h = HashBlockTokens(h, absl::MakeConstSpan(tokens).subspan(i * block_size, block_size),
                        extra_key);
  }
  return h;
}

TEST(BlockHashTest, SamePrefixSameChain) {
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> b = {1, 2, 3, 4, 9, 9, 9, 9};
  EXPECT_EQ(Chain(a, 4, 0, 1), Chain(b, 4, 0, 1));
  EXPECT_NE(Chain(a, 4, 0, 2), Chain(b, 4, 0, 2));
}

TEST(BlockHashTest, ParentAndOrderMatter) {
  std::vector<int32_t> x = {1, 2};
  std::vector<int32_t> y = {2, 1};
  EXPECT_NE(HashBlockTokens(kRootBlockHash, x, 0), HashBlockTokens(kRootBlockHash, y, 0));
  EXPECT_NE(HashBlockTokens(1, x, 0), HashBlockTokens(2, x, 0));
  // Same tokens later in a chain differ from the same tokens at its start.
  std::vector<int32_t> z = {1, 2, 1, 2};
  EXPECT_NE(Chain(z, 2, 0, 1), Chain(z, 2, 0, 2));
}

TEST(BlockHashTest, ExtraKeySeparates) {
  std::vector<int32_t> t = {5, 6, 7, 8};
  EXPECT_NE(HashBlockTokens(kRootBlockHash, t, 0),
            HashBlockTokens(kRootBlockHash, t, HashExtraKey("salt")));
  EXPECT_NE(HashExtraKey("a"), HashExtraKey("b"));
  EXPECT_EQ(HashExtraKey(""), 0u);
  EXPECT_EQ(HashExtraKey("lora-1"), HashExtraKey("lora-1"));
}

TEST(BlockHashTest, WellMixed) {
  // Flipping one token bit flips about half the output bits, and 100k
  // distinct single-token blocks never collide.
  std::vector<int32_t> t = {0, 0, 0, 0};
  const BlockHash base = HashBlockTokens(kRootBlockHash, t, 0);
  int total = 0;
  for (int bit = 0; bit < 31; ++bit) {
    t[2] = 1 << bit;
    total += std::popcount(base ^ HashBlockTokens(kRootBlockHash, t, 0));
  }
  const double mean = total / 31.0;
  EXPECT_GT(mean, 26.0);
  EXPECT_LT(mean, 38.0);
  absl::flat_hash_set<BlockHash> seen;
  for (int32_t i = 0; i < 100000; ++i) {
    std::vector<int32_t> one = {i};
    EXPECT_TRUE(seen.insert(HashBlockTokens(kRootBlockHash, one, 0)).second);
  }
}

}  // namespace
}  // namespace tandem::engine
