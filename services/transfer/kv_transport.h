// KvTransport: moves the K/V of one request from a prefill worker to a decode
// worker. The sender names the target (decode worker address + router-chosen
// handle); the receiver validates a header (compat hash, every size) before
// it accepts a payload byte and holds the result under a lease
// (kv_lease_table.h) until Decode claims it.
//
// Implementations: HostKvTransport (bytes over the DecodeWorker.PushKv gRPC
// stream; host_kv_transport.h) and NcclKvTransport (the header over gRPC, the
// payload by ncclSend; nccl_kv_transport.h, docs/nccl.md).
//
// Thread safety: Send may be called from many threads at once.
#ifndef TANDEM_SERVICES_TRANSFER_KV_TRANSPORT_H_
#define TANDEM_SERVICES_TRANSFER_KV_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv_export.h"
#include "grpcpp/server_context.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::transfer {

inline constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;  // 4 MiB per message

struct KvTransferTarget {
  std::string address;    // decode worker host:port
  std::string kv_handle;  // unique id of this handoff
  std::string request_id;
  // The Prefill call this transfer serves: when set, its cancellation (the
  // router aborted the request) and deadline propagate to the transfer, so
  // the receiver drops the partial push at once. Not owned; may be null.
  const grpc::ServerContext* parent = nullptr;
};

struct KvSendResult {
  int64_t num_bytes = 0;
  double seconds = 0;
  double lease_seconds = 0;  // how long the receiver holds it unclaimed
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Sends `kv` (described by `compat`) to target; returns when the receiver
  // has accepted all of it. Errors are the receiver's (FailedPrecondition
  // for a compat mismatch, InvalidArgument for sizes, ResourceExhausted when
  // it has no room) or the transport's (Unavailable, DeadlineExceeded).
  virtual absl::StatusOr<KvSendResult> Send(const KvTransferTarget& target,
                                            const tandem::v1::KvCompatibility& compat,
                                            const engine::KvExport& kv, absl::Time deadline) = 0;
};

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_KV_TRANSPORT_H_
