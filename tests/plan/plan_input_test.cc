// `tandem plan`'s untrusted inputs: HF config.json, GGUF metadata and
// bench.json. Every malformed input is a clean InvalidArgument naming the
// field; good ones parse to the right numbers.
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "plan/measured.h"
#include "plan/model_presets.h"
#include "plan/model_source.h"

namespace tandem::plan {
namespace {

constexpr char kLlama2_7bConfig[] = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"],
  "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "torch_dtype": "float16",
  "vocab_size": 32000})";

TEST(PlanInputTest, HfConfigMatchesPreset) {
  absl::StatusOr<ModelShape> m = ModelShapeFromHfConfig(kLlama2_7bConfig, "config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelShape preset = FindModelPreset("llama-2-7b").value();
  EXPECT_EQ(m->name, "meta-llama/Llama-2-7b-hf");
  EXPECT_EQ(m->NumParameters(), preset.NumParameters());
  EXPECT_EQ(m->kv_dim(), preset.kv_dim());
  EXPECT_EQ(m->head_dim, 128);  // hidden / heads when head_dim is absent
  EXPECT_EQ(m->default_weight_bits, 16);
}

TEST(PlanInputTest, HostileHfConfigsAreCleanErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "json"},
      {"[1, 2]", "not a JSON object"},
      {"{\"hidden_size\": 4096", "json"},
      {R"({"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
          "vocab_size": 32000})",
       "num_hidden_layers is missing"},
      {R"({"num_hidden_layers": -1, "hidden_size": 4096, "intermediate_size": 1,
          "num_attention_heads": 32, "vocab_size": 32000})",
       "num_hidden_layers"},
      {R"({"num_hidden_layers": 32.5, "hidden_size": 4096, "intermediate_size": 1,
          "num_attention_heads": 32, "vocab_size": 32000})",
       "must be an integer"},
      {R"({"num_hidden_layers": "32", "hidden_size": 4096, "intermediate_size": 1,
          "num_attention_heads": 32, "vocab_size": 32000})",
       "must be an integer"},
      {R"({"num_hidden_layers": 1e300, "hidden_size": 4096, "intermediate_size": 1,
          "num_attention_heads": 32, "vocab_size": 32000})",
       "out of range"},
      {R"({"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 11008,
          "num_attention_heads": 32, "num_key_value_heads": 5, "vocab_size": 32000})",
       "does not divide"},
      {R"({"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 11008,
          "num_attention_heads": 32, "vocab_size": 32000, "tie_word_embeddings": "yes"})",
       "tie_word_embeddings"},
      {std::string(100, '[') + std::string(100, ']'), "json"},  // nesting bound
  };
  for (const auto& [text, expect] : cases) {
    absl::StatusOr<ModelShape> m = ModelShapeFromHfConfig(text, "config.json");
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(m.status().message().find(expect), std::string::npos) << text << " -> " << m.status();
  }
}

// A minimal llama GGUF with the given metadata overrides (no real weights).
std::string TinyGguf(int64_t kv_heads, bool with_layers = true) {
  gguf::GgufWriter w;
  w.Add("general.architecture", gguf::Value::String("llama"));
  if (with_layers) w.Add("llama.block_count", gguf::Value::Uint32(2));
  w.Add("llama.embedding_length", gguf::Value::Uint32(8));
  w.Add("llama.feed_forward_length", gguf::Value::Uint32(16));
  w.Add("llama.attention.head_count", gguf::Value::Uint32(2));
  w.Add("llama.attention.head_count_kv", gguf::Value::Uint32(static_cast<uint32_t>(kv_heads)));
  EXPECT_TRUE(w.AddF32Tensor("token_embd.weight", {8, 4}, std::vector<float>(32, 0.f)).ok());
  return w.Serialize();
}

TEST(PlanInputTest, GgufShapeAndHostileMetadata) {
  auto file = gguf::GgufFile::FromBuffer(TinyGguf(1));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ModelShape> m = ModelShapeFromGguf(**file);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_layers, 2);
  EXPECT_EQ(m->num_kv_heads, 1);
  EXPECT_EQ(m->head_dim, 4);
  EXPECT_EQ(m->vocab_size, 4);
  EXPECT_EQ(m->num_parameters, 32);
  EXPECT_EQ(m->file_weight_bytes, 128);
  EXPECT_EQ(m->default_weight_bits, 32);

  for (const std::string& bytes : {TinyGguf(0), TinyGguf(3), TinyGguf(1, false)}) {
    auto f = gguf::GgufFile::FromBuffer(bytes);
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<ModelShape> bad = ModelShapeFromGguf(**f);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  }
}

