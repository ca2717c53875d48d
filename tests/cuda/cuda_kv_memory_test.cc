// --kv-cache-memory as a fraction on CUDA (engine/cuda/cuda_memory.h): the
// weights' device bytes by cuda_weights.cc's rules (host arithmetic, runs
// without a device), equal to what UploadWeights allocates, and an engine
// whose KV cache is that fraction of the free device memory (skip without a
// device); without one, the device error.
#include <cmath>
#include <memory>

#include "engine/cuda/cuda_memory.h"
#include "engine/cuda/cuda_weights.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

namespace kc = kernels::cuda;
using gguf::TensorType;

#define REQUIRE_DEVICE() \
  if (kc::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

int64_t Rows(TensorType type, int64_t rows, int64_t cols) {
  return rows * static_cast<int64_t>(*gguf::RowBytes(type, cols));
}
int64_t Align256(int64_t b) { return (b + 255) / 256 * 256; }
// The planar layout: quants (16 bytes a block for Q4_x, 32 for Q8_0) then
// scales (4 bytes for Q4_1, 2 otherwise), each region 256-byte aligned.
int64_t Planar(TensorType type, int64_t rows, int64_t cols) {
  const int64_t blocks = rows * cols / 32;
  const int64_t qb = type == TensorType::kQ8_0 ? 32 : 16, sb = type == TensorType::kQ4_1 ? 4 : 2;
  return Align256(blocks * qb) + Align256(blocks * sb);
}

// The tiny default: 2 layers, hidden 64, ffn 96, 4 heads of 16, 2 KV heads,
// vocab 96; Q4_1 matrices planar (Q|K|V and gate|up stacked), the tied Q8_0
// embedding as a table plus a planar LM head.
TEST(CudaKvMemoryTest, WeightBytesOfQuantizedTiedModel) {
  testing::TinyLlamaShape shape;
  TinyModel tiny = LoadTinyModel(shape);
  const TensorType q = TensorType::kQ4_1;
  const int64_t layer = Planar(q, 64 + 32 + 32, 64) + Planar(q, 2 * 96, 64) + Planar(q, 64, 64) +
                        Planar(q, 64, 96) + 2 * 64 * 4;
  const int64_t want =
      Rows(TensorType::kQ8_0, 96, 64) + Planar(TensorType::kQ8_0, 96, 64) + 64 * 4 + 2 * layer;
  EXPECT_EQ(cuda::DeviceWeightBytes(*tiny.model), want);
}

// F32 matrices (and an untied F32 LM head) become bf16 on the device; an F32
// embedding is a table type and stays F32; qkv biases are f32.
TEST(CudaKvMemoryTest, WeightBytesOfConvertedUntiedModel) {
  testing::TinyLlamaShape shape;
  shape.matrix_type = TensorType::kF32;
  shape.embd_type = TensorType::kF32;
  shape.tied = false;
  shape.qkv_bias = true;
  TinyModel tiny = LoadTinyModel(shape);
  const int64_t layer =
      2 * ((64 + 32 + 32) * 64 + 2 * 96 * 64 + 64 * 64 + 64 * 96) + 2 * 64 * 4 + (64 + 32 + 32) * 4;
  const int64_t want = 96 * 64 * 4 + 2 * 96 * 64 + 64 * 4 + 2 * layer;
  EXPECT_EQ(cuda::DeviceWeightBytes(*tiny.model), want);
}

TEST(CudaKvMemoryTest, WeightBytesEqualWhatUploadAllocates) {
  REQUIRE_DEVICE();
  ASSERT_TRUE(kc::SetDevice(0).ok());
  absl::StatusOr<kc::Stream> stream = kc::StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (bool convert : {false, true}) {
    testing::TinyLlamaShape shape;
    if (convert) {
      shape.matrix_type = TensorType::kF32;
      shape.tied = false;
      shape.qkv_bias = true;
    }
    TinyModel tiny = LoadTinyModel(shape);
    absl::StatusOr<cuda::DeviceWeights> w = cuda::UploadWeights(*tiny.model, *stream);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(cuda::DeviceWeightBytes(*tiny.model), w->bytes) << "convert " << convert;
  }
  kc::StreamDestroy(*stream);
}

// An engine on cuda:0 with kv_cache_memory_fraction 0.05: its blocks are
// 0.05 of (free device memory - the weights' bytes), and that much device
// memory is taken when it is built.
TEST(CudaKvMemoryTest, EngineKvCacheIsTheFractionOfFreeDeviceMemory) {
  REQUIRE_DEVICE();
  TinyModel tiny = LoadTinyModel(DefaultTinyShape());
  ExecutorOptions options;
  options.device = Device::kCuda;
  absl::StatusOr<int64_t> for_kv = FreeMemoryForKv(tiny.model.get(), options);
  ASSERT_TRUE(for_kv.ok()) << for_kv.status();
  int64_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(kc::DeviceMemoryInfo(0, &free_bytes, &total_bytes).ok());
  EXPECT_GT(*for_kv, 0);
  EXPECT_LT(*for_kv, free_bytes);
  EXPECT_LE(free_bytes, total_bytes);

  EngineConfig config;
  config.device = Device::kCuda;
  config.kv_cache_memory_fraction = 0.05;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(config, tiny.model.get(), nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t block_bytes = (*engine)->kv_bytes_per_token() * config.block_size;
  const int64_t blocks = (*engine)->Stats().num_blocks_total;
  const double want = 0.05 * static_cast<double>(*for_kv) / static_cast<double>(block_bytes);
  // Other processes may move the free memory a little between the calls.
  EXPECT_NEAR(static_cast<double>(blocks), want, want * 0.02 + 1)
      << (*engine)->kv_cache_description();
  EXPECT_NE((*engine)->kv_cache_description().find(" GiB free on cuda"), std::string::npos)
      << (*engine)->kv_cache_description();
  int64_t free_after = 0;
  ASSERT_TRUE(kc::DeviceMemoryInfo(0, &free_after, &total_bytes).ok());
  EXPECT_LE(free_after, free_bytes - blocks * block_bytes) << "the KV cache is on the device";
}

TEST(CudaKvMemoryTest, WithoutDeviceTheDeviceErrorComes) {
  if (kc::DeviceCount() != 0) GTEST_SKIP() << "a CUDA device is visible";
  TinyModel tiny = LoadTinyModel(DefaultTinyShape());
  ExecutorOptions options;
  options.device = Device::kCuda;
  absl::StatusOr<int64_t> for_kv = FreeMemoryForKv(tiny.model.get(), options);
  ASSERT_FALSE(for_kv.ok());
  EXPECT_EQ(for_kv.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(for_kv.status().message().rfind("--device cuda: ", 0), 0u) << for_kv.status();
  int64_t free_bytes = 0, total_bytes = 0;
  EXPECT_FALSE(kc::DeviceMemoryInfo(0, &free_bytes, &total_bytes).ok());
}

}  // namespace
}  // namespace tandem::engine
