#include "services/transfer/nccl_receiver.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/background_free.h"
#include "common/status.h"
#include "services/common/compat.h"
#include "services/common/grpc_status.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/nccl_kv_path.h"

namespace tandem::transfer {
namespace {

absl::Time RpcDeadline(grpc::ServerContext* context, absl::Duration cap) {
  const absl::Time capped = absl::Now() + cap;
  if (context->deadline() == std::chrono::system_clock::time_point::max()) return capped;
  return std::min(capped, absl::FromChrono(context->deadline()));
}

grpc::Status Error(grpc::StatusCode code, absl::string_view message) {
  return grpc::Status(code, std::string(message));
}

grpc::Status InFlightError() {
  return Error(grpc::StatusCode::ABORTED,
               "NcclPushKv: a transfer is already in flight on this communicator");
}

grpc::Status AbortedCommError() {
  return Error(grpc::StatusCode::ABORTED, "NcclPushKv: the communicator was aborted");
}

// The status of a failed streamed round, as the RPC's.
grpc::StatusCode RoundErrorCode(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kAborted:
      return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    default:
      return grpc::StatusCode::UNAVAILABLE;
  }
}

}  // namespace

struct NcclKvReceiver::Pair {
  Pair(NcclOps* o, uint64_t gen, NcclOps::Comm c, NcclOps::Stream s)
      : ops(o), generation(gen), comm(c), stream(s), staging(o) {}
  ~Pair() {
    // Before the staging buffers are freed (members go after this body).
    if (comm != nullptr) ops->CommAbort(comm);
    if (stream != nullptr) ops->StreamDestroy(stream);
  }
  NcclOps* const ops;
  const uint64_t generation;
  absl::Mutex mu;      // held by the transfer in flight
  NcclOps::Comm comm;  // null once aborted
  NcclOps::Stream stream;
  std::atomic<bool> superseded{false};  // a newer NcclConnect of the same peer
  NcclStaging staging;
};

NcclKvReceiver::NcclKvReceiver(std::shared_ptr<NcclOps> ops, NcclReceiverConfig config,
                               KvLeaseTable* leases)
    : ops_(std::move(ops)), config_(std::move(config)), leases_(leases) {}

NcclKvReceiver::~NcclKvReceiver() {
  absl::MutexLock lock(&mu_);
  pairs_.clear();  // each Pair aborts its communicator
}

int NcclKvReceiver::num_peers() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pairs_.size());
}

namespace {

// Adopts a mutex the caller already holds (after a successful TryLock) and
// releases it at the end of the scope; clang's -Wthread-safety follows it.
class ABSL_SCOPED_LOCKABLE HeldLock {
 public:
  explicit HeldLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) : mu_(mu) {}
  ~HeldLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  HeldLock(const HeldLock&) = delete;
  HeldLock& operator=(const HeldLock&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace

void NcclKvReceiver::Fail(const std::string& peer_id, const std::shared_ptr<Pair>& pair) {
  // REQUIRES: pair->mu held by the caller.
  if (pair->comm != nullptr) {
    ops_->CommAbort(pair->comm);
    ++num_aborts_;
  }
  if (pair->stream != nullptr) ops_->StreamDestroy(pair->stream);
  pair->comm = nullptr;
  pair->stream = nullptr;
  absl::MutexLock lock(&mu_);
  auto it = pairs_.find(peer_id);
  if (it != pairs_.end() && it->second == pair) pairs_.erase(it);
}

grpc::Status NcclKvReceiver::Connect(grpc::ServerContext* context,
                                     const tandem::v1::NcclConnectRequest* request,
                                     tandem::v1::NcclConnectResponse* response) {
  const std::string& peer = request->peer_id();
  if (peer.empty() || peer.size() > 256) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT, "NcclConnect: peer_id must be 1-256 bytes");
  }
  if (request->unique_id().size() != kNcclUniqueIdBytes) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("NcclConnect: unique_id has ", request->unique_id().size(),
                              " bytes, not ", kNcclUniqueIdBytes));
  }
  if (absl::Status st = services::CheckCompat(config_.compat, request->compat()); !st.ok()) {
    return services::ToGrpcStatus(st);
  }
  if (config_.draining && config_.draining()) {
    return Error(grpc::StatusCode::UNAVAILABLE, "draining");
  }
  {
    absl::MutexLock lock(&mu_);
    if (!pairs_.contains(peer) && static_cast<int>(pairs_.size()) >= config_.max_peers) {
      return Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                   absl::StrCat("NcclConnect: already ", pairs_.size(), " NCCL peers"));
    }
  }
  NcclUniqueId id;
  std::copy(request->unique_id().begin(), request->unique_id().end(), id.begin());
  // This handler's thread runs our rank's init while the sender runs its own.
  absl::StatusOr<NcclOps::Comm> comm =
      ops_->CommInitRank(id, 2, kReceiverRank, RpcDeadline(context, config_.connect_timeout),
                         [context] { return context->IsCancelled(); });
  if (!comm.ok()) {
    return services::ToGrpcStatus(
        absl::Status(absl::IsDeadlineExceeded(comm.status()) ? absl::StatusCode::kDeadlineExceeded
                                                             : absl::StatusCode::kUnavailable,
                     absl::StrCat("NcclConnect: ncclCommInitRank: ", comm.status().message())));
  }
  absl::StatusOr<NcclOps::Stream> stream = ops_->StreamCreate();
  if (!stream.ok()) {
    ops_->CommAbort(*comm);
    return services::ToGrpcStatus(
        absl::UnavailableError(absl::StrCat("NcclConnect: stream: ", stream.status().message())));
  }
  auto pair = std::make_shared<Pair>(ops_.get(), request->comm_generation(), *comm, *stream);
  std::shared_ptr<Pair> old;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = pairs_[peer];
    old = std::move(slot);
    slot = pair;
  }
  // The old communicator is aborted when its last user lets go (a transfer
  // in flight on it sees `superseded` and fails).
  if (old != nullptr) old->superseded.store(true);
  return grpc::Status::OK;
}

