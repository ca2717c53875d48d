// Parsing of memory sizes given on the command line ("--kv-cache-memory").
//
// Accepted: an integer byte count ("1048576"); a number with a binary unit
// KiB, MiB, GiB, TiB or a decimal unit KB, MB, GB, TB (case-insensitive,
// optional space: "2GiB", "512 MiB", "1.5GB"); or a bare fraction in (0, 1]
// ("0.5") meaning that share of MemAvailable in /proc/meminfo.
#ifndef TANDEM_ENGINE_MEMORY_SIZE_H_
#define TANDEM_ENGINE_MEMORY_SIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::engine {

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
