// Forward pass: reference checks against HF transformers (SmolLM2 GGUF and a
// tiny random MHA model written by tools/golden_logits.py), and C++-only
// invariants on writer-built models (incremental decode through a scrambled
// paged cache, batch invariance, chunked prefill, validation errors).
//
// KL for SmolLM2: tests/util/golden_kl.h (the goldens keep the top-20
// logits and the logsumexp per position).
#include "engine/llama_model.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

#include "common/gguf/gguf.h"
#include "common/status.h"
#include "engine/single_sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/util/golden_kl.h"
#include "tests/util/json_reader.h"
#include "tests/util/test_paths.h"
#include "tests/util/tiny_llama.h"

namespace tandem::engine {
namespace {

using testing::Json;
using testing::TinyLlamaShape;

double LogSumExp(const float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
  return mx + std::log(s);
}

// Builds a one-sequence-per-entry batch. seqs[i] = (tokens, first position,
// block table); every token's logits are requested.
struct SeqSpec {
  std::vector<int32_t> tokens;
  int32_t start = 0;
  std::vector<int32_t> table;
};

ForwardBatch MakeBatch(const std::vector<SeqSpec>& seqs, int64_t block_size) {
  ForwardBatch b;
  b.query_start.push_back(0);
  for (const SeqSpec& s : seqs) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int32_t pos = s.start + int32_t(i);
      b.logits_indices.push_back(int32_t(b.token_ids.size()));
      b.token_ids.push_back(s.tokens[i]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(int64_t(s.table[pos / block_size]) * block_size + pos % block_size);
    }
    b.query_start.push_back(int32_t(b.token_ids.size()));
    b.context_lens.push_back(s.start + int32_t(s.tokens.size()));
    b.block_tables.push_back(s.table);
  }
  return b;
}

struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<LlamaModel> model;
};

Loaded LoadBytes(std::string bytes, ThreadPool* pool, KernelMode mode = KernelMode::kFast) {
  Loaded l;
  auto file = gguf::GgufFile::FromBuffer(std::move(bytes));
  TANDEM_CHECK(file.ok());
  l.file = std::move(*file);
  LoadOptions options{pool, false, {}};
  options.kernels = mode;
  auto model = LlamaModel::Load(*l.file, options);
  if (!model.ok()) ADD_FAILURE() << model.status();
  TANDEM_CHECK(model.ok());
  l.model = std::move(*model);
  return l;
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(rng() % vocab);
  return t;
}

// Logits [tokens, vocab] of running `spec` as a single batch on a fresh cache.
std::vector<float> RunAll(const LlamaModel& m, const std::vector<SeqSpec>& seqs,
                          int64_t num_blocks = 64) {
  auto cache = m.MakeKvCache(num_blocks);
  TANDEM_CHECK(cache.ok());
  ForwardBatch b = MakeBatch(seqs, 16);
  std::vector<float> logits(b.logits_indices.size() * m.config().vocab_size);
  absl::Status st = m.Forward(b, cache->get(), logits.data());
  EXPECT_TRUE(st.ok()) << st;
  return logits;
}

std::vector<int32_t> Identity(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = i;
  return t;
}

// Every model-level property holds on both kernel paths, for head_dim 16
// (the default shape: AttendOne), 128 with groups of 2 (llama_hd128) and 64
// with one KV head under 12 query heads (llama_mqa: the group kernel in
// parts of 8 and 4).
class TinyModelTest : public ::testing::TestWithParam<std::tuple<std::string, KernelMode>> {
 protected:
  void SetUp() override {
    TinyLlamaShape shape;
    shape.arch = std::get<0>(GetParam());
    if (shape.arch == "llama_hd128" || shape.arch == "llama_mqa") {
      const bool hd128 = shape.arch == "llama_hd128";
      shape.arch = "llama";
      shape.hidden = hd128 ? 256 : 768;
      shape.num_heads = hd128 ? 2 : 12;
      shape.num_kv_heads = 1;
    }
    shape.qkv_bias = shape.arch == "qwen2";
    shape_ = shape;
    l_ = LoadBytes(testing::MakeRandomLlamaGguf(shape, 42), &pool_, mode());
  }
  KernelMode mode() const { return std::get<1>(GetParam()); }
  const LlamaModel& model() { return *l_.model; }
  int64_t vocab() { return shape_.vocab; }