TEST(PlanInputTest, LoadModelShapeRejectsMissingAndGarbageFiles) {
  EXPECT_EQ(LoadModelShape("/nonexistent/model.gguf").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(LoadModelShape("Llama-2-13B").ok());  // presets are case-insensitive
}

TEST(PlanInputTest, BenchResultParsesAndValidates) {
  absl::StatusOr<BenchResult> b = ParseBenchResult(
      R"({"schema": "tandem.bench.v1", "output_tokens_per_second": 1200.5, "mean_tpot_ms": 20,
          "mean_ttft_ms": 150, "concurrency": 24, "prompt_tokens_mean": 512,
          "output_tokens_mean": 256, "model": "llama-2-13b", "device": "A100-80GB",
          "p99_tpot_ms": 31})");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->output_tokens_per_second, 1200.5);
  EXPECT_EQ(b->concurrency, 24);
  EXPECT_EQ(*b->mean_ttft_ms, 150);
  EXPECT_FALSE(b->request_throughput.has_value());

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "json"},
      {"42", "not a JSON object"},
      {R"({"mean_tpot_ms": 20, "concurrency": 1})", "output_tokens_per_second is missing"},
      {R"({"output_tokens_per_second": "fast", "mean_tpot_ms": 20, "concurrency": 1})",
       "must be a number"},
      {R"({"output_tokens_per_second": 10, "mean_tpot_ms": -3, "concurrency": 1})", "mean_tpot_ms"},
      {R"({"output_tokens_per_second": 10, "mean_tpot_ms": 3, "concurrency": 0})", "concurrency"},
      {R"({"output_tokens_per_second": 10, "mean_tpot_ms": 3, "concurrency": 1, "model": 7})",
       "model must be a string"},
      {R"({"schema": "vllm", "output_tokens_per_second": 10, "mean_tpot_ms": 3,
           "concurrency": 1})",
       "schema"},
      {R"({"output_tokens_per_second": 10, "mean_tpot_ms": 3, "concurrency": 1,})", "json"},
  };
  for (const auto& [text, expect] : bad) {
    absl::StatusOr<BenchResult> r = ParseBenchResult(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << text << " -> " << r.status();
  }
}

TEST(PlanInputTest, MeasuredFractionOfBandwidthLimit) {
  PlanInputs in;
  in.model = FindModelPreset("llama-2-13b").value();
  in.device = FindDevicePreset("A100-80GB").value();
  const Plan plan = ComputePlan(in).value();
  // Weights-only steps at half the peak bandwidth: 2.039e12 / 26.03e9 / 2 per second.
  BenchResult b;
  b.concurrency = 29;
  const double steps = 0.5 * plan.decode_steps_per_second_bound;
  b.mean_tpot_ms = 1000 / steps;
  b.output_tokens_per_second = steps * 29;
  MeasuredComparison c = CompareMeasured(in, plan, b);
  EXPECT_NEAR(c.bandwidth_fraction_of_limit, 0.5, 1e-9);
  EXPECT_NEAR(c.output_tokens_fraction_of_bound, 0.5, 1e-9);
  EXPECT_TRUE(c.warnings.empty());
  // With the workload given, each step also reads prompt + output / 2 tokens of KV.
  b.prompt_tokens_mean = 512;
  b.output_tokens_mean = 256;
  b.mean_ttft_ms = 100;
  b.model = "llama-2-7b";
  c = CompareMeasured(in, plan, b);
  EXPECT_EQ(c.decode_context, 640);
  EXPECT_GT(c.bandwidth_fraction_of_limit, 0.5);
  ASSERT_TRUE(c.prefill_tokens_per_second.has_value());
  EXPECT_NEAR(*c.prefill_tokens_per_second, 5120, 1e-6);
  EXPECT_EQ(c.warnings.size(), 1u);  // a different model
}

}  // namespace
}  // namespace tandem::plan
