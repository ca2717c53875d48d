#include "services/cli/kv_memory_flag.h"

#include "absl/strings/str_cat.h"
#include "engine/memory_size.h"

namespace tandem::cli {

absl::Status ApplyKvCacheMemory(const std::string& flag, engine::EngineConfig* config) {
  absl::StatusOr<engine::MemoryBudget> budget = engine::ParseMemoryBudget(flag);
  if (!budget.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-memory: ", budget.status().message()));
  }
  config->kv_cache_memory_bytes = budget->is_fraction() ? 0 : budget->bytes;
  config->kv_cache_memory_fraction = budget->fraction;
  return absl::OkStatus();
}

}  // namespace tandem::cli
