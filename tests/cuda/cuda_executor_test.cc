// The CUDA executor against the CPU executor (KernelMode::kReference) on tiny
// random models: logits, 32 greedy steps, the bf16 GEMM prefill path, a batch
// of many against each sequence alone, KV read / write / block copies, bad
// input as errors, and the no-device error. Skips without a device, except
// the NoDevice test.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"
#include "engine/cpu_executor.h"
#include "engine/executor.h"
#include "engine/kv_export.h"
#include "engine/llama_model.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/quant.h"
#include "tests/util/tiny_llama.h"

namespace tandem::engine {
namespace {

#define REQUIRE_DEVICE() \
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

struct Tiny {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

Tiny LoadReference(const testing::TinyLlamaShape& shape, uint32_t seed) {
  Tiny t;
  auto file = gguf::GgufFile::FromBuffer(testing::MakeRandomLlamaGguf(shape, seed));
  TANDEM_CHECK(file.ok());
  t.file = std::move(*file);
  LoadOptions options;
  options.prefault = false;
  options.kernels = KernelMode::kReference;
  auto model = LlamaModel::Load(*t.file, options);
  TANDEM_CHECK(model.ok());
  t.model = std::move(*model);
  return t;
}

// llama: head_dim 64, GQA 4, Q4_1 matrices, Q8_0 tied embedding (the tiny
// defaults); qwen2: qkv bias, NeoX rope, GQA 3, Q4_0 matrices, Q8_0 output.
testing::TinyLlamaShape Shape(const std::string& arch = "llama") {
  testing::TinyLlamaShape s;
  s.vocab = 256;
  s.context = 1024;
  s.hidden = 256;
  s.ffn = 192;
  s.num_heads = 4;
  s.num_kv_heads = 1;
  if (arch == "qwen2") {
    s.arch = "qwen2";
    s.qkv_bias = true;
    s.hidden = 384;
    s.num_heads = 6;
    s.num_kv_heads = 2;
    s.tied = false;
    s.matrix_type = gguf::TensorType::kQ4_0;
  }
  return s;
}

std::unique_ptr<Executor> Make(const LlamaModel* model, Device device, int64_t num_blocks = 64,
                               int64_t block_size = 16, bool cuda_graphs = true,
                               KvDtype kv_dtype = KvDtype::kF32) {
  ExecutorOptions o;
  o.kv_dtype = kv_dtype;
  o.cuda_graphs = cuda_graphs;
  o.device = device;
  o.num_blocks = num_blocks;
  o.block_size = block_size;
  auto ex = MakeExecutor(model, o);
  if (!ex.ok()) std::cerr << "MakeExecutor: " << ex.status() << "\n";
  TANDEM_CHECK(ex.ok());
  return std::move(*ex);
}

// A sequence with preassigned blocks; Append adds its next tokens to a batch.
struct Seq {
  std::vector<int32_t> blocks;
  int64_t len = 0;
};

void Append(Seq& s, const std::vector<int32_t>& tokens, int64_t block_size, ForwardBatch* b) {
  if (b->query_start.empty()) b->query_start.push_back(0);
  for (int32_t tok : tokens) {
    b->token_ids.push_back(tok);
    b->positions.push_back(static_cast<int32_t>(s.len));
    b->slot_mapping.push_back(int64_t(s.blocks[s.len / block_size]) * block_size +
                              s.len % block_size);
    ++s.len;
  }
  b->query_start.push_back(static_cast<int32_t>(b->token_ids.size()));
  b->context_lens.push_back(static_cast<int32_t>(s.len));
  b->block_tables.push_back(s.blocks);
  b->logits_indices.push_back(static_cast<int32_t>(b->token_ids.size() - 1));
}

double Kl(const float* p_logits, const float* q_logits, int64_t n) {
  auto logsoftmax = [n](const float* x) {
    const float mx = *std::max_element(x, x + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
    std::vector<double> out(n);
    for (int64_t i = 0; i < n; ++i) out[i] = double(x[i]) - mx - std::log(sum);
    return out;
  };
  const auto lp = logsoftmax(p_logits), lq = logsoftmax(q_logits);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

int32_t Argmax(const float* x, int64_t n) { return int32_t(std::max_element(x, x + n) - x); }

class CudaExecutorTest : public ::testing::TestWithParam<std::string> {};

// An 8-token prompt (the Gemv path: f32 math) then 32 greedy steps, each
// executor feeding back its own choice: identical tokens, small KL.
TEST_P(CudaExecutorTest, GreedyDecodeMatchesCpuReferenceFor32Steps) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(GetParam()), 21);
  const int64_t V = tiny.model->config().vocab_size;
  auto cpu = Make(tiny.model.get(), Device::kCpu);
  auto gpu = Make(tiny.model.get(), Device::kCuda);
  Seq sc{{5, 2, 9, 7}}, sg = sc;
  std::vector<int32_t> prompt = {1, 17, 200, 3, 45, 99, 12, 250};
  std::vector<float> lc(V), lg(V);
  std::vector<int32_t> next_c = prompt, next_g = prompt;
  double max_kl = 0;
  for (int step = 0; step <= 32; ++step) {
    ForwardBatch bc, bg;
    Append(sc, next_c, 16, &bc);
    Append(sg, next_g, 16, &bg);
    ASSERT_TRUE(cpu->Forward(bc, lc.data()).ok());
    const absl::Status st = gpu->Forward(bg, lg.data());
    ASSERT_TRUE(st.ok()) << st;
    max_kl = std::max(max_kl, Kl(lc.data(), lg.data(), V));
    next_c = {Argmax(lc.data(), V)};
    next_g = {Argmax(lg.data(), V)};
    ASSERT_EQ(next_c, next_g) << "step " << step;
  }
  EXPECT_LT(max_kl, 1e-4);
}

// A 40-token prompt runs on the bf16 tensor-core GEMM: all rows' logits close.
TEST_P(CudaExecutorTest, GemmPrefillLogitsMatchCpuReference) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(GetParam()), 22);
  const int64_t V = tiny.model->config().vocab_size;
  auto cpu = Make(tiny.model.get(), Device::kCpu, 64, 32);
  auto gpu = Make(tiny.model.get(), Device::kCuda, 64, 32);
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 5) % V);
  Seq s{{3, 1}};
  ForwardBatch b;
  Append(s, prompt, 32, &b);
  b.logits_indices.resize(40);
  std::iota(b.logits_indices.begin(), b.logits_indices.end(), 0);
  std::vector<float> lc(40 * V), lg(40 * V);
  ASSERT_TRUE(cpu->Forward(b, lc.data()).ok());
  ASSERT_TRUE(gpu->Forward(b, lg.data()).ok());
  double sum_kl = 0;
  int agree = 0;
  for (int64_t r = 0; r < 40; ++r) {
    sum_kl += Kl(&lc[r * V], &lg[r * V], V);
    agree += Argmax(&lc[r * V], V) == Argmax(&lg[r * V], V);
  }
  EXPECT_LT(sum_kl / 40, 2e-3);
  EXPECT_GE(agree, 36);
}

