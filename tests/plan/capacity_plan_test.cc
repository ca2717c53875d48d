// Pins `tandem plan`'s arithmetic to the seed's worked numbers
// (../shared/seed/llm-inference-qa.txt): KV sizing, GQA, and the Llama-2-13B
// on an 80 GB GPU capacity estimate; plus the real SmolLM2 GGUF.
#include "plan/capacity_plan.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"
#include "plan/device_presets.h"
#include "plan/model_presets.h"
#include "plan/model_source.h"
#include "plan/plan_report.h"
#include "tests/util/json_reader.h"
#include "tests/util/test_paths.h"

namespace tandem::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

PlanInputs Inputs(const std::string& model, const std::string& device = "A100-80GB") {
  PlanInputs in;
  in.model = FindModelPreset(model).value();
  in.device = FindDevicePreset(device).value();
  return in;
}

TEST(CapacityPlanTest, Llama2_7bFp16KvMatchesSeed) {
  PlanInputs in = Inputs("llama-2-7b");
  in.context_length = 4096;
  in.batch = 16;
  Plan p = ComputePlan(in).value();
  EXPECT_EQ(p.kv_bytes_per_token, 524288);                             // 2 x 32 x 32 x 128 x 2 B
  EXPECT_EQ(p.kv_bytes_per_sequence, int64_t{2} << 30);                // 2 GiB per 4k sequence
  EXPECT_DOUBLE_EQ(p.kv_bytes_for_batch, 32 * kGiB);                   // 32 GiB for batch 16
  EXPECT_EQ(p.num_parameters, 6738415616);                             // Llama-2-7B's 6.74 B
  EXPECT_NEAR(static_cast<double>(p.weights_bytes) / 1e9, 13.5, 0.1);  // "14 GB"
  // The cache for the batch is more than the weights (the seed's takeaway #1).
  EXPECT_GT(p.kv_bytes_for_batch, static_cast<double>(p.weights_bytes));
}

TEST(CapacityPlanTest, GqaCutsLlama2_70bCacheEightfold) {
  PlanInputs gqa = Inputs("llama-2-70b");
  EXPECT_EQ(gqa.model.num_heads, 64);
  EXPECT_EQ(gqa.model.num_kv_heads, 8);
  EXPECT_EQ(gqa.model.head_dim, 128);
  PlanInputs mha = gqa;
  mha.model.num_kv_heads = mha.model.num_heads;
  const Plan pg = ComputePlan(gqa).value();
  const Plan pm = ComputePlan(mha).value();
  EXPECT_EQ(pg.kv_bytes_per_token, 2 * 80 * 8 * 128 * 2);
  EXPECT_EQ(pm.kv_bytes_per_token, 8 * pg.kv_bytes_per_token);
  EXPECT_EQ(pm.kv_bytes_per_sequence, 8 * pg.kv_bytes_per_sequence);
}

// The seed: 80 - 26 (weights) - ~4 ≈ 50 GB for KV; ~1 MB/token, 2 GB per 2k
// sequence, ~25 sequences; ~75 passes/s x 25 ≈ 1,500-1,900 tok/s; $2/hour ->
// $0.3-0.4 per 1M tokens. The exact KV is 819,200 B/token (the seed rounds it
// up to 1 MB), so 29 sequences fit rather than 25.
TEST(CapacityPlanTest, Llama2_13bOn80GbMatchesSeedEstimate) {
  PlanInputs in = Inputs("llama-2-13b");  // defaults: context 2048, $2/hour, 4 GB reserve
  Plan p = ComputePlan(in).value();
  EXPECT_NEAR(static_cast<double>(p.weights_bytes) / 1e9, 26.0, 0.1);
  EXPECT_EQ(p.kv_bytes_per_token, 819200);
  EXPECT_NEAR(static_cast<double>(p.kv_bytes_per_sequence) / 1e9, 1.68, 0.01);
  EXPECT_NEAR(p.kv_budget_bytes / 1e9, 50.0, 0.5);
  EXPECT_GE(p.max_concurrent_sequences, 25);
  EXPECT_LE(p.max_concurrent_sequences, 30);
  EXPECT_EQ(p.batch, p.max_concurrent_sequences);
  EXPECT_TRUE(p.batch_fits);
  EXPECT_NEAR(p.decode_steps_per_second_bound, 78.3, 0.1);  // 2.039 TB/s / 26 GB
  EXPECT_FALSE(p.decode_compute_bound);
  EXPECT_GE(p.decode_tokens_per_second, 1500);
  EXPECT_LE(p.decode_tokens_per_second, 1900);
  EXPECT_GE(p.usd_per_million_output_tokens, 0.3);
  EXPECT_LE(p.usd_per_million_output_tokens, 0.4);
  // The bound that includes every sequence's full 2k KV read is far lower.
  EXPECT_LT(p.decode_steps_per_second_bound_full_context, p.decode_steps_per_second_bound / 2);
  EXPECT_FALSE(p.assumptions.empty());
}