absl::StatusOr<NcclKvReceiver::RecvPlan> NcclKvReceiver::CheckPushBegin(
    const tandem::v1::NcclPushBegin& begin) const {
  const tandem::v1::KvTransferHeader& header = begin.header();
  absl::Status st = ValidateKvHeader(header, config_.compat, config_.bytes_per_token,
                                     config_.max_tokens, config_.vocab_size);
  if (!st.ok()) return st;
  if (config_.draining && config_.draining()) {
    return absl::UnavailableError("draining");
  }
  RecvPlan plan;
  TANDEM_ASSIGN_OR_RETURN(
      plan.layout, MakeKvBlockLayout(header.num_tokens(), header.bytes_per_token(),
                                     config_.compat.block_size(), config_.compat.num_layers()));
  if (begin.streamed()) {
    if (begin.blocks_per_segment() != 0 || !begin.token_segments().empty()) {
      return absl::InvalidArgumentError(
          "a streamed push has blocks_per_segment 0 and no token_segments in `begin`");
    }
    return plan;
  }
  if (begin.token_segments().empty()) {
    TANDEM_RETURN_IF_ERROR(CheckBlocksPerSegment(plan.layout, begin.blocks_per_segment()));
    return plan;
  }
  if (begin.blocks_per_segment() != 0) {
    return absl::InvalidArgumentError("blocks_per_segment must be 0 with token_segments");
  }
  TANDEM_ASSIGN_OR_RETURN(
      plan.token_segments,
      CheckTokenSegments(begin.token_segments(), header.num_tokens(), header.bytes_per_token()));
  return plan;
}

absl::StatusOr<std::shared_ptr<engine::KvDeviceBytes>> NcclKvReceiver::KeptDeviceBytes(
    int64_t bytes) {
  // Memory the decode executor reads: the lease holds it.
  TANDEM_ASSIGN_OR_RETURN(void* mem, ops_->DeviceAlloc(bytes));
  // Freed off the thread that drops it (the decode engine's, after the
  // import): cudaFree synchronizes the device, NCCL receives included.
  std::shared_ptr<NcclOps> ops = ops_;
  return std::make_shared<engine::KvDeviceBytes>(mem, bytes, ops_->memory_domain(), [ops](void* p) {
    FreeInBackground([ops, p] { ops->DeviceFree(p); });
  });
}

