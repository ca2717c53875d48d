// NcclKvReceiver: the decode side of the NCCL KV transport (docs/nccl.md;
// the sender and the protocol: nccl_kv_transport.h). DecodeServiceImpl
// forwards DecodeWorker.NcclConnect / NcclPushKv here when the worker runs
// --kv-transport=nccl.
//
// NcclConnect: checks the peer's KvCompatibility and the unique id, then runs
// ncclCommInitRank (rank 1 of 2) on the handler's thread, bounded by
// connect_timeout and the RPC deadline (and stopped when the caller cancels).
// The communicator replaces any older one of the same peer_id.
//
// NcclPushKv, before any NCCL operation: the header is checked with
// ValidateKvHeader (compat, every size, token ids), draining refuses, the
// block layout and blocks_per_segment are checked, the (peer, generation)
// must be the current communicator (else ABORTED: the sender reconnects) with
// no transfer in flight, and the size is reserved in the KvLeaseTable. Only
// then are the grouped ncclRecv posted and `ready` sent. Then it waits for the
// payload (transfer_timeout / the RPC deadline; the sender cancelling the
// stream ends the wait), unpacks it into a KvExport and commits the lease
// exactly like PushKv. Any failure after the reservation: ncclCommAbort of
// the pair's communicator (dropped; the sender must reconnect), the
// reservation aborted, an error status.
// A streamed push (begin.streamed): the same checks and the reservation at
// `begin`, nothing posted; then per `segment` round, with the pair's lock
// held: receives posted, `ready`, the wait, `received` (after the lock is
// released). A failure inside a round aborts the communicator as above; one
// between rounds (the sender went away, a bad segment, `sent` too early)
// drops the reservation only.
//
// Thread safety: thread-safe; transfers from different peers run
// concurrently.
#ifndef TANDEM_SERVICES_TRANSFER_NCCL_RECEIVER_H_
#define TANDEM_SERVICES_TRANSFER_NCCL_RECEIVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/sync_stream.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/kv_lease_table.h"
#include "services/transfer/nccl_kv_path.h"
#include "services/transfer/nccl_ops.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::transfer {

struct NcclReceiverConfig {
  tandem::v1::KvCompatibility compat;  // ours
  int64_t bytes_per_token = 0;
  int64_t max_tokens = 0;
  int64_t vocab_size = 0;
  std::function<int64_t()> free_bytes;  // free KV capacity for Reserve
  std::function<bool()> draining;       // may be empty
  // The decode executor's engine::Executor::kv_memory_domain(). A
  // token-segment push (the GPU-resident form) is received straight into new
  // memory of the ops when it is ops->memory_domain() (the lease holds it,
  // KvExport::device, and Decode scatters it into the cache on the device);
  // otherwise through the staging buffers into host bytes.
  std::string kv_memory_domain;
  // Called after each committed handoff (metrics); may be empty.
  std::function<void(int64_t bytes, double seconds)> on_received;
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration transfer_timeout = absl::Seconds(60);
  int max_peers = 256;  // communicators held at once
};

class NcclKvReceiver {
 public:
  // leases: not owned, must outlive this.
  NcclKvReceiver(std::shared_ptr<NcclOps> ops, NcclReceiverConfig config, KvLeaseTable* leases);
  ~NcclKvReceiver();  // aborts every communicator

  grpc::Status Connect(grpc::ServerContext* context, const tandem::v1::NcclConnectRequest* request,
                       tandem::v1::NcclConnectResponse* response);
  grpc::Status PushKv(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<tandem::v1::NcclPushKvResponse,
                                               tandem::v1::NcclPushKvRequest>* stream);

  int num_peers();                                       // communicators held now
  int num_aborts() const { return num_aborts_.load(); }  // communicators aborted on failure

 private:
  struct Pair;
  void Fail(const std::string& peer_id, const std::shared_ptr<Pair>& pair);
  // PushKv's steps: the `begin` message checked (header, draining, block
  // layout) before any NCCL operation; then, with the pair's transfer lock
  // held, reserve -> post ncclRecv -> `ready` -> wait -> `sent` -> commit,
  // every failure releasing both sides.
  // What a checked `begin` asks for: the block-packed form (layout,
  // blocks_per_segment) or the token-major one (token_segments not empty).
  struct RecvPlan {
    KvBlockLayout layout;
    std::vector<TokenSegment> token_segments;
  };
  absl::StatusOr<RecvPlan> CheckPushBegin(const tandem::v1::NcclPushBegin& begin) const;
  using Stream =
      grpc::ServerReaderWriter<tandem::v1::NcclPushKvResponse, tandem::v1::NcclPushKvRequest>;
  // The one-transfer form; *done is the reply PushKv writes once the pair's
  // lock is released.
  grpc::Status ReceiveLocked(grpc::ServerContext* context, Stream* stream,
                             const tandem::v1::NcclPushBegin& begin, const RecvPlan& plan,
                             const std::string& peer, const std::shared_ptr<Pair>& pair,
                             tandem::v1::NcclPushKvResponse* done);
  // The streamed form: reserve, then one ReceiveRound per `segment` (each
  // under the pair's lock), commit at `sent`.
  grpc::Status ReceiveStreamed(grpc::ServerContext* context, Stream* stream,
                               const tandem::v1::NcclPushBegin& begin, const std::string& peer,
                               const std::shared_ptr<Pair>& pair);
  // One round: post the receives (into dst_device, or through the staging
  // buffers into dst_host), `ready`, wait for them. REQUIRES: pair.mu held.
  absl::Status ReceiveRound(grpc::ServerContext* context, Stream* stream,
                            const std::vector<TokenSegment>& segments, Pair& pair, char* dst_device,
                            char* dst_host);
  // Fills kv's geometry from the header, commits the lease and sets *done.
  void Commit(const tandem::v1::KvTransferHeader& header, std::shared_ptr<engine::KvExport> kv,
              absl::Time start, tandem::v1::NcclPushKvResponse* done);
  // New ops memory a lease holds (KvExport::device), freed in the background.
  absl::StatusOr<std::shared_ptr<engine::KvDeviceBytes>> KeptDeviceBytes(int64_t bytes);
  // Posts the receives of `plan` on the pair's stream. Token segments go into
  // *device (new ops memory) when kept on the device, else into the staging
  // buffer; block-packed pushes into the staging buffer, with the download.
  absl::Status PostReceives(const tandem::v1::NcclPushBegin& begin, const RecvPlan& plan,
                            Pair& pair, absl::Time deadline,
                            std::shared_ptr<engine::KvDeviceBytes>* device);
  // After the payload landed: *kv's payload from *device or the staging buffer.
  absl::Status TakePayload(const RecvPlan& plan, Pair& pair, absl::Time deadline,
                           std::shared_ptr<engine::KvDeviceBytes> device, engine::KvExport* kv);

  const std::shared_ptr<NcclOps> ops_;
  const NcclReceiverConfig config_;
  KvLeaseTable* const leases_;
  std::atomic<int> num_aborts_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Pair>> pairs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_NCCL_RECEIVER_H_