  ThreadPool pool_{3};
  TinyLlamaShape shape_;
  Loaded l_;
};

// Prefill of 40 tokens (identity table) == prefill of 9 then 31 decode steps
// through a scrambled block table, bit for bit.
TEST_P(TinyModelTest, IncrementalDecodeMatchesFullPrefill) {
  const std::vector<int32_t> tokens = RandomTokens(40, vocab(), 1);
  const std::vector<float> full = RunAll(model(), {{tokens, 0, Identity(3)}});
  const std::vector<int32_t> scrambled = {13, 2, 7};
  auto cache = model().MakeKvCache(16);
  ASSERT_TRUE(cache.ok());
  std::vector<float> inc;
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 9);
  ForwardBatch b = MakeBatch({{head, 0, scrambled}}, 16);
  std::vector<float> logits(9 * vocab());
  ASSERT_TRUE(model().Forward(b, cache->get(), logits.data()).ok());
  inc = logits;
  for (int32_t pos = 9; pos < 40; ++pos) {
    ForwardBatch d = MakeBatch({{{tokens[pos]}, pos, scrambled}}, 16);
    std::vector<float> one(vocab());
    ASSERT_TRUE(model().Forward(d, cache->get(), one.data()).ok());
    inc.insert(inc.end(), one.begin(), one.end());
  }
  ASSERT_EQ(inc.size(), full.size());
  EXPECT_EQ(inc, full);
}

// A sequence's logits are bit-identical alone, batched with two others, and
// with a different thread count.
TEST_P(TinyModelTest, BatchedEqualsAlone) {
  const std::vector<int32_t> a = RandomTokens(21, vocab(), 2);
  const std::vector<float> alone = RunAll(model(), {{a, 0, {5, 1}}});
  const std::vector<float> batched = RunAll(model(), {{RandomTokens(3, vocab(), 3), 0, {0}},
                                                      {a, 0, {5, 1}},
                                                      {RandomTokens(17, vocab(), 4), 0, {2, 3}}});
  ASSERT_EQ(batched.size(), (3 + 21 + 17) * vocab());
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batched.begin() + 3 * vocab()));

  ThreadPool pool1(1);
  Loaded single = LoadBytes(testing::MakeRandomLlamaGguf(shape_, 42), &pool1, mode());
  EXPECT_EQ(RunAll(*single.model, {{a, 0, {5, 1}}}), alone);
}

TEST_P(TinyModelTest, ChunkedPrefillIsBitIdentical) {
  const std::vector<int32_t> tokens = RandomTokens(35, vocab(), 5);
  const std::vector<float> full = RunAll(model(), {{tokens, 0, Identity(3)}});
  for (int64_t chunk : {1, 3, 16}) {
    auto runner = SingleSequenceRunner::Create(&model(), 64, chunk);
    ASSERT_TRUE(runner.ok());
    absl::StatusOr<std::vector<float>> last = (*runner)->Prefill(tokens);
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_TRUE(std::equal(last->begin(), last->end(), full.end() - vocab())) << chunk;
    // And the next decode step equals a longer prefill's last row.
    absl::StatusOr<std::vector<float>> next = (*runner)->DecodeStep(7);
    ASSERT_TRUE(next.ok());
    std::vector<int32_t> longer = tokens;
    longer.push_back(7);
    const std::vector<float> ref = RunAll(model(), {{longer, 0, Identity(3)}});
    EXPECT_TRUE(std::equal(next->begin(), next->end(), ref.end() - vocab())) << chunk;
  }
}