absl::Status NcclKvReceiver::PostReceives(const tandem::v1::NcclPushBegin& begin,
                                          const RecvPlan& plan, Pair& pair, absl::Time deadline,
                                          std::shared_ptr<engine::KvDeviceBytes>* device) {
  if (plan.token_segments.empty()) {
    return PostRecvKvBlocks(*ops_, pair.comm, pair.stream, kSenderRank, plan.layout,
                            begin.blocks_per_segment(), pair.staging, deadline);
  }
  const int64_t bytes = plan.layout.payload_bytes();
  char* base = nullptr;
  if (config_.kv_memory_domain == ops_->memory_domain()) {
    TANDEM_ASSIGN_OR_RETURN(*device, KeptDeviceBytes(bytes));
    base = static_cast<char*>((*device)->data());
  } else {
    TANDEM_RETURN_IF_ERROR(pair.staging.Reserve(bytes));
    base = static_cast<char*>(pair.staging.device());
  }
  return PostRecvTokenSegments(*ops_, pair.comm, pair.stream, kSenderRank, base,
                               plan.token_segments, deadline);
}

absl::Status NcclKvReceiver::TakePayload(const RecvPlan& plan, Pair& pair, absl::Time deadline,
                                         std::shared_ptr<engine::KvDeviceBytes> device,
                                         engine::KvExport* kv) {
  const int64_t bytes = plan.layout.payload_bytes();  // == total_bytes (validated)
  if (device != nullptr) {
    kv->device = std::move(device);
    return absl::OkStatus();
  }
  kv->bytes.resize(static_cast<size_t>(bytes));
  if (plan.token_segments.empty()) {  // downloaded with the receives
    UnpackKvBlocks(plan.layout, pair.staging.host(), kv->bytes.data());
    return absl::OkStatus();
  }
  // Token-major in the staging buffer: download as it is.
  TANDEM_RETURN_IF_ERROR(
      ops_->CopyToHost(pair.staging.host(), pair.staging.device(), bytes, pair.stream));
  TANDEM_RETURN_IF_ERROR(ops_->WaitStream(pair.comm, pair.stream, deadline));
  std::copy_n(pair.staging.host(), bytes, kv->bytes.data());
  return absl::OkStatus();
}

grpc::Status NcclKvReceiver::ReceiveLocked(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<tandem::v1::NcclPushKvResponse, tandem::v1::NcclPushKvRequest>* stream,
    const tandem::v1::NcclPushBegin& begin, const RecvPlan& plan, const std::string& peer,
    const std::shared_ptr<Pair>& pair, tandem::v1::NcclPushKvResponse* done) {
  const tandem::v1::KvTransferHeader& header = begin.header();
  tandem::v1::NcclPushKvRequest msg;
  const std::string& handle = header.kv_handle();
  absl::Status st = leases_->Reserve(handle, header.total_bytes(), config_.free_bytes());
  if (!st.ok()) return services::ToGrpcStatus(st, context);

  const absl::Time start = absl::Now();
  const absl::Time deadline = RpcDeadline(context, config_.transfer_timeout);
  // From here on every failure releases both sides: our communicator is
  // aborted (the sender reconnects) and the reservation dropped.
  auto fail = [&](grpc::StatusCode code, absl::string_view what) {
    Fail(peer, pair);
    leases_->Abort(handle);
    return Error(code, absl::StrCat("NcclPushKv from '", peer, "': ", what));
  };
  // Declared before `fail`'s aborts can return: freed only after them.
  std::shared_ptr<engine::KvDeviceBytes> device;
  st = PostReceives(begin, plan, *pair, deadline, &device);
  if (!st.ok()) {
    return fail(absl::IsResourceExhausted(st) ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                              : grpc::StatusCode::UNAVAILABLE,
                absl::StrCat("posting ncclRecv: ", st.message()));
  }
  tandem::v1::NcclPushKvResponse reply;
  reply.mutable_ready();
  if (!stream->Write(reply)) return fail(grpc::StatusCode::CANCELLED, "the sender went away");
  // Wait for the payload in slices: the sender may cancel, a newer connect
  // may replace this communicator.
  st = WaitStreamInterruptible(*ops_, pair->comm, pair->stream, deadline, [&] {
    if (context->IsCancelled()) return absl::CancelledError("the sender cancelled");
    if (pair->superseded.load()) return absl::AbortedError("the communicator was replaced");
    return absl::OkStatus();
  });
  if (absl::IsDeadlineExceeded(st)) {
    return fail(grpc::StatusCode::DEADLINE_EXCEEDED, "timed out waiting for the payload");
  }
  if (absl::IsCancelled(st)) return fail(grpc::StatusCode::CANCELLED, st.message());
  if (absl::IsAborted(st)) return fail(grpc::StatusCode::ABORTED, st.message());
  if (!st.ok()) {
    return fail(grpc::StatusCode::UNAVAILABLE, absl::StrCat("ncclRecv: ", st.message()));
  }
  if (!stream->Read(&msg) || !msg.has_sent()) {
    return fail(grpc::StatusCode::CANCELLED, "the sender did not confirm the send");
  }
  auto kv = std::make_shared<engine::KvExport>();
  st = TakePayload(plan, *pair, deadline, std::move(device), kv.get());
  if (!st.ok()) {
    return fail(grpc::StatusCode::UNAVAILABLE, absl::StrCat("download: ", st.message()));
  }
  Commit(header, std::move(kv), start, done);
  return grpc::Status::OK;
}

