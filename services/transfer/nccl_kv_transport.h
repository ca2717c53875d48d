// NcclKvTransport: the sender (prefill side) of the NCCL KV transport
// (docs/nccl.md). The header goes over gRPC, the payload by ncclSend.
//
// Per decode worker address there is one pair: a communicator of 2 ranks
// (prefill = rank 0, decode = rank 1), its dedicated stream and a staging
// buffer (pinned host + device). The communicator is made lazily at the first
// transfer: GetUniqueId, then DecodeWorker.NcclConnect (unique id, peer id,
// generation) while this side runs CommInitRank at the same time (both ranks
// must be inside init together); both bounded by connect_timeout.
//
// A handoff (Open / Write / Finish, what a prefill worker uses) is streamed,
// on one DecodeWorker.NcclPushKv stream:
//   open:   -> begin{header, streamed}; the receiver validates the header
//           (transfer::ValidateKvHeader), reserves the whole size and
//           answers <- ready; nothing is posted on either side. A
//           rejection is the receiver's error (FailedPrecondition,
//           InvalidArgument, ResourceExhausted, Unavailable).
//   Write:  one round per piece, with the pair's mutex held: -> segment
//           {token_segments}; the receiver posts its ncclRecvs <- ready;
//           grouped ncclSend (host bytes uploaded through the pair's
//           staging first), wait (transfer_timeout); <- received.
//   Finish: -> sent; <- done{bytes_received, lease_seconds} once the
//           receiver committed the lease.
// Between rounds the pair is free: handoffs to one decode worker interleave
// round by round instead of queueing behind a whole prefill.
// Send (a whole KvExport) is one transfer, serialized per pair:
//   1. -> begin{header, blocks_per_segment}; the receiver validates the
//      header, reserves the size in its KvLeaseTable and posts its
//      ncclRecv, then <- ready. A rejection ends the stream before any NCCL
//      operation on either side.
//   2. pack the KvExport into blocks (kv_block_packing.h), upload, grouped
//      ncclSend per segment, wait for the stream (transfer_timeout).
//   3. -> sent; <- done{bytes_received, lease_seconds} once the receiver
//      unpacked and committed the lease.
// Failure, timeout or cancellation during a round (or after `ready` of a
// transfer): this side aborts the pair's communicator (ncclCommAbort) and
// drops it (the next transfer makes a new one; other handoffs open on it
// fail at their next round), cancels the stream so that the receiver aborts
// its communicator and its reservation, and returns Unavailable /
// DeadlineExceeded / Cancelled naming the peer. A streamed handoff dropped
// or cancelled between rounds only cancels its stream: nothing is in flight,
// the communicator stays.
// When the transfer serves a Prefill call (KvTransferTarget::parent), its
// gRPC calls are children of that call, and cancelling it ends the wait for
// the peer's init or for the ncclSend within 20 ms (Cancelled); the receiver
// sees its stream cancelled and drops its side the same way.
// ABORTED from the receiver at `begin` means it has no (or another)
// communicator for us (it restarted, or aborted after a failure): the pair is
// re-created and the transfer retried once.
//
// Thread safety: Open and Send are thread-safe; one KvSendStream is driven
// by one thread (its Cancel from any); transfers to different decode
// workers run concurrently.
#ifndef TANDEM_SERVICES_TRANSFER_NCCL_KV_TRANSPORT_H_
#define TANDEM_SERVICES_TRANSFER_NCCL_KV_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "services/common/tls.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/nccl_kv_path.h"
#include "services/transfer/nccl_ops.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::transfer {

struct NcclTransportOptions {
  absl::Duration connect_timeout = absl::Seconds(60);   // NcclConnect + comm init
  absl::Duration transfer_timeout = absl::Seconds(60);  // the NCCL part of one transfer
  int64_t max_segment_bytes = int64_t{64} << 20;        // bytes per ncclSend (whole blocks)
  std::string peer_id;                                  // empty: random per instance
  services::ChannelSecurity security;                   // of the gRPC channels (default plaintext)
};

class NcclKvTransport final : public KvTransport {
 public:
  NcclKvTransport(std::shared_ptr<NcclOps> ops, NcclTransportOptions options = {});
  ~NcclKvTransport() override;  // aborts every communicator