TEST_P(TinyModelTest, InvalidBatchesAreErrors) {
  auto cache = model().MakeKvCache(4);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits(8 * vocab());
  auto run = [&](ForwardBatch b) { return model().Forward(b, cache->get(), logits.data()); };
  const ForwardBatch good = MakeBatch({{{1, 2, 3}, 0, {2}}}, 16);
  ASSERT_TRUE(run(good).ok());
  ForwardBatch b = good;
  b.token_ids[1] = int32_t(vocab());
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.token_ids[1] = -1;
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.block_tables[0] = {4};  // block out of range
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.slot_mapping[2] = 5;  // not the block table's slot
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.positions[2] = 3;  // >= context_len
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.context_lens[0] = 20;  // beyond the block table
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.query_start = {0, 2};
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.logits_indices = {3};
  EXPECT_FALSE(run(b).ok());
  b = good;
  b.positions.pop_back();
  EXPECT_FALSE(run(b).ok());
  EXPECT_FALSE(model().Forward(good, nullptr, logits.data()).ok());
  auto runner = SingleSequenceRunner::Create(&model(), 4);
  ASSERT_TRUE(runner.ok());
  EXPECT_FALSE((*runner)->Prefill({1, 2, 3, 4, 5}).ok());
  EXPECT_FALSE((*runner)->Prefill({}).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Arch, TinyModelTest,
    ::testing::Combine(::testing::Values("llama", "qwen2", "llama_hd128", "llama_mqa"),
                       ::testing::Values(KernelMode::kFast, KernelMode::kReference)));

// ||a - ref|| / ||ref|| over all logits.
double RelativeRmsError(const std::vector<float>& a, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - ref[i]) * double(a[i] - ref[i]);
    norm += ref[i] * double(ref[i]);
  }
  return std::sqrt(err / norm);
}

// The tiny model's fast path actually runs packed, and stays close to the
// exact path (random weights: a loose bound, the real one is the goldens).
TEST(TinyModelFastTest, PackedAndCloseToReference) {
  ThreadPool pool(2);
  TinyLlamaShape shape;
  const std::string bytes = testing::MakeRandomLlamaGguf(shape, 42);
  Loaded fast = LoadBytes(bytes, &pool, KernelMode::kFast);
  Loaded ref = LoadBytes(bytes, &pool, KernelMode::kReference);
  EXPECT_EQ(fast.model->weights().num_packed_layers(), shape.num_layers);
  const std::vector<int32_t> a = RandomTokens(19, shape.vocab, 2);
  const std::vector<float> lf = RunAll(*fast.model, {{a, 0, {0, 1}}});
  const std::vector<float> lr = RunAll(*ref.model, {{a, 0, {0, 1}}});
  ASSERT_EQ(lf.size(), lr.size());
  EXPECT_LT(RelativeRmsError(lf, lr), 0.05);
  EXPECT_NE(lf, lr);  // really a different path
}

// Mixed matrix types in one layer (as K-quant files have them: Q|K in one
// type, V in another, gate and up apart): the layer is still packed, as
// PackedStack parts, and the stacked output equals the one-type stack's
// where the types agree.
TEST(TinyModelFastTest, MixedTypesArePackedInParts) {
  ThreadPool pool(2);
  TinyLlamaShape shape;
  shape.type_override = {{"attn_q.weight", gguf::TensorType::kQ5_0},
                         {"attn_k.weight", gguf::TensorType::kQ5_0},
                         {"attn_v.weight", gguf::TensorType::kQ8_0},
                         {"ffn_up.weight", gguf::TensorType::kQ4_0}};
  const std::string bytes = testing::MakeRandomLlamaGguf(shape, 43);
  Loaded fast = LoadBytes(bytes, &pool, KernelMode::kFast);
  Loaded ref = LoadBytes(bytes, &pool, KernelMode::kReference);
  EXPECT_EQ(fast.model->weights().num_packed_layers(), shape.num_layers);
  const LayerWeights& l = fast.model->weights().layers[0];
  ASSERT_EQ(l.qkv.parts.size(), 2u);
  EXPECT_EQ(l.qkv.parts[1].offset,
            shape.hidden + shape.num_kv_heads * (shape.hidden / shape.num_heads));
  EXPECT_EQ(l.gate_up.parts.size(), 2u);
  const std::vector<int32_t> a = RandomTokens(19, shape.vocab, 2);
  const std::vector<float> lf = RunAll(*fast.model, {{a, 0, {0, 1}}});
  const std::vector<float> lr = RunAll(*ref.model, {{a, 0, {0, 1}}});
  ASSERT_EQ(lf.size(), lr.size());
  EXPECT_LT(RelativeRmsError(lf, lr), 0.05);
}

