#include "services/cli/device_flag.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::cli {

void AddDeviceFlag(ArgParser& p, std::string* device) {
  p.AddString("device", device, kDeviceHelp);
}

absl::StatusOr<engine::Device> ResolveDevice(const std::string& flag) {
  engine::Device device;
  if (!engine::ParseDevice(flag, &device)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: unknown device '", flag, "' (cpu or cuda)"));
  }
  TANDEM_RETURN_IF_ERROR(engine::CheckDeviceAvailable(device));
  return device;
}

}  // namespace tandem::cli
