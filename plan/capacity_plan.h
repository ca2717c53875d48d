// The seed's capacity Fermi estimate as a function: memory -> batch ->
// throughput -> $/token, plus a DistServe-style prefill:decode worker ratio.
//
// Memory (bytes):
//   kv_bytes_per_token    = 2 (K and V) x layers x kv_heads x (head_dim x kv_bytes_per_element
//                           + kv_scale_bytes_per_head)
//   kv_bytes_per_sequence = kv_bytes_per_token x context_length
//   weights_bytes         = parameters x weight_bits / 8 (or the GGUF's stored bytes)
//   kv_budget_bytes       = device memory - weights - reserve (activations, buffers)
//   max_concurrent_sequences = floor(kv_budget / kv_bytes_per_sequence)
// Decode (memory-bound; one token per running sequence per step):
//   decode_bytes_per_step = weights + batch x decode_context x kv_bytes_per_token
//   decode_steps_per_second_bound = bandwidth / decode_bytes_per_step
//   (capped by the compute roofline: batch x 2 x parameters FLOPs per step)
//   decode_tokens_per_second = bandwidth_efficiency x bound x batch
// With decode_context = 0 (the default) this is the seed's rule, bandwidth /
// weight bytes forward passes per second x batch; a positive decode_context
// adds the KV read of every running sequence's cached tokens.
// Prefill (FLOP-bound):
//   prefill_flops_per_token = 2 x parameters + 2 x layers x q_dim x (prompt + 1)
//   prefill_tokens_per_second = compute_efficiency x peak FLOP/s / that
// Cost: usd_per_million_output_tokens = usd_per_hour / (tokens/s x 3600) x 1e6.
//
// All functions are pure and thread-compatible. See docs/plan.md.
#ifndef TANDEM_PLAN_CAPACITY_PLAN_H_
#define TANDEM_PLAN_CAPACITY_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plan/device_presets.h"
#include "plan/model_presets.h"

namespace tandem::plan {

// The traffic that the prefill:decode ratio is sized for.
struct Workload {
  int64_t prompt_tokens = 512;
  int64_t output_tokens = 256;
  double request_rate = 10;     // requests per second, all workers together
  double ttft_target_ms = 500;  // mean time to first token
  double tpot_target_ms = 50;   // mean time per output token
};

// Tandem's --kv-cache-dtype choices, as in kernels/kv_dtype.h (common/ sits
// below kernels/ and cannot include it; tests/integration/plan_cli_test.cc
// checks the bytes against the engine's): bytes per element and the one-byte
// scale per (token, layer, K|V, KV head) of int8 / fp8.
struct KvDtypeSpec {
  const char* name;
  double bytes_per_element;
  double scale_bytes_per_head;
};
// f32, f16, bf16, int8, fp8.
const std::vector<KvDtypeSpec>& KvDtypeSpecs();
// nullptr for an unknown name.
const KvDtypeSpec* FindKvDtypeSpec(const std::string& name);

struct PlanInputs {
  ModelShape model;
  DeviceSpec device;
  double weight_bits = 16;             // ignored when use_file_weight_bytes
  bool use_file_weight_bytes = false;  // weights = model.file_weight_bytes (a GGUF as stored)
  double kv_bytes_per_element = 2;
  double kv_scale_bytes_per_head = 0;  // per (token, layer, K|V, KV head): int8/fp8 scales
  std::string kv_dtype;                // the --kv-cache-dtype it came from; empty: --kv-bytes
  int64_t context_length = 2048;       // KV reserved per sequence, in tokens
  int64_t batch = 0;                   // running sequences per decode step; 0: max that fit
  int64_t decode_context = 0;          // cached tokens per sequence read each step; 0: seed's rule
  double usd_per_hour = 2;
  double reserve_bytes = 4e9;          // activations, CUDA context, buffers
  double bandwidth_efficiency = 0.75;  // achieved / peak bandwidth in decode (MBU)
  double compute_efficiency = 0.5;     // achieved / peak FLOP/s in prefill (MFU)
  Workload workload;

