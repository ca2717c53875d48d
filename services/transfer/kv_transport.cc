#include "services/transfer/kv_transport.h"

#include <utility>

#include "common/status.h"

namespace tandem::transfer {

absl::StatusOr<KvSendResult> KvTransport::Send(const KvTransferTarget& target,
                                               const tandem::v1::KvCompatibility& compat,
                                               const engine::KvExport& kv, absl::Time deadline) {
  KvSendPlan plan{kv.token_ids, kv.bytes_per_token};
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvSendStream> stream,
                          Open(target, compat, plan, deadline));
  TANDEM_RETURN_IF_ERROR(kv.device != nullptr ? stream->WriteDevice(kv.device)
                                              : stream->Write(kv.bytes));
  return stream->Finish();
}

}  // namespace tandem::transfer
