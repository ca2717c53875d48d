// How a command's steps report errors: a usage error (bad flags, unusable
// input files: exit 2) is an InvalidArgument status, anything else a failure
// of the run (exit 1). ExitFor prints the one-line message and returns the
// exit code (commands.h).
#ifndef TANDEM_SERVICES_CLI_COMMAND_STATUS_H_
#define TANDEM_SERVICES_CLI_COMMAND_STATUS_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "services/cli/commands.h"

namespace tandem::cli {

inline absl::Status UsageStatus(const std::string& message) {
  return absl::InvalidArgumentError(message);
}
// `s`'s message as a usage error, whatever its code.
inline absl::Status UsageStatus(const absl::Status& s) {
  return absl::InvalidArgumentError(s.message());
}

// "tandem <command>: <message>" on stderr; kExitUsage for InvalidArgument,
// kExitFailure otherwise. REQUIRES: !s.ok().
inline int ExitFor(const char* command, const absl::Status& s) {
  std::fprintf(stderr, "tandem %s: %s\n", command, std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
}

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_COMMAND_STATUS_H_
