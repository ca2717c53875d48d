// Parsing of memory sizes given on the command line ("--kv-cache-memory").
//
// Accepted: an integer byte count ("1048576"); a number with a binary unit
// KiB, MiB, GiB, TiB or a decimal unit KB, MB, GB, TB (case-insensitive,
// optional space: "2GiB", "512 MiB", "1.5GB"); or a bare fraction in (0, 1]
// ("0.5") meaning that share of the memory free where the budget lives:
// MemAvailable in /proc/meminfo here, free device memory for a CUDA engine's
// KV cache (EngineConfig::kv_cache_memory_fraction).
#ifndef TANDEM_ENGINE_MEMORY_SIZE_H_
#define TANDEM_ENGINE_MEMORY_SIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::engine {

// A memory size as given, before a fraction is resolved: exactly one of
// bytes (> 0) and fraction (in (0, 1]) is set.
struct MemoryBudget {
  int64_t bytes = 0;
  double fraction = 0;
  bool is_fraction() const { return fraction > 0; }
};

// InvalidArgument on junk, negative, zero or overflowing sizes and on a
// fraction outside (0, 1]; a fraction is kept as is.
absl::StatusOr<MemoryBudget> ParseMemoryBudget(absl::string_view text);

// floor(fraction * free_bytes): the bytes a fraction of free memory gives.
// InvalidArgument for a fraction outside (0, 1], ResourceExhausted when
// free_bytes <= 0 or the share is under one byte.
absl::StatusOr<int64_t> ShareOfFreeBytes(double fraction, int64_t free_bytes);

// InvalidArgument on junk, negative, zero or overflowing sizes. Fractions use
// `available_bytes`.
absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text, int64_t available_bytes);

// As above, reading MemAvailable from /proc/meminfo only for a fraction.
absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text);

// MemAvailable (bytes) from a /proc/meminfo-format file. NotFound / Internal
// when it cannot be read.
absl::StatusOr<int64_t> ReadAvailableMemoryBytes(const char* path = "/proc/meminfo");

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_MEMORY_SIZE_H_