// Six sequences in one batch (prompts of 3..23 tokens, then a decode token
// each) give the logits each gives alone, within the bf16 GEMM's error.
TEST_P(CudaExecutorTest, BatchOfManyMatchesEachAlone) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(GetParam()), 23);
  const int64_t V = tiny.model->config().vocab_size;
  auto together = Make(tiny.model.get(), Device::kCuda);
  std::vector<Seq> seqs(6);
  for (int i = 0; i < 6; ++i) seqs[i].blocks = {int32_t(2 * i), int32_t(2 * i + 1)};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(std::vector<int32_t>(3 + 4 * i));
    for (size_t j = 0; j < prompts[i].size(); ++j) prompts[i][j] = int32_t((i * 31 + j * 7) % V);
  }
  // Step 1: all prompts together; step 2: one decode token each together.
  for (int step = 0; step < 2; ++step) {
    ForwardBatch b;
    std::vector<Seq> before = seqs;
    for (int i = 0; i < 6; ++i)
      Append(seqs[i], step == 0 ? prompts[i] : std::vector<int32_t>{7}, 16, &b);
    std::vector<float> lt(6 * V);
    ASSERT_TRUE(together->Forward(b, lt.data()).ok());
    for (int i = 0; i < 6; ++i) {
      auto alone = Make(tiny.model.get(), Device::kCuda);
      Seq s = seqs[i];
      s.len = 0;
      ForwardBatch p;
      Append(s, prompts[i], 16, &p);
      std::vector<float> la(V);
      ASSERT_TRUE(alone->Forward(p, la.data()).ok());
      if (step == 1) {
        ForwardBatch d;
        Append(s, {7}, 16, &d);
        ASSERT_TRUE(alone->Forward(d, la.data()).ok());
      }
      // Not bit-identical: above kGemvMaxTokens tokens a step runs on the
      // bf16 GEMM, so a sequence's numerics depend on the batch size.
      EXPECT_LT(Kl(la.data(), &lt[i * V], V), 5e-3) << "seq " << i << " step " << step;
      std::vector<float> sorted(la);
      std::sort(sorted.rbegin(), sorted.rend());
      if (sorted[0] - sorted[1] > 0.1f) {
        EXPECT_EQ(Argmax(la.data(), V), Argmax(&lt[i * V], V)) << "seq " << i << " step " << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaExecutorTest, ::testing::Values("llama", "qwen2"));

TEST(CudaExecutorKvTest, ReadWriteCopyBlocksAndBadInput) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(), 24);
  auto cpu = Make(tiny.model.get(), Device::kCpu, 16, 16);
  auto gpu = Make(tiny.model.get(), Device::kCuda, 16, 16);
  EXPECT_EQ(gpu->device(), Device::kCuda);
  EXPECT_EQ(gpu->kv_shape().layout.num_blocks, 16);
  Seq s{{4, 9}}, s2 = s;
  ForwardBatch b, b2;
  Append(s, {1, 2, 3, 4, 5, 6}, 16, &b);
  Append(s2, {1, 2, 3, 4, 5, 6}, 16, &b2);
  std::vector<float> l(256);
  ASSERT_TRUE(cpu->Forward(b, l.data()).ok());
  ASSERT_TRUE(gpu->Forward(b2, l.data()).ok());
  const int64_t per = gpu->kv_shape().interchange_bytes_per_token() / 4;
  std::vector<float> kc(6 * per), kg(6 * per);
  ASSERT_TRUE(cpu->ReadKv(b.slot_mapping, reinterpret_cast<char*>(kc.data())).ok());
  ASSERT_TRUE(gpu->ReadKv(b2.slot_mapping, reinterpret_cast<char*>(kg.data())).ok());
  for (size_t i = 0; i < kc.size(); ++i)
    ASSERT_NEAR(kg[i], kc[i], 1e-4f * (1 + std::fabs(kc[i]))) << i;
  // WriteKv then ReadKv round trip, exact.
  std::vector<float> data(3 * per);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 977) * 0.25f;
  const std::vector<int64_t> slots = {0, 255, 17};
  ASSERT_TRUE(gpu->WriteKv(slots, reinterpret_cast<const char*>(data.data())).ok());
  std::vector<float> back(3 * per);
  ASSERT_TRUE(gpu->ReadKv(slots, reinterpret_cast<char*>(back.data())).ok());
  EXPECT_EQ(back, data);
  // Block 4 -> block 1: slot 16 + i now holds slot 64 + i.
  const BlockCopy copy{4, 1};
  ASSERT_TRUE(gpu->CopyBlocks({&copy, 1}).ok());
  std::vector<int64_t> src(16), dst(16);
  std::iota(src.begin(), src.end(), 64);
  std::iota(dst.begin(), dst.end(), 16);
  std::vector<float> a(16 * per), c(16 * per);
  ASSERT_TRUE(gpu->ReadKv(src, reinterpret_cast<char*>(a.data())).ok());
  ASSERT_TRUE(gpu->ReadKv(dst, reinterpret_cast<char*>(c.data())).ok());
  EXPECT_EQ(a, c);
  // Bad input: errors, not crashes.
  const std::vector<int64_t> bad = {256};
  EXPECT_EQ(gpu->ReadKv(bad, reinterpret_cast<char*>(back.data())).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->WriteKv(bad, reinterpret_cast<const char*>(data.data())).code(),
            absl::StatusCode::kInvalidArgument);
  const BlockCopy bad_copy{0, 16};
  EXPECT_EQ(gpu->CopyBlocks({&bad_copy, 1}).code(), absl::StatusCode::kInvalidArgument);
  ForwardBatch wrong = b2;
  wrong.slot_mapping[0] = 3;
  EXPECT_EQ(gpu->Forward(wrong, l.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(gpu->Describe().empty());
}

// f16 and bf16 KV caches on the device against the CPU executor with the
// same dtype: both feed the CPU's greedy token (so one near tie cannot
// derail the comparison), every step's logits close (KL), nearly every
// argmax the same, and the cache bytes after the prompt within one unit in
// the last place of the dtype (the K/V before rounding differ by f32
// arithmetic only). The cache is 2 bytes an element: kv_cache_bytes halves.
TEST(CudaExecutorKvTest, F16AndBf16CachesMatchTheCpuExecutor) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(), 25);
  const int64_t V = tiny.model->config().vocab_size;
  const int64_t f32_bytes = Make(tiny.model.get(), Device::kCuda)->kv_cache_bytes();
  for (KvDtype d : {KvDtype::kF16, KvDtype::kBf16}) {
    SCOPED_TRACE(kernels::KvDtypeName(d));
    auto cpu = Make(tiny.model.get(), Device::kCpu, 64, 16, true, d);
    auto gpu = Make(tiny.model.get(), Device::kCuda, 64, 16, true, d);
    EXPECT_EQ(gpu->kv_shape().dtype, d);
    EXPECT_EQ(gpu->kv_cache_bytes() * 2, f32_bytes);
    EXPECT_EQ(gpu->kv_shape().interchange_bytes_per_token(),
              cpu->kv_shape().interchange_bytes_per_token());
    Seq sc{{5, 2, 9, 7}}, sg = sc;
    std::vector<int32_t> next = {1, 17, 200, 3, 45, 99, 12, 250, 31, 8};
    std::vector<float> lc(V), lg(V);
    double max_kl = 0;
    int same = 0;
    for (int step = 0; step <= 32; ++step) {
      ForwardBatch bc, bg;
      Append(sc, next, 16, &bc);
      Append(sg, next, 16, &bg);
      ASSERT_TRUE(cpu->Forward(bc, lc.data()).ok());
      const absl::Status st = gpu->Forward(bg, lg.data());
      ASSERT_TRUE(st.ok()) << st;
      if (step == 0) {
        // The prompt's K/V bytes: each 2-byte element within one unit.
        const int64_t per = gpu->kv_shape().interchange_bytes_per_token() / 2;
        std::vector<uint16_t> kc(next.size() * per), kg(kc.size());
        ASSERT_TRUE(cpu->ReadKv(bc.slot_mapping, reinterpret_cast<char*>(kc.data())).ok());
        ASSERT_TRUE(gpu->ReadKv(bg.slot_mapping, reinterpret_cast<char*>(kg.data())).ok());
        const auto value = [d](uint16_t x) {
          return d == KvDtype::kF16 ? kernels::Fp16ToFp32(x) : kernels::Bf16ToFp32(x);
        };
        const float ulp = d == KvDtype::kF16 ? 0x1p-10f : 0x1p-7f;
        int64_t differ = 0;
        for (size_t i = 0; i < kc.size(); ++i) {
          const float a = value(kc[i]), b = value(kg[i]);
          ASSERT_LE(std::fabs(a - b), ulp * std::max(std::fabs(a), std::fabs(b)) + 1e-7f) << i;
          differ += kc[i] != kg[i];
        }
        EXPECT_LT(differ * 100, int64_t(kc.size())) << "over 1% of the elements differ";
      }
      max_kl = std::max(max_kl, Kl(lc.data(), lg.data(), V));
      same += Argmax(lc.data(), V) == Argmax(lg.data(), V);
      next = {Argmax(lc.data(), V)};
    }
    EXPECT_LT(max_kl, 1e-3);
    EXPECT_GE(same, 31);
  }
}