// A Q4_K_M-like layout: K-quant matrices where the columns allow (ffn 256
// wide: Q4_K gate / up of 256 columns, Q6_K down), legacy types elsewhere;
// every layer packed, close to the exact path.
TEST(TinyModelFastTest, KQuantLayersArePackedAndCloseToReference) {
  ThreadPool pool(2);
  TinyLlamaShape shape;
  shape.hidden = 256;
  shape.num_heads = 4;
  shape.ffn = 512;
  shape.type_override = {
      {"attn_q.weight", gguf::TensorType::kQ4_K},   {"attn_k.weight", gguf::TensorType::kQ4_K},
      {"attn_v.weight", gguf::TensorType::kQ6_K},   {"attn_output.weight", gguf::TensorType::kQ5_K},
      {"ffn_gate.weight", gguf::TensorType::kQ4_K}, {"ffn_up.weight", gguf::TensorType::kQ4_K},
      {"ffn_down.weight", gguf::TensorType::kQ6_K}};
  const std::string bytes = testing::MakeRandomLlamaGguf(shape, 44);
  Loaded fast = LoadBytes(bytes, &pool, KernelMode::kFast);
  Loaded ref = LoadBytes(bytes, &pool, KernelMode::kReference);
  EXPECT_EQ(fast.model->weights().num_packed_layers(), shape.num_layers);
  EXPECT_EQ(fast.model->weights().layers[0].qkv.parts.size(), 2u);
  const std::vector<int32_t> a = RandomTokens(19, shape.vocab, 2);
  const std::vector<float> lf = RunAll(*fast.model, {{a, 0, {0, 1}}});
  const std::vector<float> lr = RunAll(*ref.model, {{a, 0, {0, 1}}});
  ASSERT_EQ(lf.size(), lr.size());
  EXPECT_LT(RelativeRmsError(lf, lr), 0.05);
  EXPECT_NE(lf, lr);
}

// tests/data/tiny_llama_mha.gguf: MHA, untied head, theta 500000, F32.
TEST(TinyMhaGoldenTest, MatchesTransformers) {
  const std::string path = testing::TestDataPath("tiny_llama_mha.gguf");
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ThreadPool pool(2);
  auto model = LlamaModel::Load(**file, {&pool, false, {}, KernelMode::kReference});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE((*model)->config().tied_embeddings);
  EXPECT_EQ((*model)->config().num_kv_heads, (*model)->config().num_heads);
  const Json golden =
      Json::Parse(testing::ReadFileOrEmpty(testing::TestDataPath("tiny_llama_mha_logits.json")));
  const int64_t vocab = (*model)->config().vocab_size;
  for (const Json& c : golden["cases"].array) {
    const std::vector<int32_t> ids = c["token_ids"].As<int32_t>();
    const std::vector<float> ours =
        RunAll(**model, {{ids, 0, Identity(int(ids.size() + 15) / 16)}});
    double max_kl = 0, max_abs = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const std::vector<float> ref = c["logits"][t].As<float>();
      const float* q = ours.data() + t * vocab;
      const double lp = LogSumExp(ref.data(), vocab), lq = LogSumExp(q, vocab);
      double kl = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        const double p = std::exp(ref[i] - lp);
        kl += p * ((ref[i] - lp) - (q[i] - lq));
        max_abs = std::max(max_abs, std::fabs(double(ref[i]) - q[i]));
      }
      max_kl = std::max(max_kl, kl);
    }
    std::printf("tiny MHA: %zu tokens, max KL %.3g, max |dlogit| %.3g\n", ids.size(), max_kl,
                max_abs);
    EXPECT_LT(max_kl, 1e-5);
    EXPECT_LT(max_abs, 1e-3);
  }
}