  // A streamed handoff: `begin` now (the receiver checks the header and
  // reserves), then each Write / WriteDevice is one round on the pair's
  // communicator, sent while the prefill computes the next chunk; the pair
  // is held for a round, not for the handoff, so handoffs to one decode
  // worker interleave instead of queueing behind a whole prefill.
  absl::StatusOr<std::unique_ptr<KvSendStream>> Open(const KvTransferTarget& target,
                                                     const tandem::v1::KvCompatibility& compat,
                                                     const KvSendPlan& plan,
                                                     absl::Time deadline) override;
  absl::StatusOr<KvSendResult> Send(const KvTransferTarget& target,
                                    const tandem::v1::KvCompatibility& compat,
                                    const engine::KvExport& kv, absl::Time deadline) override;

  // The GPU-resident handoff: pieces in ops' memory_domain() go with
  // WriteDevice, token-major, one ncclSend per piece, no host staging.
  std::string device_memory_domain() const override { return ops_->memory_domain(); }
  // The same as Send for device pieces (token_ids / bytes_per_token as in a
  // KvExport; the pieces concatenated are its payload).
  absl::StatusOr<KvSendResult> SendDevice(
      const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
      const KvSendPlan& plan,
      const std::vector<std::shared_ptr<const engine::KvDeviceBytes>>& pieces, absl::Time deadline);

  const std::string& peer_id() const { return options_.peer_id; }
  int num_connects() const { return num_connects_.load(); }  // communicators made
  bool HasComm(const std::string& address);                  // a live pair to address

 private:
  struct Pair;
  class StreamedSend;
  std::shared_ptr<Pair> PairFor(const std::string& address);
  absl::Status Connect(Pair& pair, const KvTransferTarget& target,
                       const tandem::v1::KvCompatibility& compat, absl::Time deadline);
  void Drop(Pair& pair);
  // One transfer's payload: host bytes (block-packed through the pair's
  // staging buffers) or device pieces (token-major, sent where they are).
  struct Payload {
    KvSendPlan plan;
    const char* host = nullptr;
    std::vector<std::shared_ptr<const engine::KvDeviceBytes>> device;
  };
  absl::StatusOr<KvSendResult> Transfer(const KvTransferTarget& target,
                                        const tandem::v1::KvCompatibility& compat,
                                        const Payload& payload, absl::Time deadline);
  absl::StatusOr<KvSendResult> SendOnce(Pair& pair, const KvTransferTarget& target,
                                        const tandem::v1::KvCompatibility& compat,
                                        const Payload& payload, absl::Time deadline, bool* stale);
  // SendOnce's step 2: the payload over NCCL (begin already accepted):
  // host bytes block-packed (layout, blocks_per_segment), or the device
  // pieces as `segments` (the same list `begin` announced).
  absl::Status SendPayload(Pair& pair, const KvTransferTarget& target, const Payload& payload,
                           const KvBlockLayout& layout, int32_t blocks_per_segment,
                           const std::vector<TokenSegment>& segments, absl::Time deadline);

  const std::shared_ptr<NcclOps> ops_;
  NcclTransportOptions options_;
  std::atomic<int> num_connects_{0};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Pair>> pairs_ ABSL_GUARDED_BY(mu_);
};

// InvalidArgument unless kind is "host" or "nccl".
absl::Status CheckKvTransportKind(const std::string& kind);
// For a worker's --kv-transport (call before loading the model): null for
// "host"; `given` or the CUDA ops (MakeCudaNcclOps(0): Unavailable with a
// clear message without NCCL or a GPU) for "nccl"; InvalidArgument otherwise.
absl::StatusOr<std::shared_ptr<NcclOps>> NcclOpsForTransport(const std::string& kind,
                                                             std::shared_ptr<NcclOps> given);
// "host" -> HostKvTransport; "nccl" -> NcclKvTransport on `ops` (made by
// NcclOpsForTransport when null); channels with `security`.
absl::StatusOr<std::unique_ptr<KvTransport>> MakeKvTransport(
    const std::string& kind, std::shared_ptr<NcclOps> ops,
    const services::ChannelSecurity& security = {});

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_NCCL_KV_TRANSPORT_H_
