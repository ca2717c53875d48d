#include "services/cli/output_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tandem::cli {

absl::Status CheckOutputFile(const std::string& flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: '%s' is a directory", flag, path));
  }
  const std::string tmp = path + ".tmp";
  FILE* file = std::fopen(tmp.c_str(), "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot create '%s': %s", flag, tmp, std::strerror(errno)));
  }
  std::fclose(file);
  unlink(tmp.c_str());
  return absl::OkStatus();
}

}  // namespace tandem::cli
