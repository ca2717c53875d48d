// `tandem prefill` / `tandem decode`: one worker process each (placeholder
// until the worker servers land).
#include <cstdio>

#include "services/cli/commands.h"

namespace tandem::cli {

int RunPrefill(int argc, char** argv) {
  std::fprintf(stderr, "tandem prefill: not built yet\n");
  return kExitFailure;
}
int RunDecode(int argc, char** argv) {
  std::fprintf(stderr, "tandem decode: not built yet\n");
  return kExitFailure;
}

}  // namespace tandem::cli