TEST(CapacityPlanTest, KvReadAndQuantizationMoveDecodeTheRightWay) {
  PlanInputs in = Inputs("llama-2-13b");
  const Plan base = ComputePlan(in).value();
  in.decode_context = 1024;
  const Plan with_kv = ComputePlan(in).value();
  EXPECT_LT(with_kv.decode_tokens_per_second, base.decode_tokens_per_second);
  EXPECT_DOUBLE_EQ(with_kv.decode_bytes_per_step,
                   static_cast<double>(base.weights_bytes) + 29.0 * 1024 * 819200);
  // int4 weights: a quarter of the bytes, ~20 GB more for the cache, and at
  // the same batch 4x the weight-read steps per second.
  in = Inputs("llama-2-13b");
  in.weight_bits = 4;
  in.batch = base.batch;
  const Plan int4 = ComputePlan(in).value();
  EXPECT_EQ(int4.weights_bytes * 4, base.weights_bytes);
  EXPECT_NEAR((int4.kv_budget_bytes - base.kv_budget_bytes) / 1e9, 19.5, 0.1);
  EXPECT_GT(int4.max_concurrent_sequences, base.max_concurrent_sequences + 10);
  EXPECT_NEAR(int4.decode_steps_per_second_bound, 4 * base.decode_steps_per_second_bound, 1e-6);
  // At the larger batch that now fits, int4 decode hits the FLOP roofline
  // (dequantized weights still cost 2 FLOPs each per sequence).
  in.batch = 0;
  EXPECT_TRUE(ComputePlan(in).value().decode_compute_bound);
}

TEST(CapacityPlanTest, OversizedBatchAndModelAreReportedNotHidden) {
  PlanInputs in = Inputs("llama-2-13b");
  in.batch = 64;
  Plan p = ComputePlan(in).value();
  EXPECT_FALSE(p.batch_fits);
  EXPECT_EQ(p.batch, 64);
  in = Inputs("llama-3-70b");  // 141 GB of bf16 weights on an 80 GB device
  p = ComputePlan(in).value();
  EXPECT_LT(p.kv_budget_bytes, 0);
  EXPECT_EQ(p.max_concurrent_sequences, 0);
  EXPECT_FALSE(p.worker_ratio.feasible);
}

TEST(CapacityPlanTest, InvalidInputsAreErrors) {
  PlanInputs in = Inputs("llama-2-7b");
  in.bandwidth_efficiency = 0;
  EXPECT_FALSE(ComputePlan(in).ok());
  in = Inputs("llama-2-7b", "cpu");  // numbers not filled in
  EXPECT_FALSE(ComputePlan(in).ok());
  EXPECT_FALSE(FindModelPreset("llama-9-1t").ok());
  EXPECT_FALSE(FindDevicePreset("tpu").ok());
  EXPECT_TRUE(FindDevicePreset("h100-80gb").ok());  // case-insensitive
}

TEST(CapacityPlanTest, WorkerRatioFollowsTheQueueModel) {
  PlanInputs in = Inputs("llama-2-13b");
  Plan p = ComputePlan(in).value();
  const WorkerRatio& r = p.worker_ratio;
  ASSERT_TRUE(r.feasible) << r.infeasible_reason;
  EXPECT_LE(r.expected_ttft_ms, in.workload.ttft_target_ms);
  EXPECT_LE(r.decode_step_ms, in.workload.tpot_target_ms);
  EXPECT_GE(r.decode_workers * r.decode_tokens_per_second_per_worker,
            in.workload.request_rate * static_cast<double>(in.workload.output_tokens));
  // Ten times the rate needs about ten times the workers of each kind.
  in.workload.request_rate *= 10;
  const WorkerRatio r10 = ComputePlan(in).value().worker_ratio;
  EXPECT_GE(r10.prefill_workers, 9 * r.prefill_workers);
  EXPECT_EQ(r10.decode_workers,
            static_cast<int64_t>(std::ceil(in.workload.request_rate *
                                           static_cast<double>(in.workload.output_tokens) /
                                           r10.decode_tokens_per_second_per_worker)));
  EXPECT_GE(r10.decode_workers, 7 * r.decode_workers);
  EXPECT_LE(r10.expected_ttft_ms, in.workload.ttft_target_ms);
  // A TTFT target below one prompt's prefill time cannot be met.
  in.workload.ttft_target_ms = 1;
  const WorkerRatio bad = ComputePlan(in).value().worker_ratio;
  EXPECT_FALSE(bad.feasible);
  EXPECT_NE(bad.infeasible_reason.find("TTFT"), std::string::npos);
}

