#include "services/cli/kv_dtype_flag.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::cli {

void AddKvDtypeFlag(ArgParser& p, std::string* dtype) {
  p.AddString("kv-cache-dtype", dtype, kKvDtypeHelp);
}

absl::StatusOr<std::optional<engine::KvDtype>> ResolveKvDtype(const std::string& flag,
                                                              engine::Device device) {
  if (flag.empty()) return std::optional<engine::KvDtype>();
  engine::KvDtype dtype;
  if (!kernels::ParseKvDtype(flag, &dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: unknown dtype '", flag, "' (",
                                                   kernels::KvDtypeChoices(), ")"));
  }
  TANDEM_RETURN_IF_ERROR(engine::CheckKvDtypeSupported(device, dtype));
  return std::optional<engine::KvDtype>(dtype);
}

}  // namespace tandem::cli
