// Accelerators for capacity planning: memory capacity, peak memory bandwidth
// and peak dense bf16 FLOP/s. Units are SI (bytes, bytes/s, FLOP/s; 1 GB =
// 1e9 bytes), the way vendors quote them, so "80 GB" is 80e9 bytes.
#ifndef TANDEM_COMMON_PLAN_DEVICE_PRESETS_H_
#define TANDEM_COMMON_PLAN_DEVICE_PRESETS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::plan {

struct DeviceSpec {
  std::string name;
  double memory_bytes = 0;
  double bandwidth_bytes_per_second = 0;  // peak HBM / DRAM bandwidth
  double flops_per_second = 0;            // peak dense bf16 (or the CPU's FMA peak)
  bool is_cpu = false;                    // Tandem's CPU engine keeps KV in f32

  // InvalidArgument unless every number is finite and > 0 (and below 1e18).
  absl::Status Validate() const;
};

// Presets (case-insensitive), SXM datasheet numbers:
//   A100-80GB   80 GB, 2.039 TB/s, 312 TFLOP/s
//   H100-80GB   80 GB, 3.35 TB/s,  989 TFLOP/s
//   H200-141GB 141 GB, 4.8 TB/s,   989 TFLOP/s
// "cpu" and "custom" return a DeviceSpec with zero numbers that the caller
// must fill (--device-memory-gb etc.). NotFound for any other name.
absl::StatusOr<DeviceSpec> FindDevicePreset(std::string_view name);

std::vector<std::string> DevicePresetNames();

}  // namespace tandem::plan

#endif  // TANDEM_COMMON_PLAN_DEVICE_PRESETS_H_
