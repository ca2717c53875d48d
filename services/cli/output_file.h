// Output files of long commands (`tandem quantize --out`, `tandem bench
// --out`): checked before the work, so an unwritable path fails in a second
// rather than after minutes of quantizing or benchmarking.
#ifndef TANDEM_SERVICES_CLI_OUTPUT_FILE_H_
#define TANDEM_SERVICES_CLI_OUTPUT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace tandem::cli {

// InvalidArgument naming `flag` when `path` is a directory or `path`.tmp
// cannot be created (no such directory, no permission); creates nothing that
// stays behind.
absl::Status CheckOutputFile(const std::string& flag, const std::string& path);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_OUTPUT_FILE_H_
