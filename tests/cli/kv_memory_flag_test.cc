// --kv-cache-memory as every engine-building command reads it
// (services/cli/kv_memory_flag.h): bytes or a fraction into the
// EngineConfig, one-line errors, and what `tandem serve` passes its workers.
#include "services/cli/kv_memory_flag.h"

#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

TEST(KvMemoryFlagTest, BytesOrFractionIntoTheConfig) {
  engine::EngineConfig config;
  ASSERT_TRUE(ApplyKvCacheMemory("2GiB", &config).ok());
  EXPECT_EQ(config.kv_cache_memory_bytes, int64_t{2} << 30);
  EXPECT_EQ(config.kv_cache_memory_fraction, 0.0);
  ASSERT_TRUE(ApplyKvCacheMemory("0.9", &config).ok());
  EXPECT_DOUBLE_EQ(config.kv_cache_memory_fraction, 0.9);
  EXPECT_EQ(config.kv_cache_memory_bytes, 0);
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  ASSERT_TRUE(ApplyKvCacheMemory("512MiB", &config).ok());  // a size clears the fraction
  EXPECT_EQ(config.kv_cache_memory_fraction, 0.0);
  EXPECT_EQ(config.kv_cache_memory_bytes, int64_t{512} << 20);
}

TEST(KvMemoryFlagTest, ErrorsNameTheFlag) {
  engine::EngineConfig config;
  for (const char* bad : {"1.5", "0", "-0.5", "", "lots", "0MiB", "2XiB"}) {
    absl::Status s = ApplyKvCacheMemory(bad, &config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().rfind("--kv-cache-memory: ", 0), 0u) << s;
    EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << s;
  }
  EXPECT_EQ(ApplyKvCacheMemory("1.5", &config).message(),
            "--kv-cache-memory: memory fraction \"1.5\" must be in (0, 1]");
}

// serve's workers share one GPU: a fraction is split between them there;
// sizes, and fractions on the CPU, go through as given.
TEST(KvMemoryFlagTest, ServeSplitsAFractionBetweenTheWorkersOfOneGpu) {
  using engine::Device;
  EXPECT_EQ(*WorkerKvCacheMemory("0.9", Device::kCuda, 2), "0.45");
  EXPECT_EQ(*WorkerKvCacheMemory("0.9", Device::kCuda, 3), "0.3");
  EXPECT_EQ(*WorkerKvCacheMemory("1", Device::kCuda, 7), "0.142857143");
  EXPECT_EQ(*WorkerKvCacheMemory("0.001", Device::kCuda, 128), "0.000007813");  // never 7.8e-06
  EXPECT_EQ(*WorkerKvCacheMemory("0.9", Device::kCuda, 1), "0.9");
  EXPECT_EQ(*WorkerKvCacheMemory("0.9", Device::kCpu, 2), "0.9");
  EXPECT_EQ(*WorkerKvCacheMemory("40GiB", Device::kCuda, 2), "40GiB");
  EXPECT_EQ(WorkerKvCacheMemory("1.5", Device::kCuda, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The split value parses back as the fraction it is.
  engine::EngineConfig config;
  ASSERT_TRUE(ApplyKvCacheMemory(*WorkerKvCacheMemory("1", Device::kCuda, 64), &config).ok());
  EXPECT_NEAR(config.kv_cache_memory_fraction, 1.0 / 64, 1e-6);
}

}  // namespace
}  // namespace tandem::cli
