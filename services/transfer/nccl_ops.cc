// The factory when the build has no NCCL (services/CMakeLists.txt defines
// TANDEM_HAVE_NCCL and adds cuda/nccl_ops_cuda.cc when CUDA and NCCL are found).
#include "services/transfer/nccl_ops.h"

namespace tandem::transfer {

#ifndef TANDEM_HAVE_NCCL
bool NcclBuiltIn() { return false; }

absl::StatusOr<std::shared_ptr<NcclOps>> MakeCudaNcclOps(int device) {
  return absl::UnavailableError(
      "this tandem build has no NCCL (it was configured without CUDA or without NCCL; "
      "see docs/nccl.md), so --kv-transport=nccl is not available");
}
#endif

}  // namespace tandem::transfer
