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
// A handoff is streamed: Open declares the tokens (the receiver reserves the
// whole size), then KvSendStream::Write sends the payload piece by piece as
// the prefill computes it, and Finish waits for the receiver's acceptance.
//
// Thread safety: Open / Send may be called from many threads at once.
#ifndef TANDEM_SERVICES_TRANSFER_KV_TRANSPORT_H_
#define TANDEM_SERVICES_TRANSFER_KV_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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
  const grpc::ServerContextBase* parent = nullptr;
};

struct KvSendResult {
  int64_t num_bytes = 0;
  double seconds = 0;
  double lease_seconds = 0;  // how long the receiver holds it unclaimed
};

// What a handoff declares before its first byte: the receiver checks it and
// reserves the whole size at once.
struct KvSendPlan {
  std::vector<int32_t> token_ids;  // the tokens whose K/V follow, in order
  int64_t bytes_per_token = 0;     // engine/kv_export.h layout
  int64_t total_bytes() const { return static_cast<int64_t>(token_ids.size()) * bytes_per_token; }
};

// One handoff in flight: the payload goes out in pieces as the prefill
// computes it (Write, in order), then Finish waits for the receiver's
// acceptance. Destroying it without Finish (or after a failed Write) cancels
// the handoff: the receiver drops its partial copy and its reservation.
// Not thread-safe: one thread drives it.
class KvSendStream {
 public:
  virtual ~KvSendStream() = default;
  // The next piece of the payload. May block while the wire is behind (gRPC
  // flow control bounds the bytes in flight). An error ends the handoff
  // (e.g. the receiver refused the header, or the peer went away).
  virtual absl::Status Write(std::string_view bytes) = 0;
  // The next piece in device memory (engine::KvChunkEvent::device), for a
  // transport whose device_memory_domain() is the piece's: sent from there
  // (kept alive until sent). A handoff is all host pieces or all device ones.
  virtual absl::Status WriteDevice(std::shared_ptr<const engine::KvDeviceBytes> /*piece*/) {
    return absl::UnimplementedError("this KV transport takes host bytes only");
  }
  // REQUIRES: plan.total_bytes() written. Returns when the receiver holds
  // all of it under its lease.
  virtual absl::StatusOr<KvSendResult> Finish() = 0;
  // From any thread: ends the handoff now (a Write or Finish blocked in
  // another thread returns an error); the receiver drops what it got.
  virtual void Cancel() {}
};

// One handoff in flight without a thread waiting on it (the host transport's
// PushKv on gRPC's callback API): Write queues a piece and returns at once,
// Close says every piece was written, and the transport calls `on_done`
// exactly once, from one of its own threads and never from inside Write /
// Close / Cancel, when the handoff has ended (accepted, failed or
// cancelled). Write and Close after the end are ignored. Thread-safe.
class KvAsyncSendStream {
 public:
  using DoneCallback = std::function<void(absl::StatusOr<KvSendResult>)>;
  virtual ~KvAsyncSendStream() = default;
  virtual void Write(std::string bytes) = 0;
  virtual void Close() = 0;
  // Ends the handoff now; the receiver drops what it got. Idempotent.
  virtual void Cancel() = 0;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Starts a handoff of `plan` (described by `compat`) to target. Errors
  // are the receiver's (FailedPrecondition for a compat mismatch,
  // InvalidArgument for sizes, ResourceExhausted when it has no room) or the
  // transport's (Unavailable, DeadlineExceeded), here or from the stream.
  virtual absl::StatusOr<std::unique_ptr<KvSendStream>> Open(
      const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
      const KvSendPlan& plan, absl::Time deadline) = 0;
  // The same handoff without a waiting thread, when the transport has one;
  // null when it has not (NCCL: its operations block), and the caller drives
  // Open's stream from a thread of its own.
  virtual std::shared_ptr<KvAsyncSendStream> OpenAsync(
      const KvTransferTarget& /*target*/, const tandem::v1::KvCompatibility& /*compat*/,
      const KvSendPlan& /*plan*/, absl::Time /*deadline*/,
      KvAsyncSendStream::DoneCallback /*on_done*/) {
    return nullptr;
  }
  // The memory domain (engine::Executor::kv_memory_domain()) whose pieces
  // KvSendStream::WriteDevice takes; empty: host bytes only (the host
  // transport). A prefill worker whose executor is in this domain exports
  // its chunks there (EngineRequest::kv_export_on_device).
  virtual std::string device_memory_domain() const { return ""; }
  // The whole of `kv` in one piece (Open, Write, Finish); returns when the
  // receiver has accepted all of it.
  virtual absl::StatusOr<KvSendResult> Send(const KvTransferTarget& target,
                                            const tandem::v1::KvCompatibility& compat,
                                            const engine::KvExport& kv, absl::Time deadline);
};

}  // namespace tandem::transfer

#endif  // TANDEM_SERVICES_TRANSFER_KV_TRANSPORT_H_
