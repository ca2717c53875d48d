// `tandem plan`: the capacity Fermi estimate (memory -> batch -> throughput
// -> $/token, and the prefill:decode worker ratio) for a model on a device.
// The arithmetic lives in plan/; this file maps flags onto PlanInputs.
#include <cstdio>
#include <string>

#include "absl/strings/str_join.h"
#include "plan/capacity_plan.h"
#include "plan/device_presets.h"
#include "plan/measured.h"
#include "plan/model_source.h"
#include "plan/plan_report.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"

namespace tandem::cli {
namespace {

struct PlanFlags {
  std::string model = "llama-2-13b";
  std::string device = "A100-80GB";
  double device_memory_gb = 0, device_bandwidth_gbs = 0, device_tflops = 0;
  double weight_bits = 16, kv_bytes = 2;
  std::string kv_cache_dtype;
  int64_t context = 2048, batch = 0, decode_context = 0;
  double usd_per_hour = 2, reserve_gb = 4;
  double bandwidth_efficiency = 0.75, compute_efficiency = 0.5;
  int64_t prompt_tokens = 512, output_tokens = 256;
  double request_rate = 10, ttft_ms = 500, tpot_ms = 50;
  std::string measured;
  bool json = false;
};

void AddFlags(ArgParser& p, PlanFlags& f) {
  const std::string models = absl::StrJoin(plan::ModelPresetNames(), ", ");
  const std::string devices = absl::StrJoin(plan::DevicePresetNames(), ", ");
  p.AddString("model", &f.model, "preset (" + models + "), GGUF path, or HF config.json path");
  p.AddString("device", &f.device, "preset (" + devices + ")");
  p.AddDouble("device-memory-gb", &f.device_memory_gb, 0, 1e6,
              "device memory in GB (1e9 B); required for cpu/custom, overrides a preset");
  p.AddDouble("device-bandwidth-gbs", &f.device_bandwidth_gbs, 0, 1e6,
              "memory bandwidth in GB/s; required for cpu/custom");
  p.AddDouble("device-tflops", &f.device_tflops, 0, 1e6,
              "peak dense FLOP/s in TFLOP/s; required for cpu/custom");
  p.AddDouble("weight-bits", &f.weight_bits, 1, 32,
              "bits per weight: 16, 8, 4 (default: 16; a GGUF's size as stored)");
  p.AddDouble("kv-bytes", &f.kv_bytes, 0.125, 8,
              "bytes per KV element: 2 fp16/bf16, 1 fp8/int8, no scales (default 2; on cpu "
              "Tandem's default --kv-cache-dtype f16)");
  p.AddString("kv-cache-dtype", &f.kv_cache_dtype,
              "Tandem's KV dtype instead of --kv-bytes: f32, f16, bf16, int8 or fp8 (int8/fp8 "
              "add a 1 B scale per token, layer, K|V and KV head)");
  p.AddInt("context", &f.context, 1, plan::kMaxContext, "tokens of KV reserved per sequence");
  p.AddInt("batch", &f.batch, 0, 1 << 20, "running sequences per decode step (0: as many as fit)");
  p.AddInt("decode-context", &f.decode_context, 0, plan::kMaxContext,
           "cached tokens per sequence read each decode step (0: weights only, the seed's rule)");
  p.AddDouble("usd-per-hour", &f.usd_per_hour, 0, 1e6, "price of the device per hour");
  p.AddDouble("reserve-gb", &f.reserve_gb, 0, 1e6, "memory kept for activations and buffers");
  p.AddDouble("bandwidth-efficiency", &f.bandwidth_efficiency, 0.01, 1,
              "fraction of peak bandwidth decode reaches");
  p.AddDouble("compute-efficiency", &f.compute_efficiency, 0.01, 1,
              "fraction of peak FLOP/s prefill reaches");
  p.AddInt("prompt-tokens", &f.prompt_tokens, 1, plan::kMaxContext, "workload: prompt length");
  p.AddInt("output-tokens", &f.output_tokens, 1, plan::kMaxContext, "workload: output length");
  p.AddDouble("request-rate", &f.request_rate, 0, 1e9, "workload: requests per second");
  p.AddDouble("ttft-ms", &f.ttft_ms, 1e-3, 1e9, "workload: mean TTFT target");
  p.AddDouble("tpot-ms", &f.tpot_ms, 1e-3, 1e9, "workload: mean TPOT target");
  p.AddString("measured", &f.measured, "bench.json from `tandem bench` to compare with the bounds");
  p.AddBool("json", &f.json, "print one JSON object instead of the table");
}

absl::StatusOr<plan::PlanInputs> BuildInputs(const ArgParser& p, const PlanFlags& f) {
  plan::PlanInputs in;
  absl::StatusOr<plan::ModelShape> model = plan::LoadModelShape(f.model);
  if (!model.ok()) return model.status();
  in.model = *std::move(model);
  absl::StatusOr<plan::DeviceSpec> device = plan::FindDevicePreset(f.device);
  if (!device.ok()) return device.status();
  in.device = *std::move(device);
  const bool custom = in.device.memory_bytes == 0;
  if (custom && !(p.WasSet("device-memory-gb") && p.WasSet("device-bandwidth-gbs") &&
                  p.WasSet("device-tflops"))) {
    return absl::InvalidArgumentError("--device " + in.device.name +
                                      " needs --device-memory-gb, --device-bandwidth-gbs and "
                                      "--device-tflops");
  }
  if (p.WasSet("device-memory-gb")) in.device.memory_bytes = f.device_memory_gb * 1e9;
  if (p.WasSet("device-bandwidth-gbs"))
    in.device.bandwidth_bytes_per_second = f.device_bandwidth_gbs * 1e9;
  if (p.WasSet("device-tflops")) in.device.flops_per_second = f.device_tflops * 1e12;
  if (p.WasSet("weight-bits")) {
    in.weight_bits = f.weight_bits;
  } else if (in.model.file_weight_bytes > 0) {
    in.use_file_weight_bytes = true;
  } else {
    in.weight_bits = in.model.default_weight_bits;
  }
  if (p.WasSet("kv-cache-dtype")) {
    if (p.WasSet("kv-bytes")) {
      return absl::InvalidArgumentError("--kv-cache-dtype and --kv-bytes: give one of them");
    }
    const plan::KvDtypeSpec* spec = plan::FindKvDtypeSpec(f.kv_cache_dtype);
    if (spec == nullptr) {
      return absl::InvalidArgumentError("--kv-cache-dtype: unknown dtype '" + f.kv_cache_dtype +
                                        "' (f32|f16|bf16|int8|fp8)");
    }
    in.kv_bytes_per_element = spec->bytes_per_element;
    in.kv_scale_bytes_per_head = spec->scale_bytes_per_head;
    in.kv_dtype = spec->name;
  } else {
    in.kv_bytes_per_element = f.kv_bytes;
    if (in.device.is_cpu && !p.WasSet("kv-bytes")) in.kv_dtype = "f16";  // the CPU default
  }
  in.context_length = f.context;
  in.batch = f.batch;
  in.decode_context = f.decode_context;
  in.usd_per_hour = f.usd_per_hour;
  in.reserve_bytes = f.reserve_gb * 1e9;
  in.bandwidth_efficiency = f.bandwidth_efficiency;
  in.compute_efficiency = f.compute_efficiency;
  in.workload = {f.prompt_tokens, f.output_tokens, f.request_rate, f.ttft_ms, f.tpot_ms};
  if (absl::Status s = in.Validate(); !s.ok()) return s;
  return in;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem plan: %s\n", std::string(s.message()).c_str());
  return kExitUsage;
}

}  // namespace

int RunPlan(int argc, char** argv) {
  PlanFlags flags;
  ArgParser parser("plan",
                   "Capacity estimate: KV and weight memory, max batch, decode and prefill "
                   "throughput, $ per 1M tokens, and the prefill:decode worker ratio.");
  AddFlags(parser, flags);
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) return Fail(s);
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<plan::PlanInputs> in = BuildInputs(parser, flags);
  if (!in.ok()) return Fail(in.status());
  absl::StatusOr<plan::Plan> result = plan::ComputePlan(*in);
  if (!result.ok()) return Fail(result.status());
  std::optional<plan::MeasuredComparison> measured;
  if (!flags.measured.empty()) {
    absl::StatusOr<plan::BenchResult> bench = plan::ReadBenchResult(flags.measured);
    if (!bench.ok()) return Fail(bench.status());
    measured = plan::CompareMeasured(*in, *result, *bench);
  }
  const plan::MeasuredComparison* m = measured ? &*measured : nullptr;
  if (flags.json) {
    std::printf("%s\n", plan::FormatPlanJson(*in, *result, m).c_str());
  } else {
    std::fputs(plan::FormatPlanTable(*in, *result, m).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace tandem::cli