// The device forms (the GPU-resident KV handoff): ReadKvDevice into an
// AllocKvDevice buffer and WriteKvDevice of it into other slots move exactly
// the bytes ReadKv / WriteKv move through the host; the buffer is in the
// executor's domain "cuda:N"; bad slots are errors.
TEST(CudaExecutorKvTest, DeviceReadWriteEqualTheHostForms) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(), 24);
  auto gpu = Make(tiny.model.get(), Device::kCuda, 16, 16);
  EXPECT_EQ(gpu->kv_memory_domain(), "cuda:0");
  const int64_t per = gpu->kv_shape().interchange_bytes_per_token() / 4;
  std::vector<float> data(5 * per);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 1013) * 0.5f - 7.f;
  const std::vector<int64_t> from = {3, 200, 17, 18, 64}, to = {255, 0, 99, 100, 16};
  ASSERT_TRUE(gpu->WriteKv(from, reinterpret_cast<const char*>(data.data())).ok());
  auto buf = gpu->AllocKvDevice(5 * per * 4);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ((*buf)->domain(), "cuda:0");
  EXPECT_EQ((*buf)->size(), 5 * per * 4);
  ASSERT_TRUE(gpu->ReadKvDevice(from, (*buf)->data()).ok());
  ASSERT_TRUE(gpu->WriteKvDevice(to, (*buf)->data()).ok());
  std::vector<float> back(5 * per);
  ASSERT_TRUE(gpu->ReadKv(to, reinterpret_cast<char*>(back.data())).ok());
  EXPECT_EQ(back, data);
  const std::vector<int64_t> bad = {256};
  EXPECT_EQ(gpu->ReadKvDevice(bad, (*buf)->data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu->WriteKvDevice(bad, (*buf)->data()).code(), absl::StatusCode::kInvalidArgument);
}

