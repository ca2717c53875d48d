// PushKvReactor: one DecodeWorker.PushKv call (a prefill worker's host KV
// handoff, client-streaming) on gRPC's callback API.
//
// The first message must be the header: it is validated and the declared
// size reserved in the lease table (transfer::KvPushReceiver) before any
// payload byte is read; each data chunk is appended as it arrives
// (OnReadDone), and the end of the stream commits the lease. No thread
// waits between chunks, so slow pushes cost no threads. Statuses are as
// they were for the sync handler: INVALID_ARGUMENT for a malformed stream,
// the lease table's codes (RESOURCE_EXHAUSTED with retry hints), UNAVAILABLE
// while draining, CANCELLED when the pusher cancels. A reservation not
// committed is aborted before the status is sent.
//
// Lifetime: the reactor deletes itself in OnDone; it counts as an active
// RPC (drain) until then.
//
// Thread safety: gRPC serializes this reactor's reactions (one read at a
// time, OnDone last); the lease table is thread-safe.
#ifndef TANDEM_SERVICES_DECODE_PUSH_KV_REACTOR_H_
#define TANDEM_SERVICES_DECODE_PUSH_KV_REACTOR_H_

#include <optional>

#include "absl/time/time.h"
#include "grpcpp/support/server_callback.h"
#include "services/common/worker_host.h"
#include "services/decode/decode_server.h"
#include "services/transfer/kv_push_receiver.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::decode {

class PushKvReactor final : public grpc::ServerReadReactor<tandem::v1::KvChunk> {
 public:
  // Starts reading the call's stream; see above.
  PushKvReactor(DecodeServiceImpl* service, grpc::CallbackServerContext* context,
                tandem::v1::PushKvResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  ~PushKvReactor() override = default;
  // The header: validate and reserve. False when the call has ended.
  bool OnHeader();
  // The end of the stream: commit the lease.
  void OnEnd();
  void End(const grpc::Status& status);

  DecodeServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  tandem::v1::PushKvResponse* const response_;
  const services::ActiveRpc active_;
  tandem::v1::KvChunk chunk_;                         // the read in flight
  std::optional<transfer::KvPushReceiver> receiver_;  // after the header
  absl::Time start_;
};

}  // namespace tandem::decode

#endif  // TANDEM_SERVICES_DECODE_PUSH_KV_REACTOR_H_
