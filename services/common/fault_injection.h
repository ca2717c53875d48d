// Test hooks for the fault tests (tests/integration/faults_test.cc): delays
// read once from the environment, so a test can hold a request at a chosen
// stage (e.g. mid-transfer) and kill or cancel it there. Unset (the
// default, and in production) they cost one relaxed load.
//
//   TANDEM_FAULT_KV_PUSH_DELAY_MS   prefill worker: sleep after the PushKv
//                                   header, before the first payload byte.
//
// Thread safety: thread-safe.
#ifndef TANDEM_SERVICES_COMMON_FAULT_INJECTION_H_
#define TANDEM_SERVICES_COMMON_FAULT_INJECTION_H_

#include "absl/time/time.h"

namespace tandem::services {

// The delay named by environment variable `name` (milliseconds, 0..600000);
// zero when unset or malformed.
absl::Duration FaultDelay(const char* name);

inline constexpr char kFaultKvPushDelay[] = "TANDEM_FAULT_KV_PUSH_DELAY_MS";

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_FAULT_INJECTION_H_
