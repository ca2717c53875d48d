// Logging is spdlog (Debian libspdlog-dev). Long-running commands (router,
// prefill, decode, serve) call InitLogging once; everything then logs with
// spdlog::info / warn / error. One-shot commands (generate, bench, plan...)
// print their progress and results directly: that is their output, not a log.
#ifndef TANDEM_COMMON_LOG_H_
#define TANDEM_COMMON_LOG_H_

#include <string>

#include "absl/status/status.h"

namespace tandem {

// Sets the process's default logger: stderr (coloured on a terminal), lines
// "2026-12-04 07:55:00.123 info [router] message", level from
// TANDEM_LOG_LEVEL (trace, debug, info, warn, error, critical, off; default
// info). InvalidArgument names a bad level (the logger is still set, at info).
absl::Status InitLogging(const std::string& component);

}  // namespace tandem

#endif  // TANDEM_COMMON_LOG_H_