TEST(CapacityPlanTest, SmolLm2GgufFromTheRealFile) {
  absl::StatusOr<ModelShape> m = LoadModelShape(testing::DefaultModelPath());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_layers, 30);
  EXPECT_EQ(m->num_kv_heads, 3);
  EXPECT_EQ(m->head_dim, 64);
  EXPECT_EQ(m->vocab_size, 49152);
  EXPECT_TRUE(m->tied_embeddings);
  // The tensors hold exactly the Llama-layout parameter count of the preset.
  EXPECT_EQ(m->num_parameters, FindModelPreset("smollm2-135m")->LlamaParameters());
  EXPECT_EQ(m->num_parameters, 134515008);
  PlanInputs in;
  in.model = *m;
  in.device = FindDevicePreset("cpu").value();
  in.device.memory_bytes = 16e9;
  in.device.bandwidth_bytes_per_second = 50e9;
  in.device.flops_per_second = 1e12;
  in.kv_bytes_per_element = 4;  // an f32 cache (--kv-cache-dtype f32)
  in.use_file_weight_bytes = true;
  in.reserve_bytes = 1e9;
  Plan p = ComputePlan(in).value();
  EXPECT_EQ(p.kv_bytes_per_token, 46080);  // 2 x 30 x 3 x 64 x 4
  EXPECT_EQ(p.weights_bytes, m->file_weight_bytes);
  EXPECT_GT(p.weight_bits, 4.0);  // Q4_1 blocks plus F32 norms and a Q8_0 embedding
  EXPECT_LT(p.weight_bits, 8.0);
  // Every Tandem KV dtype at the same budget: bytes/token (int8/fp8 with
  // their 1 B scale per token, layer, K|V and KV head) and sequences.
  ASSERT_EQ(p.kv_dtype_capacity.size(), 5u);
  const int64_t want_bpt[] = {46080, 23040, 23040, 11700, 11700};
  for (size_t i = 0; i < 5; ++i) {
    const Plan::KvDtypeCapacity& k = p.kv_dtype_capacity[i];
    EXPECT_EQ(k.kv_bytes_per_token, want_bpt[i]) << k.dtype;
    EXPECT_EQ(k.max_concurrent_sequences,
              static_cast<int64_t>(p.kv_budget_bytes / (want_bpt[i] * in.context_length)))
        << k.dtype;
  }
  EXPECT_EQ(p.kv_dtype_capacity[0].max_concurrent_sequences, p.max_concurrent_sequences);
  EXPECT_GT(p.kv_dtype_capacity[3].max_concurrent_sequences,
            3 * p.kv_dtype_capacity[0].max_concurrent_sequences);
  in.kv_bytes_per_element = 1;
  in.kv_scale_bytes_per_head = 1;                                // --kv-cache-dtype int8
  EXPECT_EQ(ComputePlan(in).value().kv_bytes_per_token, 11700);  // 2 x 30 x 3 x (64 + 1)
}

TEST(CapacityPlanTest, JsonHasEveryNamedField) {
  PlanInputs in = Inputs("llama-2-13b");
  Plan p = ComputePlan(in).value();
  testing::Json j = testing::Json::Parse(FormatPlanJson(in, p, nullptr));
  for (const char* key :
       {"kv_bytes_per_token", "kv_bytes_per_sequence", "weights_bytes", "kv_budget_bytes",
        "max_concurrent_sequences", "decode_steps_per_second_bound", "decode_tokens_per_second",
        "prefill_tokens_per_second", "usd_per_million_output_tokens", "prefill_workers",
        "decode_workers", "prefill_to_decode_ratio", "assumptions"}) {
    EXPECT_TRUE(j.has(key)) << key;
  }
  EXPECT_EQ(j["kv_bytes_per_token"].number, 819200);
  EXPECT_EQ(j["model"].str, "llama-2-13b");
  EXPECT_EQ(WithCommas(524288), "524,288");
  EXPECT_EQ(WithCommas(-1000), "-1,000");
  EXPECT_EQ(WithCommas(12), "12");
}

}  // namespace
}  // namespace tandem::plan
