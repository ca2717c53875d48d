#include "engine/memory_size.h"

#include <cstdio>
#include <string>

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