void NcclKvReceiver::Commit(const tandem::v1::KvTransferHeader& header,
                            std::shared_ptr<engine::KvExport> kv, absl::Time start,
                            tandem::v1::NcclPushKvResponse* done) {
  kv->token_ids.assign(header.token_ids().begin(), header.token_ids().end());
  kv->num_layers = config_.compat.num_layers();
  kv->num_kv_heads = config_.compat.num_kv_heads();
  kv->head_dim = config_.compat.head_dim();
  kv->bytes_per_token = header.bytes_per_token();
  const int64_t received = kv->payload_bytes();
  leases_->Commit(header.kv_handle(), std::move(kv));
  if (config_.on_received) {
    config_.on_received(received, absl::ToDoubleSeconds(absl::Now() - start));
  }
  done->mutable_done()->set_bytes_received(received);
  done->mutable_done()->set_lease_seconds(absl::ToDoubleSeconds(leases_->lease()));
}

grpc::Status NcclKvReceiver::PushKv(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<tandem::v1::NcclPushKvResponse, tandem::v1::NcclPushKvRequest>*
        stream) {
  tandem::v1::NcclPushKvRequest msg;
  if (!stream->Read(&msg) || !msg.has_begin()) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 "NcclPushKv: the first message must be `begin`");
  }
  const tandem::v1::NcclPushBegin begin = msg.begin();  // a copy: msg is read again below
  // Everything up to the reservation is checked before any NCCL operation
  // is posted.
  absl::StatusOr<RecvPlan> plan = CheckPushBegin(begin);
  if (!plan.ok()) return services::ToGrpcStatus(plan.status());
  const std::string peer = begin.peer_id();
  std::shared_ptr<Pair> pair;
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(peer);
    if (it != pairs_.end()) pair = it->second;
  }
  if (pair == nullptr || pair->generation != begin.comm_generation()) {
    return Error(grpc::StatusCode::ABORTED,
                 absl::StrCat("NcclPushKv: no NCCL communicator for peer '", peer, "' generation ",
                              begin.comm_generation(), " (connect again)"));
  }
  if (begin.streamed()) return ReceiveStreamed(context, stream, begin, peer, pair);
  tandem::v1::NcclPushKvResponse done;
  {
    if (!pair->mu.TryLock()) return InFlightError();
    HeldLock unlock(&pair->mu);  // releases the TryLock
    if (pair->comm == nullptr || pair->superseded.load()) return AbortedCommError();
    grpc::Status st = ReceiveLocked(context, stream, begin, *plan, peer, pair, &done);
    if (!st.ok()) return st;
  }
  // After the communicator is free again: the sender may start its next
  // transfer on it as soon as it reads this.
  stream->Write(done);
  return grpc::Status::OK;
}

absl::Status NcclKvReceiver::ReceiveRound(grpc::ServerContext* context, Stream* stream,
                                          const std::vector<TokenSegment>& segments, Pair& pair,
                                          char* dst_device, char* dst_host) {
  // REQUIRES: pair.mu held; on an error the caller aborts the communicator.
  const int64_t bytes = SegmentTokens(segments) * config_.bytes_per_token;
  const absl::Time deadline = RpcDeadline(context, config_.transfer_timeout);
  char* base = dst_device;
  if (base == nullptr) {  // host bytes: through the staging buffers
    TANDEM_RETURN_IF_ERROR(pair.staging.Reserve(bytes));
    base = static_cast<char*>(pair.staging.device());
  }
  TANDEM_RETURN_IF_ERROR(
      PostRecvTokenSegments(*ops_, pair.comm, pair.stream, kSenderRank, base, segments, deadline));
  if (dst_device == nullptr) {
    TANDEM_RETURN_IF_ERROR(
        ops_->CopyToHost(pair.staging.host(), pair.staging.device(), bytes, pair.stream));
  }
  tandem::v1::NcclPushKvResponse reply;
  reply.mutable_ready();
  if (!stream->Write(reply)) return absl::CancelledError("the sender went away");
  TANDEM_RETURN_IF_ERROR(WaitStreamInterruptible(*ops_, pair.comm, pair.stream, deadline, [&] {
    if (context->IsCancelled()) return absl::CancelledError("the sender cancelled");
    if (pair.superseded.load()) return absl::AbortedError("the communicator was replaced");
    return absl::OkStatus();
  }));
  if (dst_device == nullptr) std::copy_n(pair.staging.host(), bytes, dst_host);
  return absl::OkStatus();
}

