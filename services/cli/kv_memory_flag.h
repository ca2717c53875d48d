// `--kv-cache-memory SIZE|FRACTION`: a command's KV cache budget. Shared by
// generate, serve (checked, then passed on to its workers), router
// --colocated, prefill and decode. A size ("2GiB", "512MiB", "1048576") is
// bytes; a fraction in (0, 1] ("0.25", "0.9") is that share of the memory
// free where the KV cache lives, resolved by the engine when it is built
// (engine::FreeMemoryForKv: MemAvailable on cpu, free device memory less the
// model's weights on cuda; docs/gpu.md).
#ifndef TANDEM_SERVICES_CLI_KV_MEMORY_FLAG_H_
#define TANDEM_SERVICES_CLI_KV_MEMORY_FLAG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace tandem::cli {

inline constexpr char kKvCacheMemoryHelp[] =
    "bytes (2GiB, 512MiB) or a fraction in (0, 1] of the memory free on --device (0.25; "
    "cuda: of free device memory with the weights counted out)";

// Sets config->kv_cache_memory_bytes, or config->kv_cache_memory_fraction
// for a fraction. InvalidArgument (one line, "--kv-cache-memory: ...") on
// junk, a zero or overflowing size, or a fraction outside (0, 1].
absl::Status ApplyKvCacheMemory(const std::string& flag, engine::EngineConfig* config);

// What `tandem serve` passes as --kv-cache-memory to each of its
// `engines_on_device` workers: the flag as given, except a fraction with
// --device cuda, which is split evenly (f / engines, in fixed point): serve starts
// every worker on cuda:0, and each measures the free device memory when it
// starts, so f apiece would ask for up to engines x f of it. (On the CPU a
// fraction stays per engine, as before.) InvalidArgument as
// ApplyKvCacheMemory.
absl::StatusOr<std::string> WorkerKvCacheMemory(const std::string& flag, engine::Device device,
                                                int64_t engines_on_device);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_KV_MEMORY_FLAG_H_