// The bundled SmolLM2 Q4_1 GGUF vs HF transformers (tests/data/logits_smollm2.json).
// kReference must match at mean KL < 1e-3 with identical greedy
// continuations; kFast (int8 activations) at mean KL < 0.01 with the first
// kFastGreedyTokens greedy tokens identical (later differences are printed).
struct GoldenBounds {
  KernelMode mode;
  double max_mean_kl;
  size_t greedy_tokens;               // leading greedy tokens that must match
  bool all_argmax;                    // every clear-margin argmax must match
  const ActLevels* levels = nullptr;  // overrides the mode's default
};
constexpr size_t kFastGreedyTokens = 32;

void CheckSmolLm2Goldens(const GoldenBounds& bounds) {
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) GTEST_SKIP() << "model not found: " << path;
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ThreadPool pool(2);
  LoadOptions options{&pool, true, {}};
  options.kernels = bounds.mode;
  options.act_levels = bounds.levels;
  auto loaded = LlamaModel::Load(**file, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const LlamaModel& m = **loaded;
  std::printf("%s\n", m.Summary().c_str());
  EXPECT_EQ(m.config().KvBytesPerToken(4), 46080);
  const int64_t vocab = m.config().vocab_size;
  const Json golden =
      Json::Parse(testing::ReadFileOrEmpty(testing::TestDataPath("logits_smollm2.json")));
  for (const Json& c : golden["cases"].array) {
    const std::vector<int32_t> ids = c["token_ids"].As<int32_t>();
    const int64_t T = ids.size();
    const std::vector<float> ours = RunAll(m, {{ids, 0, Identity(int(T + 15) / 16)}}, 16);
    double sum_kl = 0, max_kl = 0;
    int argmax_checked = 0, argmax_ok = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* q = ours.data() + t * vocab;
      const std::vector<double> top_logit = c["top_logits"][t].As<double>();
      const std::vector<int32_t> top = c["top_ids"][t].As<int32_t>();
      const double kl = testing::GoldenKl(c, t, q, vocab);
      sum_kl += kl;
      max_kl = std::max(max_kl, kl);
      if (top_logit[0] - top_logit[1] > 1e-3) {
        ++argmax_checked;
        const int64_t ours_arg = std::max_element(q, q + vocab) - q;
        argmax_ok += ours_arg == top[0];
      }
    }
    // Greedy continuation through the paged cache, one token at a time.
    auto runner = SingleSequenceRunner::Create(&m, T + 80);
    ASSERT_TRUE(runner.ok());
    absl::StatusOr<std::vector<float>> logits = (*runner)->Prefill(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const std::vector<int32_t> want = c["greedy"].As<int32_t>();
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t next =
          int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin());
      got.push_back(next);
      logits = (*runner)->DecodeStep(next);
      ASSERT_TRUE(logits.ok());
    }
    int first_diff = -1;
    for (size_t i = 0; i < want.size() && first_diff < 0; ++i) {
      if (got[i] != want[i]) first_diff = int(i);
    }
    std::printf(
        "%-10s %3lld tokens: mean KL %.3g, max KL %.3g, argmax %d/%d, greedy %s\n",
        c["name"].str.c_str(), (long long)T, sum_kl / T, max_kl, argmax_ok, argmax_checked,
        first_diff < 0 ? "identical" : ("differs at " + std::to_string(first_diff)).c_str());
    EXPECT_LT(sum_kl / T, bounds.max_mean_kl) << c["name"].str;
    if (bounds.all_argmax) {
      EXPECT_EQ(argmax_ok, argmax_checked) << c["name"].str;
    }
    const size_t n = std::min(bounds.greedy_tokens, want.size());
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + n),
              std::vector<int32_t>(want.begin(), want.begin() + n))
        << c["name"].str;
  }
}