// Decode steps replayed from CUDA graphs (batch sizes padded up to 1, 2, 4,
// 8; contexts crossing attention-split buckets) give the eager executor's
// logits bit for bit, and leave the engine's blocks as eager steps do.
TEST_P(CudaExecutorTest, GraphDecodeStepsEqualEagerSteps) {
  REQUIRE_DEVICE();
  const Tiny tiny = LoadReference(Shape(GetParam()), 26);
  const int64_t V = tiny.model->config().vocab_size;
  auto graphs = Make(tiny.model.get(), Device::kCuda, 160, 16, /*cuda_graphs=*/true);
  auto eager = Make(tiny.model.get(), Device::kCuda, 160, 16, /*cuda_graphs=*/false);
  constexpr int kSeqs = 6;
  std::vector<Seq> sg(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    for (int k = 0; k < 24; ++k) sg[i].blocks.push_back(int32_t(i * 24 + k));
  }
  std::vector<Seq> se = sg;
  // Prompts of 3 .. 253 tokens (eager in both), then decode steps over a
  // varying number of the sequences, past 256 tokens of context.
  for (int i = 0; i < kSeqs; ++i) {
    std::vector<int32_t> prompt(3 + 50 * i);
    for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = int32_t((i * 13 + j * 5) % V);
    ForwardBatch bg, be;
    Append(sg[i], prompt, 16, &bg);
    Append(se[i], prompt, 16, &be);
    std::vector<float> lg(V), le(V);
    ASSERT_TRUE(graphs->Forward(bg, lg.data()).ok());
    ASSERT_TRUE(eager->Forward(be, le.data()).ok());
    ASSERT_EQ(lg, le);
  }
  for (int step = 0; step < 40; ++step) {
    const int n = 1 + (step * 5) % kSeqs;  // 1, 6, 5, 4, 3, 2, 1, ...
    ForwardBatch bg, be;
    for (int i = 0; i < n; ++i) {
      const int32_t tok = int32_t((step * 7 + i) % V);
      Append(sg[i], {tok}, 16, &bg);
      Append(se[i], {tok}, 16, &be);
    }
    std::vector<float> lg(n * V), le(n * V);
    const absl::Status st = graphs->Forward(bg, lg.data());
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(eager->Forward(be, le.data()).ok());
    ASSERT_EQ(lg, le) << "step " << step << ", " << n << " sequences";
  }
  // The padding wrote only the scratch block: every engine block's K/V equal.
  std::vector<int64_t> slots(160 * 16);
  std::iota(slots.begin(), slots.end(), 0);
  const int64_t per = graphs->kv_shape().interchange_bytes_per_token();
  std::vector<char> kg(slots.size() * per), ke(slots.size() * per);
  ASSERT_TRUE(graphs->ReadKv(slots, kg.data()).ok());
  ASSERT_TRUE(eager->ReadKv(slots, ke.data()).ok());
  EXPECT_EQ(kg, ke);
}

TEST(CudaExecutorTest, NoDeviceIsAClearError) {
  if (kernels::cuda::DeviceCount() > 0) GTEST_SKIP() << "a device is present (NoDevice case)";
  const Tiny tiny = LoadReference(Shape(), 25);
  ExecutorOptions o;
  o.device = Device::kCuda;
  o.num_blocks = 8;
  auto ex = MakeExecutor(tiny.model.get(), o);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(ex.status().message());
  EXPECT_EQ(msg.rfind("--device cuda: no CUDA device is visible (cudaGetDeviceCount: ", 0), 0u)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  std::cout << "message: " << msg << "\n";
}

}  // namespace
}  // namespace tandem::engine
