// KvCompatibility: what must match for KV bytes to mean the same on both
// sides of a handoff (model, dtype, block size, layers, KV heads, head dim).
#ifndef TANDEM_SERVICES_COMMON_COMPAT_H_
#define TANDEM_SERVICES_COMMON_COMPAT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/gguf/gguf.h"
#include "engine/llama_model.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::services {

// Fingerprint of a GGUF: FNV-1a 64 over the metadata keys (and string / int
// values), the tensor infos (name, shape, type, offset, size) and the file
// size. Stable across processes and machines.
uint64_t ModelFingerprint(const gguf::GgufFile& file);

// Hash of fields 1-7 of compat (FNV-1a 64, stable).
uint64_t CompatHash(const tandem::v1::KvCompatibility& compat);

// Fills every field, hash included; kv_dtype is the KV cache's element type
// ("f32", "f16", "bf16", "int8", "fp8": kernels::KvDtypeName), so a prefill
// and a decode worker with different --kv-cache-dtype refuse each other.
tandem::v1::KvCompatibility MakeCompat(const gguf::GgufFile& file, const engine::LlamaModel& model,
                                       const std::string& model_name, int32_t block_size,
                                       engine::KvDtype kv_dtype = engine::KvDtype::kF32);

// OK when `theirs` matches `ours`; else FailedPrecondition naming the first
// differing field (every field is compared, then the hash, then the hash of
// their fields against their declared hash).
absl::Status CheckCompat(const tandem::v1::KvCompatibility& ours,
                         const tandem::v1::KvCompatibility& theirs);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_COMPAT_H_
