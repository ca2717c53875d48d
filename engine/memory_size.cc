#include "engine/memory_size.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tandem::engine {
namespace {

struct Unit {
  const char* name;
  double bytes;
};

constexpr Unit kUnits[] = {
    {"b", 1.0},
    {"kib", 1024.0},
    {"mib", 1048576.0},
    {"gib", 1073741824.0},
    {"tib", 1099511627776.0},
    {"kb", 1e3},
    {"mb", 1e6},
    {"gb", 1e9},
    {"tb", 1e12},
    {"k", 1024.0},
    {"m", 1048576.0},
    {"g", 1073741824.0},
};

absl::Status Junk(absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad memory size \"", text, "\": want e.g. 2GiB, 512MiB, 1048576 or 0.5"));
}

}  // namespace

absl::StatusOr<MemoryBudget> ParseMemoryBudget(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[split])) || s[split] == '.')) {
    ++split;
  }
  const absl::string_view number = s.substr(0, split);
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(split)));
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return Junk(text);
  }
  double bytes = 0;
  if (unit.empty()) {
    if (number.find('.') != absl::string_view::npos || value <= 1.0) {
      if (!(value > 0.0 && value <= 1.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("memory fraction \"", text, "\" must be in (0, 1]"));
      }
      return MemoryBudget{0, value};
    }
    bytes = value;
  } else {
    const Unit* found = nullptr;
    for (const Unit& u : kUnits) {
      if (unit == u.name) found = &u;
    }
    if (found == nullptr) return Junk(text);
    bytes = value * found->bytes;
  }
  if (bytes < 1.0)
    return absl::InvalidArgumentError(absl::StrCat("memory size \"", text, "\" is zero"));
  if (bytes >= 9.2e18)
    return absl::InvalidArgumentError(absl::StrCat("memory size \"", text, "\" overflows"));
  return MemoryBudget{static_cast<int64_t>(bytes), 0};
}

absl::StatusOr<int64_t> ShareOfFreeBytes(double fraction, int64_t free_bytes) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory fraction ", fraction, " must be in (0, 1]"));
  }
  if (free_bytes <= 0) return absl::ResourceExhaustedError("no memory is free");
  const double bytes = std::floor(fraction * static_cast<double>(free_bytes));
  if (bytes < 1.0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory fraction ", fraction, " of ", free_bytes, " free bytes is zero"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text, int64_t available_bytes) {
  absl::StatusOr<MemoryBudget> budget = ParseMemoryBudget(text);
  if (!budget.ok()) return budget.status();
  if (!budget->is_fraction()) return budget->bytes;
  if (available_bytes <= 0) return absl::InvalidArgumentError("available memory is unknown");
  const double bytes = budget->fraction * static_cast<double>(available_bytes);
  if (bytes < 1.0)
    return absl::InvalidArgumentError(absl::StrCat("memory size \"", text, "\" is zero"));
  if (bytes >= 9.2e18)
    return absl::InvalidArgumentError(absl::StrCat("memory size \"", text, "\" overflows"));
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  const bool fraction = !s.empty() &&
                        s.find_first_not_of("0123456789.") == absl::string_view::npos &&
                        (s.find('.') != absl::string_view::npos || s == "1" || s == "0");
  int64_t available = 0;
  if (fraction) {
    absl::StatusOr<int64_t> avail = ReadAvailableMemoryBytes();
    if (!avail.ok()) return avail.status();
    available = *avail;
  }
  return ParseMemorySize(text, available);
}

absl::StatusOr<int64_t> ReadAvailableMemoryBytes(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = line;
    if (!absl::ConsumePrefix(&l, "MemAvailable:")) continue;
    l = absl::StripAsciiWhitespace(l);
    const bool kb = absl::ConsumeSuffix(&l, "kB");
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(l), &value) || value < 0) break;
    return kb ? value * 1024 : value;
  }
  return absl::InternalError(absl::StrCat("no MemAvailable line in ", path));
}

}  // namespace tandem::engine
