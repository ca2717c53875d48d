// The executor seam: device flag parsing, the CUDA device check on a machine
// without one, the CPU executor equal to LlamaModel::Forward, KV read/write
// in the interchange layout, and bad slots / copies as errors.
#include "engine/executor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cpu_executor.h"
#include "engine/engine.h"
#include "engine/kv_export.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::engine {
namespace {

TEST(DeviceTest, ParsesOnlyKnownNames) {
  Device d = Device::kCuda;
  EXPECT_TRUE(ParseDevice("cpu", &d));
  EXPECT_EQ(d, Device::kCpu);
  EXPECT_TRUE(ParseDevice("cuda", &d));
  EXPECT_EQ(d, Device::kCuda);
  for (const char* bad : {"", "CPU", "gpu", "cuda:0", "cuda "}) EXPECT_FALSE(ParseDevice(bad, &d));
  EXPECT_EQ(DeviceName(Device::kCuda), "cuda");
  EXPECT_EQ(DeviceName(Device::kCpu), "cpu");
}

TEST(DeviceTest, CpuIsAlwaysAvailable) { EXPECT_TRUE(CheckDeviceAvailable(Device::kCpu).ok()); }

// On a machine without a GPU (every CI machine) --device cuda is one clear
// error, never a crash; on a GPU machine the same calls succeed.
TEST(DeviceTest, CudaWithoutADeviceIsAClearError) {
  const absl::Status st = CheckDeviceAvailable(Device::kCuda);
  if (st.ok()) GTEST_SKIP() << "a CUDA device is visible here";
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message().rfind("--device cuda: ", 0), 0u) << st.message();
  EXPECT_EQ(std::string(st.message()).find('\n'), std::string::npos);
  TinyModel tiny = LoadTinyModel(DefaultTinyShape(), 3);
  ExecutorOptions options;
  options.device = Device::kCuda;
  options.num_blocks = 8;
  auto ex = MakeExecutor(tiny.model.get(), options);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kFailedPrecondition);
}

class CpuExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tiny_ = LoadTinyModel(DefaultTinyShape(), 5);
    ExecutorOptions options;
    options.num_blocks = 8;
    options.block_size = 16;
    auto ex = MakeExecutor(tiny_.model.get(), options);
    ASSERT_TRUE(ex.ok()) << ex.status();
    executor_ = std::move(*ex);
  }
  ForwardBatch Prompt(int n, std::vector<int32_t> table) {
    ForwardBatch b;
    const std::vector<int32_t> tokens = RandomPrompt(n, 256, 9);
    for (int i = 0; i < n; ++i) {
      b.token_ids.push_back(tokens[i]);
      b.positions.push_back(i);
      b.slot_mapping.push_back(int64_t{table[i / 16]} * 16 + i % 16);
    }
    b.query_start = {0, n};
    b.context_lens = {n};
    b.block_tables = {table};
    b.logits_indices = {n - 1};
    return b;
  }
  TinyModel tiny_;
  std::unique_ptr<Executor> executor_;
};

TEST_F(CpuExecutorTest, ForwardEqualsTheModelsForward) {
  EXPECT_EQ(executor_->device(), Device::kCpu);
  EXPECT_NE(executor_->Describe().find("cpu"), std::string::npos);
  const ForwardBatch b = Prompt(21, {5, 2});
  const int64_t vocab = tiny_.model->config().vocab_size;
  std::vector<float> got(vocab), want(vocab);
  ASSERT_TRUE(executor_->Forward(b, got.data()).ok());
  auto cache = tiny_.model->MakeKvCache(8, 16);
  ASSERT_TRUE(tiny_.model->Forward(b, cache->get(), want.data()).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), vocab * sizeof(float)), 0);
}

