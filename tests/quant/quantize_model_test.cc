// quant::QuantizeModel on tiny random f32 models with outlier input
// channels: every method's file loads and runs, AWQ and GPTQ give a lower
// output error than RTN at the same bits on held-out tokens (not the
// calibration tokens), and bad requests are clean errors.
#include "quant/quantize_model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "engine/llama_model.h"
#include "engine/single_sequence_runner.h"
#include "tests/util/tiny_llama.h"

namespace tandem::quant {
namespace {

using gguf::TensorType;

// A tiny f32 model whose norm weights are large on a few channels, so the
// linears' inputs have the outlier channels AWQ is about.
std::string OutlierModel(int64_t hidden, int64_t ffn, uint32_t seed) {
  testing::TinyLlamaShape shape;
  shape.hidden = hidden;
  shape.ffn = ffn;
  shape.num_layers = 2;
  shape.num_heads = 4;
  shape.num_kv_heads = 2;
  shape.vocab = 128;
  shape.matrix_type = TensorType::kF32;
  shape.embd_type = TensorType::kF32;
  auto file = gguf::GgufFile::FromBuffer(testing::MakeRandomLlamaGguf(shape, seed));
  EXPECT_TRUE(file.ok());
  gguf::GgufWriter w;
  for (const auto& [k, v] : (*file)->metadata()) w.Add(k, v);
  std::mt19937 rng(seed + 1);
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    std::string bytes(reinterpret_cast<const char*>(t.data), t.num_bytes);
    if (t.name.find("_norm.") != std::string::npos && t.name.rfind("blk.", 0) == 0) {
      auto* v = reinterpret_cast<float*>(bytes.data());
      for (int i = 0; i < 6; ++i) v[rng() % t.shape[0]] *= 10.f;
    }
    EXPECT_TRUE(w.AddTensor(t.name, t.shape, t.type, bytes).ok());
  }
  return w.Serialize();
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& v : t) v = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Logits of every position of `tokens` (reference kernels).
std::vector<float> AllLogits(const gguf::GgufFile& file, const std::vector<int32_t>& tokens) {
  engine::LoadOptions load;
  load.kernels = engine::KernelMode::kReference;
  auto model = engine::LlamaModel::Load(file, load);
  EXPECT_TRUE(model.ok()) << model.status();
  auto runner = engine::SingleSequenceRunner::Create(model->get(), 256);
  EXPECT_TRUE(runner.ok());
  std::vector<float> all;
  for (int32_t t : tokens) {
    auto logits = (*runner)->DecodeStep(t);
    EXPECT_TRUE(logits.ok());
    all.insert(all.end(), logits->begin(), logits->end());
  }
  return all;
}

double MeanSquaredError(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * double(a[i] - b[i]);
  return s / a.size();
}

struct MethodRun {
  double error = 0;
  QuantizeSummary summary;
};

MethodRun QuantizeAndMeasure(const std::string& model, const std::string& type, Method method,
                             ThreadPool* pool) {
  auto in = gguf::GgufFile::FromBuffer(model);
  QuantizeOptions o;
  o.target = *ParseTargetType(type);
  o.method = method;
  // More calibration tokens than input channels (512 for ffn_down), so
  // GPTQ's Hessian is not rank deficient.
  o.calibration_tokens = RandomTokens(1024, 128, 11);
  o.calibration_seq_len = 128;
  o.max_calibration_tokens = 1024;
  o.pool = pool;
  gguf::GgufWriter w;
  auto summary = QuantizeModel(**in, o, &w);
  EXPECT_TRUE(summary.ok()) << summary.status();
  auto out = gguf::GgufFile::FromBuffer(w.Serialize());
  EXPECT_TRUE(out.ok()) << out.status();
  const std::vector<int32_t> held_out = RandomTokens(48, 128, 99);
  return {MeanSquaredError(AllLogits(**in, held_out), AllLogits(**out, held_out)), *summary};
}

class MethodsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MethodsTest, AwqAndGptqBeatRtnOnHeldOutTokens) {
  ThreadPool pool(2);
  const std::string model = OutlierModel(256, 512, 7);
  const MethodRun rtn = QuantizeAndMeasure(model, GetParam(), Method::kRtn, &pool);
  const MethodRun awq = QuantizeAndMeasure(model, GetParam(), Method::kAwq, &pool);
  const MethodRun gptq = QuantizeAndMeasure(model, GetParam(), Method::kGptq, &pool);
  std::printf("%s logits MSE: rtn %.5g awq %.5g gptq %.5g\n", GetParam().c_str(), rtn.error,
              awq.error, gptq.error);
  EXPECT_GT(rtn.error, 0);
  EXPECT_LT(awq.error, rtn.error);
  EXPECT_LT(gptq.error, rtn.error);
  EXPECT_EQ(rtn.summary.calibration_tokens, 0);
  EXPECT_EQ(gptq.summary.calibration_tokens, 1024);
  EXPECT_EQ(awq.summary.awq_alphas.size(), 2u * 4u);
}

INSTANTIATE_TEST_SUITE_P(Types, MethodsTest, ::testing::Values("q4_0", "q4_1", "q4_k"));

TEST(QuantizeModelTest, WritesTargetTypesAndMetadata) {
  const std::string model = OutlierModel(64, 96, 5);
  auto in = gguf::GgufFile::FromBuffer(model);
  QuantizeOptions o;
  o.target = *ParseTargetType("q4_k");
  gguf::GgufWriter w;
  auto summary = QuantizeModel(**in, o, &w);
  ASSERT_TRUE(summary.ok()) << summary.status();
  auto out = gguf::GgufFile::FromBuffer(w.Serialize());
  ASSERT_TRUE(out.ok());
  // Rows of 64: Q4_K falls back to Q5_0; the tied embedding is Q8_0.
  EXPECT_EQ((*out)->FindTensor("blk.0.attn_q.weight")->type, TensorType::kQ5_0);
  EXPECT_EQ((*out)->FindTensor("token_embd.weight")->type, TensorType::kQ8_0);
  EXPECT_EQ((*out)->FindTensor("blk.0.attn_norm.weight")->type, TensorType::kF32);
  EXPECT_EQ(*(*out)->GetInt("general.file_type"), 14);
  EXPECT_EQ(*(*out)->GetString("tandem.quantize.method"), "rtn");
}

TEST(QuantizeModelTest, CalibratedMethodsNeedTokens) {
  auto in = gguf::GgufFile::FromBuffer(OutlierModel(64, 96, 5));
  QuantizeOptions o;
  o.target = *ParseTargetType("q4_0");
  o.method = Method::kGptq;
  gguf::GgufWriter w;
  auto s = QuantizeModel(**in, o, &w);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  o.calibration_tokens = {1, 2, 500};  // out of the vocab of 128
  s = QuantizeModel(**in, o, &w);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace tandem::quant
