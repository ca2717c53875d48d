// SmolLM2-135M-Instruct (the bundled Q4_1 file) on the CUDA executor against
// the transformers f32 goldens (tests/data/logits_smollm2.json, which the CPU
// reference path matches in llama_model_test):
//  - every golden prompt: mean KL of the prompt's logits < 1e-3 and the first
//    32 greedy tokens identical, with the default MatMul (bf16 tensor-core
//    GEMM above 8 tokens a step) and batch invariant (the f32 GEMV always),
//    each also with int8 activations on the Gemv (GemvInt8);
//  - 64 sequences in one batch get the greedy tokens each gets alone:
//    bit-identical when batch invariant; with the default MatMul the number
//    of sequences that differ is printed (activations are rounded to bf16
//    above 8 tokens a step, so near-ties may flip).
// Skips without a device or without the model file ($TANDEM_MODEL).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/status.h"
#include "engine/executor.h"
#include "engine/llama_model.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/util/golden_kl.h"
#include "tests/util/json_reader.h"
#include "tests/util/test_paths.h"

namespace tandem::engine {
namespace {

using testing::Json;

constexpr int64_t kBlockSize = 16;
constexpr size_t kGreedyTokens = 32;

struct Model {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

// Null (the test skips) without a device or the file.
std::unique_ptr<Model> LoadSmolLm2() {
  if (kernels::cuda::DeviceCount() == 0) return nullptr;
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) return nullptr;
  auto m = std::make_unique<Model>();
  auto file = gguf::GgufFile::Open(path);
  TANDEM_CHECK(file.ok());
  m->file = std::move(*file);
  LoadOptions options;
  options.prefault = false;
  options.kernels = KernelMode::kReference;
  auto model = LlamaModel::Load(*m->file, options);
  TANDEM_CHECK(model.ok());
  m->model = std::move(*model);
  return m;
}

#define REQUIRE_MODEL(m)                                                             \
  if ((m) == nullptr) {                                                              \
    GTEST_SKIP() << "no CUDA device or no model at " << testing::DefaultModelPath(); \
  }

// The MatMul modes the tests run: the default, batch invariant, and each
// with the int8-activation Gemv (GemvInt8).
struct Mode {
  bool batch_invariant = false;
  bool int8_acts = false;
};

std::unique_ptr<Executor> MakeCuda(const LlamaModel* model, int64_t num_blocks, Mode mode) {
  ExecutorOptions o;
  o.device = Device::kCuda;
  o.num_blocks = num_blocks;
  o.block_size = kBlockSize;
  o.batch_invariant = mode.batch_invariant;
  o.int8_activations = mode.int8_acts;
  auto ex = MakeExecutor(model, o);
  if (!ex.ok()) std::fprintf(stderr, "MakeExecutor: %s\n", ex.status().ToString().c_str());
  TANDEM_CHECK(ex.ok());
  return std::move(*ex);
}

// A sequence on blocks first_block, first_block + 1, ...
struct Seq {
  int32_t first_block = 0;
  int64_t len = 0;
};

void Append(Seq& s, const std::vector<int32_t>& tokens, ForwardBatch* b) {
  if (b->query_start.empty()) b->query_start.push_back(0);
  for (int32_t tok : tokens) {
    b->token_ids.push_back(tok);
    b->positions.push_back(static_cast<int32_t>(s.len));
    b->slot_mapping.push_back((s.first_block + s.len / kBlockSize) * kBlockSize +
                              s.len % kBlockSize);
    ++s.len;
  }
  b->query_start.push_back(static_cast<int32_t>(b->token_ids.size()));
  b->context_lens.push_back(static_cast<int32_t>(s.len));
  std::vector<int32_t> table;
  for (int64_t i = 0; i < (s.len + kBlockSize - 1) / kBlockSize; ++i) {
    table.push_back(s.first_block + static_cast<int32_t>(i));
  }
  b->block_tables.push_back(table);
  b->logits_indices.push_back(static_cast<int32_t>(b->token_ids.size() - 1));
}

int32_t Argmax(const float* x, int64_t n) { return int32_t(std::max_element(x, x + n) - x); }

using testing::GoldenKl;

Json Goldens() {
  return Json::Parse(testing::ReadFileOrEmpty(testing::TestDataPath("logits_smollm2.json")));
}

class CudaSmolLm2Test : public ::testing::TestWithParam<Mode> {};

TEST_P(CudaSmolLm2Test, LogitsAndGreedyTokensMatchTransformers) {
  const auto m = LoadSmolLm2();
  REQUIRE_MODEL(m);
  const int64_t V = m->model->config().vocab_size;
  auto gpu = MakeCuda(m->model.get(), 64, GetParam());
  std::printf("%s\n", gpu->Describe().c_str());
  const Json golden = Goldens();
  ASSERT_GT(golden["cases"].size(), 0u);
  for (const Json& c : golden["cases"].array) {
    const std::vector<int32_t> ids = c["token_ids"].As<int32_t>();
    const std::vector<int32_t> want = c["greedy"].As<int32_t>();
    const int64_t T = ids.size();
    ASSERT_LE(T + int64_t(want.size()), 64 * kBlockSize);
    Seq s;
    ForwardBatch b;
    Append(s, ids, &b);
    b.logits_indices.clear();
    for (int32_t i = 0; i < T; ++i) b.logits_indices.push_back(i);
    std::vector<float> logits(T * V);
    const absl::Status st = gpu->Forward(b, logits.data());
    ASSERT_TRUE(st.ok()) << st;
    double sum_kl = 0, max_kl = 0;
    for (int64_t t = 0; t < T; ++t) {
      const double kl = GoldenKl(c, t, &logits[t * V], V);
      sum_kl += kl;
      max_kl = std::max(max_kl, kl);
    }
    std::vector<int32_t> got = {Argmax(&logits[(T - 1) * V], V)};
    std::vector<float> row(V);
    while (got.size() < want.size()) {
      ForwardBatch d;
      Append(s, {got.back()}, &d);
      ASSERT_TRUE(gpu->Forward(d, row.data()).ok());
      got.push_back(Argmax(row.data(), V));
    }
    size_t same = 0;
    while (same < want.size() && got[same] == want[same]) ++same;
    std::printf("%-10s %3lld tokens: mean KL %.3g, max KL %.3g, greedy %zu/%zu identical\n",
                c["name"].str.c_str(), (long long)T, sum_kl / T, max_kl, same, want.size());
    EXPECT_LT(sum_kl / T, 1e-3) << c["name"].str;
    EXPECT_GE(same, std::min(kGreedyTokens, want.size())) << c["name"].str;
  }
}

// 64 prompts (the goldens' with different suffixes), 32 greedy tokens each:
// alone (one sequence a step) and all together (one prefill step of every
// prompt, then 31 steps of 64 decode tokens).
TEST_P(CudaSmolLm2Test, BatchOf64GivesEachSequenceItsTokensAlone) {
  const auto m = LoadSmolLm2();
  REQUIRE_MODEL(m);
  const bool invariant = GetParam().batch_invariant;
  const int64_t V = m->model->config().vocab_size;
  const Json golden = Goldens();
  const auto& cases = golden["cases"].array;
  constexpr int kSeqs = 64, kSteps = 32, kBlocksPerSeq = 8;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kSeqs; ++i) {
    std::vector<int32_t> p = cases[i % cases.size()]["token_ids"].As<int32_t>();
    if (p.size() > 64) p.resize(64);
    const std::vector<int32_t> other = cases[(i / 8 + 3) % cases.size()]["token_ids"].As<int32_t>();
    for (int k = 0; k < i / 8; ++k) p.push_back(other[k % other.size()]);
    prompts.push_back(p);
  }
  auto ex = MakeCuda(m->model.get(), kSeqs * kBlocksPerSeq, GetParam());
  std::vector<float> row(V);
  std::vector<std::vector<int32_t>> alone(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    Seq s{int32_t(i * kBlocksPerSeq), 0};
    std::vector<int32_t> next = prompts[i];
    for (int step = 0; step < kSteps; ++step) {
      ForwardBatch b;
      Append(s, next, &b);
      const absl::Status st = ex->Forward(b, row.data());
      ASSERT_TRUE(st.ok()) << st;
      next = {Argmax(row.data(), V)};
      alone[i].push_back(next[0]);
    }
  }
  std::vector<Seq> seqs(kSeqs);
  for (int i = 0; i < kSeqs; ++i) seqs[i].first_block = int32_t(i * kBlocksPerSeq);
  std::vector<std::vector<int32_t>> together(kSeqs);
  std::vector<float> rows(kSeqs * V);
  for (int step = 0; step < kSteps; ++step) {
    ForwardBatch b;
    for (int i = 0; i < kSeqs; ++i) {
      Append(seqs[i], step == 0 ? prompts[i] : std::vector<int32_t>{together[i].back()}, &b);
    }
    const absl::Status st = ex->Forward(b, rows.data());
    ASSERT_TRUE(st.ok()) << st;
    for (int i = 0; i < kSeqs; ++i) together[i].push_back(Argmax(&rows[i * V], V));
  }
  int differ = 0;
  for (int i = 0; i < kSeqs; ++i) {
    if (together[i] == alone[i]) continue;
    ++differ;
    size_t at = 0;
    while (together[i][at] == alone[i][at]) ++at;
    std::printf("sequence %d: batched differs from alone at token %zu\n", i, at);
  }
  std::printf("%s%s: %d of %d sequences differ between alone and a batch of %d\n",
              invariant ? "batch invariant" : "default MatMul",
              GetParam().int8_acts ? ", int8 activations" : "", differ, kSeqs, kSeqs);
  if (invariant) {
    EXPECT_EQ(differ, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(MatMul, CudaSmolLm2Test,
                         ::testing::Values(Mode{false, false}, Mode{true, false}, Mode{false, true},
                                           Mode{true, true}),
                         [](const auto& info) {
                           return std::string(info.param.batch_invariant ? "BatchInvariant"
                                                                         : "Default") +
                                  (info.param.int8_acts ? "Int8Acts" : "");
                         });

}  // namespace
}  // namespace tandem::engine