TEST(SmolLm2GoldenTest, MatchesTransformers) {
  CheckSmolLm2Goldens({KernelMode::kReference, 1e-3, 1 << 20, true});
}

TEST(SmolLm2GoldenTest, FastKernelsCloseToTransformers) {
  CheckSmolLm2Goldens({KernelMode::kFast, 1e-2, kFastGreedyTokens, false});
}

TEST(ActLevelsTest, ParseFormatAndDefaults) {
  ActLevels l;
  ASSERT_TRUE(ActLevels::Parse("21212", &l));
  EXPECT_EQ(l.qkv, 2);
  EXPECT_EQ(l.wo, 1);
  EXPECT_EQ(l.down, 1);
  EXPECT_EQ(l.ToString(), "21212");
  EXPECT_FALSE(ActLevels::Parse("2121", &l));
  EXPECT_FALSE(ActLevels::Parse("21213", &l));
  EXPECT_EQ(DefaultActLevels(KernelMode::kFast).ToString(), "22222");
  EXPECT_EQ(DefaultActLevels(KernelMode::kFastInt8).ToString(), "11111");
}

// Accuracy study of other activation-level mixes: TANDEM_ACT_LEVELS=QWGDH
// (digits 1 or 2 for qkv, o, gate|up, down, LM head), same bounds as kFast.
TEST(SmolLm2GoldenTest, ActLevelsStudy) {
  const char* env = std::getenv("TANDEM_ACT_LEVELS");
  if (env == nullptr) GTEST_SKIP() << "set TANDEM_ACT_LEVELS=QWGDH";
  ActLevels levels;
  ASSERT_TRUE(ActLevels::Parse(env, &levels)) << env;
  CheckSmolLm2Goldens({KernelMode::kFast, 1e-2, kFastGreedyTokens, false, &levels});
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// Prefill / decode throughput on the real model. Runs only with
// TANDEM_BENCH=1 (threads: TANDEM_BENCH_THREADS, default 2).
TEST(SmolLm2BenchTest, PrefillAndDecodeSpeed) {
  const char* bench = std::getenv("TANDEM_BENCH");
  if (bench == nullptr || std::string(bench) != "1") GTEST_SKIP() << "set TANDEM_BENCH=1";
  auto file = gguf::GgufFile::Open(testing::DefaultModelPath());
  ASSERT_TRUE(file.ok()) << file.status();
  const char* threads_env = std::getenv("TANDEM_BENCH_THREADS");
  ThreadPool pool(threads_env ? std::atoi(threads_env) : 2);
  auto m = LlamaModel::Load(**file, {&pool, true, {}});
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> prompt = RandomTokens(128, (*m)->config().vocab_size, 9);
  auto runner = SingleSequenceRunner::Create(m->get(), 512);
  ASSERT_TRUE(runner.ok());
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  absl::StatusOr<std::vector<float>> logits = (*runner)->Prefill(prompt);
  ASSERT_TRUE(logits.ok());
  auto t1 = Clock::now();
  const int kDecode = 64;
  for (int i = 0; i < kDecode; ++i) {
    logits = (*runner)->DecodeStep(
        int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    ASSERT_TRUE(logits.ok());
  }
  auto t2 = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf(
      "threads %d: prefill %zu tokens %.3f s = %.1f tok/s; decode %d tokens %.3f s = %.1f tok/s\n",
      pool.num_threads(), prompt.size(), prefill_s, prompt.size() / prefill_s, kDecode, decode_s,
      kDecode / decode_s);
}

}  // namespace
}  // namespace tandem::engine