grpc::Status NcclKvReceiver::ReceiveStreamed(grpc::ServerContext* context, Stream* stream,
                                             const tandem::v1::NcclPushBegin& begin,
                                             const std::string& peer,
                                             const std::shared_ptr<Pair>& pair) {
  const tandem::v1::KvTransferHeader& header = begin.header();
  const std::string& handle = header.kv_handle();
  absl::Status st = leases_->Reserve(handle, header.total_bytes(), config_.free_bytes());
  if (!st.ok()) return services::ToGrpcStatus(st, context);
  const absl::Time start = absl::Now();
  // Between rounds no NCCL operation is in flight: a failure there drops
  // the reservation only; inside a round it also aborts the communicator.
  auto fail = [&](grpc::StatusCode code, absl::string_view what) {
    leases_->Abort(handle);
    return Error(code, absl::StrCat("NcclPushKv from '", peer, "': ", what));
  };
  auto kv = std::make_shared<engine::KvExport>();
  const int64_t total = header.total_bytes();  // validated: num_tokens * bytes_per_token
  if (config_.kv_memory_domain == ops_->memory_domain()) {
    absl::StatusOr<std::shared_ptr<engine::KvDeviceBytes>> mem = KeptDeviceBytes(total);
    if (!mem.ok()) return fail(grpc::StatusCode::RESOURCE_EXHAUSTED, mem.status().message());
    kv->device = *std::move(mem);
  } else {
    kv->bytes.resize(static_cast<size_t>(total));
  }
  tandem::v1::NcclPushKvResponse reply;
  reply.mutable_ready();
  if (!stream->Write(reply)) return fail(grpc::StatusCode::CANCELLED, "the sender went away");
  int64_t tokens = 0;
  tandem::v1::NcclPushKvRequest msg;
  while (true) {
    if (!stream->Read(&msg)) return fail(grpc::StatusCode::CANCELLED, "the sender went away");
    if (msg.has_sent()) break;
    if (!msg.has_segment()) {
      return fail(grpc::StatusCode::INVALID_ARGUMENT, "expected `segment` or `sent`");
    }
    absl::StatusOr<std::vector<TokenSegment>> segments = CheckTokenSegmentsWithin(
        msg.segment().token_segments(), header.num_tokens() - tokens, header.bytes_per_token());
    if (!segments.ok()) {
      return fail(grpc::StatusCode::INVALID_ARGUMENT, segments.status().message());
    }
    const int64_t offset = tokens * header.bytes_per_token();
    char* dst_device = nullptr;
    char* dst_host = nullptr;
    if (kv->device != nullptr) {
      dst_device = static_cast<char*>(kv->device->data()) + offset;
    } else {
      dst_host = kv->bytes.data() + offset;
    }
    {
      if (!pair->mu.TryLock()) {
        return fail(grpc::StatusCode::ABORTED, InFlightError().error_message());
      }
      HeldLock unlock(&pair->mu);
      if (pair->comm == nullptr || pair->superseded.load()) {
        return fail(grpc::StatusCode::ABORTED, AbortedCommError().error_message());
      }
      st = ReceiveRound(context, stream, *segments, *pair, dst_device, dst_host);
      if (!st.ok()) {
        Fail(peer, pair);
        return fail(RoundErrorCode(st),
                    absl::StrCat("segment at token ", tokens, ": ", st.message()));
      }
    }
    tokens += SegmentTokens(*segments);
    reply.mutable_received();
    if (!stream->Write(reply)) return fail(grpc::StatusCode::CANCELLED, "the sender went away");
  }
  if (tokens != header.num_tokens()) {
    return fail(grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("`sent` after ", tokens, " of ", header.num_tokens(), " tokens"));
  }
  Commit(header, std::move(kv), start, &reply);
  stream->Write(reply);
  return grpc::Status::OK;
}

}  // namespace tandem::transfer
