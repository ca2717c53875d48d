// `--kv-cache-dtype f32|f16|bf16|int8|fp8`: the element type of a command's
// KV cache (kernels/kv_dtype.h, docs/kv_cache.md). Shared by generate, serve
// (passed on to its workers), router --colocated, prefill and decode.
#ifndef TANDEM_SERVICES_CLI_KV_DTYPE_FLAG_H_
#define TANDEM_SERVICES_CLI_KV_DTYPE_FLAG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "services/cli/args.h"

namespace tandem::cli {

inline constexpr char kKvDtypeHelp[] =
    "KV cache element type: f32, f16, bf16, int8 or fp8 (e4m3; int8/fp8 with a scale per "
    "token and KV head); default f16 on cpu, f32 on cuda (docs/kv_cache.md)";

// Adds --kv-cache-dtype; *dtype stays empty unless it is given.
void AddKvDtypeFlag(ArgParser& p, std::string* dtype);

// The dtype named by the flag for an engine on `device`; nullopt when the
// flag is empty (the engine's default for the device). InvalidArgument for
// an unknown name, FailedPrecondition for a dtype the device's executor does
// not hold (CUDA: f32 only). Both are one line naming --kv-cache-dtype.
absl::StatusOr<std::optional<engine::KvDtype>> ResolveKvDtype(const std::string& flag,
                                                              engine::Device device);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_KV_DTYPE_FLAG_H_
