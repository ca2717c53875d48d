// `--device cpu|cuda`: where a command's engine runs (engine/executor.h).
// Shared by generate, serve, router --colocated, prefill and decode.
#ifndef TANDEM_SERVICES_CLI_DEVICE_FLAG_H_
#define TANDEM_SERVICES_CLI_DEVICE_FLAG_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "services/cli/args.h"

namespace tandem::cli {

inline constexpr char kDeviceHelp[] =
    "where the model runs: cpu (default) or cuda (an NVIDIA GPU; docs/gpu.md)";

void AddDeviceFlag(ArgParser& p, std::string* device);

// The device named by the flag, checked to exist here before any slow
// start-up work: InvalidArgument for an unknown name, FailedPrecondition
// (one line, "--device cuda: ...") for a CUDA device this build or machine
// does not have.
absl::StatusOr<engine::Device> ResolveDevice(const std::string& flag);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_DEVICE_FLAG_H_