TEST_F(CpuExecutorTest, InvalidBatchIsAnError) {
  ForwardBatch b = Prompt(4, {1});
  b.slot_mapping[2] = 999;
  std::vector<float> logits(tiny_.model->config().vocab_size);
  EXPECT_EQ(executor_->Forward(b, logits.data()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuExecutorTest, KvReadWriteRoundTripsAndMovesBetweenSlots) {
  const ForwardBatch b = Prompt(20, {3, 6});
  std::vector<float> logits(tiny_.model->config().vocab_size);
  ASSERT_TRUE(executor_->Forward(b, logits.data()).ok());
  const int64_t bpt = executor_->kv_shape().interchange_bytes_per_token();
  std::string bytes(20 * bpt, '\0');
  ASSERT_TRUE(executor_->ReadKv(b.slot_mapping, bytes.data()).ok());
  // The computed K/V is not all zeros.
  EXPECT_NE(bytes.find_first_not_of('\0'), std::string::npos);
  // Write into other slots (blocks 0 and 1), read back: identical.
  std::vector<int64_t> other(20);
  std::iota(other.begin(), other.end(), 0);
  ASSERT_TRUE(executor_->WriteKv(other, bytes.data()).ok());
  std::string back(bytes.size(), '\0');
  ASSERT_TRUE(executor_->ReadKv(other, back.data()).ok());
  EXPECT_EQ(back, bytes);
  // Block copy 3 -> 7 makes block 7's first 16 slots equal block 3's.
  const BlockCopy copy{3, 7};
  ASSERT_TRUE(executor_->CopyBlocks({&copy, 1}).ok());
  std::vector<int64_t> b7(16);
  std::iota(b7.begin(), b7.end(), 7 * 16);
  std::string seven(16 * bpt, '\0');
  ASSERT_TRUE(executor_->ReadKv(b7, seven.data()).ok());
  EXPECT_EQ(seven, bytes.substr(0, 16 * bpt));
}

TEST_F(CpuExecutorTest, BadSlotsAndCopiesAreErrors) {
  const int64_t bpt = executor_->kv_shape().interchange_bytes_per_token();
  std::string buf(2 * bpt, '\0');
  const std::vector<int64_t> bad = {0, 8 * 16};
  EXPECT_EQ(executor_->ReadKv(bad, buf.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(executor_->WriteKv(std::vector<int64_t>{-1, 0}, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  const BlockCopy copy{-1, 2};
  EXPECT_EQ(executor_->CopyBlocks({&copy, 1}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuExecutorTest, ImportOfForeignGeometryIsAnError) {
  KvExport e;
  e.token_ids = {1, 2};
  e.num_layers = executor_->kv_shape().num_layers + 1;
  e.num_kv_heads = executor_->kv_shape().layout.num_kv_heads;
  e.head_dim = executor_->kv_shape().layout.head_dim;
  e.bytes_per_token = KvExport::BytesPerToken(e.num_layers, e.num_kv_heads, e.head_dim);
  e.bytes.assign(2 * e.bytes_per_token, '\0');
  KvCacheManager kv(8, 16, false);
  const absl::Status st = ImportKv(e, 0, 2, kv, 1, *executor_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
}

// Every KV dtype: the interchange carries the native bytes (scales
// included), so read -> write elsewhere -> read is identical and a block
// copy copies scales too; logits stay close to the f32 cache's.
TEST_F(CpuExecutorTest, EveryKvDtypeRoundTripsNativeBytes) {
  const ForwardBatch b = Prompt(20, {3, 6});
  const int64_t vocab = tiny_.model->config().vocab_size;
  std::vector<float> f32_logits(vocab);
  ASSERT_TRUE(executor_->Forward(b, f32_logits.data()).ok());
  for (KvDtype d : {KvDtype::kF16, KvDtype::kBf16, KvDtype::kInt8, KvDtype::kFp8}) {
    SCOPED_TRACE(kernels::KvDtypeName(d));
    ExecutorOptions options;
    options.num_blocks = 8;
    options.kv_dtype = d;
    auto ex = MakeExecutor(tiny_.model.get(), options);
    ASSERT_TRUE(ex.ok()) << ex.status();
    const KvCacheShape& shape = (*ex)->kv_shape();
    EXPECT_EQ(shape.dtype, d);
    EXPECT_NE((*ex)->Describe().find(kernels::KvDtypeName(d)), std::string::npos);
    const int64_t bpt = shape.bytes_per_token();
    EXPECT_EQ(bpt, kernels::KvBytesPerToken(d, shape.num_layers, shape.layout.num_kv_heads,
                                            shape.layout.head_dim));
    EXPECT_EQ((*ex)->kv_cache_bytes(), 8 * 16 * bpt);
    std::vector<float> logits(vocab);
    ASSERT_TRUE((*ex)->Forward(b, logits.data()).ok());
    double max_diff = 0, max_abs = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      max_diff = std::max(max_diff, double(std::fabs(logits[i] - f32_logits[i])));
      max_abs = std::max(max_abs, double(std::fabs(f32_logits[i])));
    }
    EXPECT_GT(max_diff, 0.0);  // the cache really is another dtype
    std::printf("%s: max logit diff vs f32 %.3g (max logit %.3g)\n", kernels::KvDtypeName(d),
                max_diff, max_abs);
    EXPECT_LT(max_diff, (d == KvDtype::kFp8 ? 0.1 : 0.02) * max_abs);
    std::string bytes(20 * bpt, '\0');
    ASSERT_TRUE((*ex)->ReadKv(b.slot_mapping, bytes.data()).ok());
    std::vector<int64_t> other(20);
    std::iota(other.begin(), other.end(), 0);
    ASSERT_TRUE((*ex)->WriteKv(other, bytes.data()).ok());
    std::string back(bytes.size(), '\0');
    ASSERT_TRUE((*ex)->ReadKv(other, back.data()).ok());
    EXPECT_EQ(back, bytes);
    const BlockCopy copy{3, 7};
    ASSERT_TRUE((*ex)->CopyBlocks({&copy, 1}).ok());
    std::vector<int64_t> b7(16);
    std::iota(b7.begin(), b7.end(), 7 * 16);
    std::string seven(16 * bpt, '\0');
    ASSERT_TRUE((*ex)->ReadKv(b7, seven.data()).ok());
    EXPECT_EQ(seven, bytes.substr(0, 16 * bpt));
    // The same K/V read after a copy runs the same attention: identical logits.
    std::vector<float> again(vocab);
    ForwardBatch decode;
    decode.token_ids = {7};
    decode.positions = {20};
    decode.slot_mapping = {6 * 16 + 4};
    decode.query_start = {0, 1};
    decode.context_lens = {21};
    decode.block_tables = {{3, 6}};
    decode.logits_indices = {0};
    ForwardBatch copied = decode;
    copied.slot_mapping = {1 * 16 + 4};
    copied.block_tables = {{7, 1}};
    // Block 1 holds tokens 16..19 after the WriteKv into slots 0..19.
    ASSERT_TRUE((*ex)->Forward(decode, logits.data()).ok());
    ASSERT_TRUE((*ex)->Forward(copied, again.data()).ok());
    EXPECT_EQ(std::memcmp(logits.data(), again.data(), vocab * sizeof(float)), 0);
  }
}

TEST(KvDtypeDeviceTest, CudaHoldsF32F16AndBf16) {
  EXPECT_TRUE(CheckKvDtypeSupported(Device::kCpu, KvDtype::kFp8).ok());
  for (KvDtype d : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBf16}) {
    EXPECT_TRUE(CheckKvDtypeSupported(Device::kCuda, d).ok()) << kernels::KvDtypeName(d);
  }
  for (KvDtype d : {KvDtype::kInt8, KvDtype::kFp8}) {
    const absl::Status st = CheckKvDtypeSupported(Device::kCuda, d);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(
        st.message().rfind(absl::StrCat("--kv-cache-dtype ", kernels::KvDtypeName(d), ": "), 0), 0u)
        << st.message();
  }
  EXPECT_EQ(DefaultKvDtype(Device::kCuda), KvDtype::kF32);
  EXPECT_EQ(DefaultKvDtype(Device::kCpu), KvDtype::kF16);
}

}  // namespace
}  // namespace tandem::engine
