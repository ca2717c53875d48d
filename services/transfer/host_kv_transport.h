// HostKvTransport: the client side of DecodeWorker.PushKv. One header
// message (handle, compat, num_tokens, bytes_per_token, total_bytes, token
// ids), written at Open, then the payload (KvExport layout,
// engine/kv_export.h) in raw chunks of at most kMaxChunkBytes as each piece
// is written, so the receiver copies the first blocks while the prefill
// still computes the rest. Channels are cached per address.
//
// Thread safety: thread-safe.
#ifndef TANDEM_SERVICES_TRANSFER_HOST_KV_TRANSPORT_H_
#define TANDEM_SERVICES_TRANSFER_HOST_KV_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "services/common/tls.h"
#include "services/transfer/kv_transport.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::transfer {

class HostKvTransport final : public KvTransport {
 public:
  // security: TLS of the channels to decode workers (default plaintext).
  explicit HostKvTransport(int64_t chunk_bytes = kMaxChunkBytes,
                           services::ChannelSecurity security = {})
      : chunk_bytes_(chunk_bytes), security_(std::move(security)) {}

  absl::StatusOr<std::unique_ptr<KvSendStream>> Open(const KvTransferTarget& target,
                                                     const tandem::v1::KvCompatibility& compat,
                                                     const KvSendPlan& plan,
                                                     absl::Time deadline) override;

  // The same on gRPC's callback API: no thread waits on the wire.
  std::shared_ptr<KvAsyncSendStream> OpenAsync(const KvTransferTarget& target,
                                               const tandem::v1::KvCompatibility& compat,
                                               const KvSendPlan& plan, absl::Time deadline,
                                               KvAsyncSendStream::DoneCallback on_done) override;

  // The header Open writes first (exposed for tests and the NCCL transport).
  static tandem::v1::KvTransferHeader MakeHeader(const KvTransferTarget& target,
                                                 const tandem::v1::KvCompatibility& compat,
                                                 const KvSendPlan& plan);

 private:
  std::shared_ptr<tandem::v1::DecodeWorker::Stub> StubFor(const std::string& address);

  const int64_t chunk_bytes_;
  const services::ChannelSecurity security_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<tandem::v1::DecodeWorker::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

// A channel with the limits the workers use (message size > 4 MiB chunks);
// TLS per `security` (default plaintext).
std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const services::ChannelSecurity& security = {});

// The context of a transfer's calls to the decode worker: a child of the
// Prefill call when target.parent is set (its cancellation and deadline
// propagate), else a fresh one; `deadline`, when finite, bounds it too.
std::unique_ptr<grpc::ClientContext> MakeTransferContext(const KvTransferTarget& target,
                                                         absl::Time deadline);

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_HOST_KV_TRANSPORT_H_
