#include "services/cli/kv_memory_flag.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

absl::StatusOr<std::string> WorkerKvCacheMemory(const std::string& flag, engine::Device device,
                                                int64_t engines_on_device) {
  engine::EngineConfig config;
  if (absl::Status s = ApplyKvCacheMemory(flag, &config); !s.ok()) return s;
  const double fraction = config.kv_cache_memory_fraction;
  if (fraction <= 0 || device != engine::Device::kCuda || engines_on_device <= 1) return flag;
  // Fixed point (never "1e-05", which is no memory size), trailing zeros cut.
  std::string share = absl::StrFormat("%.9f", fraction / static_cast<double>(engines_on_device));
  share.erase(share.find_last_not_of('0') + 1);
  if (share.back() == '.') share.pop_back();
  return share;
}

}  // namespace tandem::cli
