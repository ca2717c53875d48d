// quant::QuantizeModel on tiny random f32 models with outlier input
// channels: every method's file loads and runs, AWQ and GPTQ give a lower
// output error than RTN at the same bits on held-out tokens (not the
// calibration tokens), and bad requests are clean errors.
#include "quant/quantize_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

// Logits of every position of `tokens` (reference kernels unless told).
std::vector<float> AllLogits(const gguf::GgufFile& file, const std::vector<int32_t>& tokens,
                             engine::KernelMode kernels = engine::KernelMode::kReference) {
  engine::LoadOptions load;
  load.kernels = kernels;
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
                             ThreadPool* pool, bool act_order = false) {
  auto in = gguf::GgufFile::FromBuffer(model);
  QuantizeOptions o;
  o.target = *ParseTargetType(type);
  o.method = method;
  o.gptq.act_order = act_order;
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
  const MethodRun act = QuantizeAndMeasure(model, GetParam(), Method::kGptq, &pool, true);
  std::printf("%s logits MSE: rtn %.5g awq %.5g gptq %.5g gptq act-order %.5g\n",
              GetParam().c_str(), rtn.error, awq.error, gptq.error, act.error);
  EXPECT_GT(rtn.error, 0);
  EXPECT_LT(awq.error, rtn.error);
  EXPECT_LT(gptq.error, rtn.error);
  EXPECT_LT(act.error, rtn.error);
  EXPECT_EQ(rtn.summary.calibration_tokens, 0);
  EXPECT_EQ(gptq.summary.calibration_tokens, 1024);
  EXPECT_EQ(awq.summary.awq_alphas.size(), 2u * 4u);
}

INSTANTIATE_TEST_SUITE_P(Types, MethodsTest, ::testing::Values("q4_0", "q4_1", "q4_k"));

