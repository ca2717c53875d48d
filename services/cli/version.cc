#include <cstdio>

#include "services/cli/args.h"
#include "services/cli/commands.h"

namespace tandem::cli {

int RunVersion(int argc, char** argv) {
  ArgParser parser("version", "Prints the version and build configuration.");
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "tandem: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  std::printf("tandem %s\n", TANDEM_VERSION);
#if defined(__AVX512F__)
  std::printf("cpu: avx512\n");
#elif defined(__AVX2__)
  std::printf("cpu: avx2\n");
#else
  std::printf("cpu: generic\n");
#endif
  std::printf("compiler: %s\n", __VERSION__);
  return kExitOk;
}

}  // namespace tandem::cli
