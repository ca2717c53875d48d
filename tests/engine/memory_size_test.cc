#include "engine/memory_size.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "engine/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(MemorySizeTest, Units) {
  EXPECT_EQ(*ParseMemorySize("2GiB", 0), 2 * kGiB);
  EXPECT_EQ(*ParseMemorySize("512MiB", 0), 512 << 20);
  EXPECT_EQ(*ParseMemorySize("512 mib", 0), 512 << 20);
  EXPECT_EQ(*ParseMemorySize("1.5GiB", 0), 3 * kGiB / 2);
  EXPECT_EQ(*ParseMemorySize("4KiB", 0), 4096);
  EXPECT_EQ(*ParseMemorySize("2GB", 0), 2000000000);
  EXPECT_EQ(*ParseMemorySize("1048576", 0), 1048576);
  EXPECT_EQ(*ParseMemorySize(" 3M ", 0), 3 << 20);
}

TEST(MemorySizeTest, FractionOfAvailable) {
  EXPECT_EQ(*ParseMemorySize("0.5", 8 * kGiB), 4 * kGiB);
  EXPECT_EQ(*ParseMemorySize("1", 8 * kGiB), 8 * kGiB);
  EXPECT_FALSE(ParseMemorySize("0.5", 0).ok());  // unknown available memory
  EXPECT_FALSE(ParseMemorySize("1.5", 8 * kGiB).ok());
  EXPECT_FALSE(ParseMemorySize("0", 8 * kGiB).ok());
}

TEST(MemorySizeTest, Junk) {
  for (const char* junk : {"", "GiB", "abc", "2XiB", "-1GiB", "1.2.3GiB", "2 GiB extra", "0GiB",
                           "1e30GiB", "99999999999TiB"}) {
    EXPECT_EQ(ParseMemorySize(junk, kGiB).status().code(), absl::StatusCode::kInvalidArgument)
        << junk;
  }
}

TEST(MemorySizeTest, BudgetKeepsTheFraction) {
  absl::StatusOr<MemoryBudget> b = ParseMemoryBudget("0.9");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->is_fraction());
  EXPECT_DOUBLE_EQ(b->fraction, 0.9);
  EXPECT_EQ(b->bytes, 0);
  b = ParseMemoryBudget("1");
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->fraction, 1.0);
  b = ParseMemoryBudget("2GiB");
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->is_fraction());
  EXPECT_EQ(b->bytes, 2 * kGiB);
  b = ParseMemoryBudget("4096");  // a whole number above 1 is bytes
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->bytes, 4096);
  for (const char* bad : {"0", "0.0", "1.5", "1.0001", "-0.5", "", "lots", "0GiB", "1e30GiB"}) {
    EXPECT_EQ(ParseMemoryBudget(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseMemoryBudget("1.5").status().message(),
            "memory fraction \"1.5\" must be in (0, 1]");
}

TEST(MemorySizeTest, ShareOfFreeBytes) {
  EXPECT_EQ(*ShareOfFreeBytes(0.5, 8 * kGiB), 4 * kGiB);
  EXPECT_EQ(*ShareOfFreeBytes(1.0, 12345), 12345);
  EXPECT_EQ(*ShareOfFreeBytes(0.9, 10), 9);
  EXPECT_EQ(*ShareOfFreeBytes(0.25, 7), 1);  // rounded down
  EXPECT_EQ(ShareOfFreeBytes(0.1, 5).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ShareOfFreeBytes(0.5, 0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ShareOfFreeBytes(0.5, -1).status().code(), absl::StatusCode::kResourceExhausted);
  for (double bad : {0.0, -0.1, 1.01, std::nan("")}) {
    EXPECT_EQ(ShareOfFreeBytes(bad, kGiB).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// The arithmetic a CUDA engine does for --kv-cache-memory 0.9: the share of
// the device's free memory (weights counted out) in whole KV blocks.
TEST(MemorySizeTest, FractionOfFreeDeviceMemoryInBlocks) {
  // An H200 with 139 GiB free, 4.5 GiB of weights; SmolLM2-135M's f32 KV is
  // 2 x 30 layers x 3 KV heads x 64 x 4 B = 46080 B per token.
  const int64_t free_bytes = 139 * kGiB - 9 * kGiB / 2;
  const int64_t budget = *ShareOfFreeBytes(0.9, free_bytes);
  KvCacheConfig config;
  config.block_size = 16;
  config.memory_budget_bytes = budget;
  const int64_t blocks = *NumBlocksFor(config, 46080);
  EXPECT_EQ(blocks, budget / (46080 * 16));
  EXPECT_LE(blocks * 46080 * 16, budget);
  EXPECT_GT((blocks + 1) * 46080 * 16, budget);
  EXPECT_EQ(blocks, 176291);  // floor(0.9 * 134.5 GiB / 737280 B)
  // Too little free memory for one block is an error, not zero blocks.
  config.memory_budget_bytes = *ShareOfFreeBytes(0.9, 46080 * 16);
  EXPECT_FALSE(NumBlocksFor(config, 46080).ok());
}

TEST(MemorySizeTest, ReadsMemAvailable) {
  const std::string path = ::testing::TempDir() + "/meminfo";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n", f);
  std::fclose(f);
  EXPECT_EQ(*ReadAvailableMemoryBytes(path.c_str()), int64_t{8000000} * 1024);
  EXPECT_FALSE(ReadAvailableMemoryBytes("/nonexistent/meminfo").ok());
  // The real one, on Linux.
  absl::StatusOr<int64_t> real = ParseMemorySize("0.5");
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_GT(*real, 0);
}

}  // namespace
}  // namespace tandem::engine
