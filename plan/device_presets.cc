#include "plan/device_presets.h"

#include <array>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::plan {
namespace {

struct DevicePreset {
  const char* name;
  double memory_gb, bandwidth_tbs, tflops;
};

// NVIDIA datasheets, SXM form factor, dense (no sparsity) bf16 tensor cores.
constexpr std::array<DevicePreset, 3> kDevicePresets = {{
    {"A100-80GB", 80, 2.039, 312},
    {"H100-80GB", 80, 3.35, 989},
    {"H200-141GB", 141, 4.8, 989},
}};

absl::Status CheckPositive(const char* what, double v) {
  if (!(std::isfinite(v) && v > 0 && v < 1e18)) {
    return absl::InvalidArgumentError(absl::StrCat("device ", what, " must be > 0 (got ", v, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DeviceSpec::Validate() const {
  if (absl::Status s = CheckPositive("memory", memory_bytes); !s.ok()) return s;
  if (absl::Status s = CheckPositive("bandwidth", bandwidth_bytes_per_second); !s.ok()) return s;
  return CheckPositive("FLOP/s", flops_per_second);
}

absl::StatusOr<DeviceSpec> FindDevicePreset(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const DevicePreset& p : kDevicePresets) {
    if (lower != absl::AsciiStrToLower(p.name)) continue;
    DeviceSpec d;
    d.name = p.name;
    d.memory_bytes = p.memory_gb * 1e9;
    d.bandwidth_bytes_per_second = p.bandwidth_tbs * 1e12;
    d.flops_per_second = p.tflops * 1e12;
    return d;
  }
  if (lower == "cpu" || lower == "custom") {
    DeviceSpec d;
    d.name = lower;
    d.is_cpu = lower == "cpu";
    return d;
  }
  return absl::NotFoundError(absl::StrCat("unknown device '", std::string(name), "' (presets: ",
                                          absl::StrJoin(DevicePresetNames(), ", "), ")"));
}

std::vector<std::string> DevicePresetNames() {
  std::vector<std::string> names;
  for (const DevicePreset& p : kDevicePresets) names.emplace_back(p.name);
  names.emplace_back("cpu");
  names.emplace_back("custom");
  return names;
}

}  // namespace tandem::plan
