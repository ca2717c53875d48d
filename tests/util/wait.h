// Test helper: wait for a condition with a deadline, never a fixed sleep.
#ifndef TANDEM_TESTS_UTIL_WAIT_H_
#define TANDEM_TESTS_UTIL_WAIT_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::testing {

// Polls `pred` every 5 ms until it holds (true) or `timeout` passes (false,
// after one last check).
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UTIL_WAIT_H_
