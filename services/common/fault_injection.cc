#include "services/common/fault_injection.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"

namespace tandem::services {

absl::Duration FaultDelay(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return absl::ZeroDuration();
  int64_t ms = 0;
  if (!absl::SimpleAtoi(v, &ms) || ms < 0 || ms > 600000) return absl::ZeroDuration();
  return absl::Milliseconds(ms);
}

}  // namespace tandem::services