  // InvalidArgument naming the input when a value is out of range.
  absl::Status Validate() const;
};

// The prefill:decode split for `Workload`, in the spirit of DistServe: each
// prefill worker is an M/D/1 queue (one prompt at a time, FLOP-bound), each
// decode worker runs the largest batch that fits memory and the TPOT target.
struct WorkerRatio {
  bool feasible = false;
  std::string infeasible_reason;                      // set when !feasible
  double prefill_seconds_per_request = 0;             // service time of one prompt
  double prefill_requests_per_second_per_worker = 0;  // at the TTFT target
  double expected_ttft_ms = 0;                        // with prefill_workers workers
  int64_t prefill_workers = 0;
  int64_t decode_batch = 0;   // sequences per decode worker
  double decode_step_ms = 0;  // the TPOT they get
  double decode_tokens_per_second_per_worker = 0;
  int64_t decode_workers = 0;
  double prefill_to_decode_ratio = 0;  // prefill_workers / decode_workers
};

struct Plan {
  // Memory.
  int64_t num_parameters = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes_per_sequence = 0;
  int64_t weights_bytes = 0;
  double weight_bits = 0;      // effective bits per weight
  double kv_budget_bytes = 0;  // may be negative: the weights do not fit
  int64_t max_concurrent_sequences = 0;
  // The same memory for every Tandem KV dtype (same budget and context).
  struct KvDtypeCapacity {
    std::string dtype;
    int64_t kv_bytes_per_token = 0;
    int64_t max_concurrent_sequences = 0;
  };
  std::vector<KvDtypeCapacity> kv_dtype_capacity;  // in KvDtypeSpecs() order
  int64_t batch = 0;                               // the batch the throughput is computed for
  bool batch_fits = false;                         // batch <= max_concurrent_sequences
  double kv_bytes_for_batch = 0;
  // Decode.
  int64_t decode_context = 0;
  double decode_bytes_per_step = 0;
  double decode_steps_per_second_bound = 0;  // at peak bandwidth (and FLOP/s)
  bool decode_compute_bound = false;         // the FLOP roofline is the lower one
  double decode_steps_per_second = 0;        // x bandwidth_efficiency
  double decode_tokens_per_second_bound = 0;
  double decode_tokens_per_second = 0;
  double tpot_ms = 0;
  // The KV read that the seed's rule leaves out: every sequence at full context.
  double kv_read_bytes_per_step_full_context = 0;
  double decode_steps_per_second_bound_full_context = 0;
  // Prefill.
  double prefill_flops_per_token = 0;
  double prefill_tokens_per_second_bound = 0;
  double prefill_tokens_per_second = 0;
  // Cost.
  double usd_per_million_output_tokens = 0;
  double usd_per_million_prompt_tokens = 0;
  WorkerRatio worker_ratio;
  // Human-readable statements of every assumption the numbers rest on.
  std::vector<std::string> assumptions;
};

absl::StatusOr<Plan> ComputePlan(const PlanInputs& in);

// The worker ratio for in.workload given the memory half of `plan`
// (weights_bytes, kv_bytes_per_token, kv_budget_bytes). worker_ratio.cc.
WorkerRatio ComputeWorkerRatio(const PlanInputs& in, const Plan& plan);

// Prefill FLOPs per prompt token for a prompt of `prompt_tokens` tokens:
// 2 x parameters (one multiply-add per weight) + causal attention, which
// averages 2 x layers x q_dim x (prompt_tokens + 1) (QK^T and AV over half
// the prompt on average).
double PrefillFlopsPerToken(const ModelShape& model, int64_t prompt_tokens);

// Seconds one decode step takes at `batch` sequences each holding `context`
// cached tokens, at the inputs' efficiencies (max of the memory and compute
// rooflines). Used by ComputePlan and the --measured comparison.
double DecodeStepSeconds(const PlanInputs& in, double weights_bytes, int64_t kv_bytes_per_token,
                         double batch, double context, double efficiency_bw,
                         double efficiency_flops);

}  // namespace tandem::plan

#endif  // TANDEM_PLAN_CAPACITY_PLAN_H_