// The quantized file of `model` (method, target and alpha as given).
std::unique_ptr<gguf::GgufFile> Quantize(const std::string& model, const TargetType& target,
                                         Method method, float alpha, std::string* bytes) {
  auto in = gguf::GgufFile::FromBuffer(model);
  QuantizeOptions o;
  o.target = target;
  o.method = method;
  o.smooth_alpha = alpha;
  o.calibration_tokens = RandomTokens(512, 128, 11);
  o.calibration_seq_len = 128;
  gguf::GgufWriter w;
  auto summary = QuantizeModel(**in, o, &w);
  EXPECT_TRUE(summary.ok()) << summary.status();
  *bytes = w.Serialize();
  auto out = gguf::GgufFile::FromBuffer(*bytes);
  EXPECT_TRUE(out.ok()) << out.status();
  return std::move(out).value();
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// Smoothing alone (f32 target: the layers stay f32, only the tied embedding
// is Q8_0, as in the rtn f32 file it is compared with) computes the same
// function: s is folded exactly into the norms and the v / up rows.
TEST(SmoothQuantTest, FoldIsExactInF32) {
  const std::string model = OutlierModel(256, 512, 7);
  const TargetType f32{TensorType::kF32, false, "f32"};
  std::string b1, b2;
  auto plain = Quantize(model, f32, Method::kRtn, 0.f, &b1);
  auto smoothed = Quantize(model, f32, Method::kSmoothQuant, 0.5f, &b2);
  EXPECT_EQ(smoothed->FindTensor("blk.0.attn_q.weight")->type, TensorType::kF32);
  // The norms really changed.
  const gguf::TensorInfo* n0 = plain->FindTensor("blk.0.attn_norm.weight");
  const gguf::TensorInfo* n1 = smoothed->FindTensor("blk.0.attn_norm.weight");
  EXPECT_NE(std::memcmp(n0->data, n1->data, n0->num_bytes), 0);
  const std::vector<int32_t> tokens = RandomTokens(32, 128, 99);
  const std::vector<float> a = AllLogits(*plain, tokens), b = AllLogits(*smoothed, tokens);
  double scale = 0;
  for (float v : a) scale = std::max(scale, double(std::fabs(v)));
  std::printf("smoothed f32 vs plain f32: max |d logit| %.3g (max |logit| %.3g)\n",
              MaxAbsDiff(a, b), scale);
  EXPECT_LT(MaxAbsDiff(a, b), 1e-5 * std::max(1.0, scale));
}

// With per-token int8 activations (the mode a SmoothQuant file runs with),
// SmoothQuant's Q8_0 file is closer to the f32 model than plain Q8_0 rtn on
// held-out tokens, at both alphas; the file asks for that kernel mode.
TEST(SmoothQuantTest, BeatsPlainW8A8PerToken) {
  const std::string model = OutlierModel(256, 512, 7);
  auto in = gguf::GgufFile::FromBuffer(model);
  const TargetType q8 = *ParseTargetType("q8_0");
  const std::vector<int32_t> held_out = RandomTokens(48, 128, 99);
  const std::vector<float> want = AllLogits(**in, held_out);
  const auto token = engine::KernelMode::kFastInt8Token;
  std::string b0, b1, b2;
  auto rtn = Quantize(model, q8, Method::kRtn, 0.f, &b0);
  const double rtn_err = MeanSquaredError(want, AllLogits(*rtn, held_out, token));
  EXPECT_EQ(engine::DefaultKernelMode(*rtn), engine::KernelMode::kFast);
  for (float alpha : {0.5f, 0.8f}) {
    auto sq = Quantize(model, q8, Method::kSmoothQuant, alpha, &b1);
    const double err = MeanSquaredError(want, AllLogits(*sq, held_out, token));
    const double block_err =
        MeanSquaredError(want, AllLogits(*sq, held_out, engine::KernelMode::kFastInt8));
    std::printf(
        "W8A8 logits MSE, per-token acts: rtn %.5g smoothquant(%.1f) %.5g; per-block: "
        "smoothquant %.5g rtn %.5g\n",
        rtn_err, alpha, err, block_err,
        MeanSquaredError(want, AllLogits(*rtn, held_out, engine::KernelMode::kFastInt8)));
    EXPECT_LT(err, rtn_err);
    EXPECT_EQ(sq->FindTensor("blk.1.ffn_down.weight")->type, TensorType::kQ8_0);
    EXPECT_EQ(*sq->GetString("tandem.quantize.method"), "smoothquant");
    EXPECT_FLOAT_EQ(static_cast<float>(*sq->GetFloat("tandem.quantize.alpha")), alpha);
    EXPECT_EQ(engine::DefaultKernelMode(*sq), token);
  }
}

TEST(SmoothQuantTest, BadTypeOrAlphaIsInvalidArgument) {
  auto in = gguf::GgufFile::FromBuffer(OutlierModel(64, 96, 5));
  QuantizeOptions o;
  o.method = Method::kSmoothQuant;
  o.calibration_tokens = RandomTokens(64, 128, 3);
  gguf::GgufWriter w;
  o.target = *ParseTargetType("q4_0");
  EXPECT_EQ(QuantizeModel(**in, o, &w).status().code(), absl::StatusCode::kInvalidArgument);
  o.target = *ParseTargetType("q8_0");
  for (float alpha : {-0.1f, 1.5f, NAN}) {
    o.smooth_alpha = alpha;
    EXPECT_EQ(QuantizeModel(**in, o, &w).status().code(), absl::StatusCode::kInvalidArgument);
  }
  o.smooth_alpha = 0.5f;
  o.calibration_tokens.clear();
  EXPECT_EQ(QuantizeModel(**in, o, &w).status().code(), absl::StatusCode::kInvalidArgument);
}

// s = max|x|^a / max|w|^(1-a); dead channels keep s = 1.
TEST(SmoothQuantTest, Scales) {
  const std::vector<float> x = {1, -8, 0, 2, 4, 0.5f};  // 2 rows x 3 cols
  const std::vector<float> act = ColumnAbsMax(x.data(), 2, 3);
  EXPECT_EQ(act, (std::vector<float>{2, 8, 0.5f}));
  const std::vector<float> s = SmoothScales({4, 9, 0}, {1, 4, 2}, 0.5f);
  EXPECT_FLOAT_EQ(s[0], 2.f);
  EXPECT_FLOAT_EQ(s[1], 1.5f);
  EXPECT_EQ(s[2], 1.f);
  EXPECT_FLOAT_EQ(SmoothScales({4}, {2}, 1.f)[0], 4.f);
  EXPECT_FLOAT_EQ(SmoothScales({4}, {2}, 0.f)[0], 0.5f);
}

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
