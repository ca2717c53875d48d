#include "services/transfer/nccl_kv_transport.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "services/common/grpc_status.h"
#include "services/transfer/host_kv_transport.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/nccl_kv_path.h"

namespace tandem::transfer {
namespace {

std::string RandomPeerId() {
  std::random_device rd;
  return absl::StrFormat("prefill-%d-%08x%08x", getpid(), rd(), rd());
}

// The transport's own failures are Unavailable, except timeouts and the
// Prefill call's cancellation.
absl::Status TransportError(const std::string& address, absl::string_view what,
                            const absl::Status& st) {
  const absl::StatusCode code = absl::IsDeadlineExceeded(st) ? absl::StatusCode::kDeadlineExceeded
                                : absl::IsCancelled(st)      ? absl::StatusCode::kCancelled
                                                             : absl::StatusCode::kUnavailable;
  return absl::Status(
      code, absl::StrCat("NCCL KV transfer to ", address, ": ", what, ": ", st.message()));
}

absl::Status WithPeer(const std::string& address, absl::string_view what, const absl::Status& st) {
  return absl::Status(
      st.code(), absl::StrCat("NCCL KV transfer to ", address, ": ", what, ": ", st.message()));
}

bool ParentCancelled(const KvTransferTarget& target) {
  return target.parent != nullptr && target.parent->IsCancelled();
}

absl::Status CancelledBy(const KvTransferTarget& target) {
  return ParentCancelled(target) ? absl::CancelledError("the Prefill call was cancelled")
                                 : absl::OkStatus();
}

}  // namespace

struct NcclKvTransport::Pair {
  explicit Pair(NcclOps* ops) : staging(ops) {}
  absl::Mutex mu;  // held for a whole transfer: one at a time per pair
  std::shared_ptr<tandem::v1::DecodeWorker::Stub> stub;
  NcclOps::Comm comm = nullptr;
  NcclOps::Stream stream = nullptr;
  uint64_t generation = 0;
  NcclStaging staging;
};

NcclKvTransport::NcclKvTransport(std::shared_ptr<NcclOps> ops, NcclTransportOptions options)
    : ops_(std::move(ops)), options_(std::move(options)) {
  if (options_.peer_id.empty()) options_.peer_id = RandomPeerId();
}

NcclKvTransport::~NcclKvTransport() {
  absl::MutexLock lock(&mu_);
  for (auto& [address, pair] : pairs_) {
    absl::MutexLock plock(&pair->mu);
    Drop(*pair);
  }
}

std::shared_ptr<NcclKvTransport::Pair> NcclKvTransport::PairFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& pair = pairs_[address];
  if (pair == nullptr) {
    pair = std::make_shared<Pair>(ops_.get());
    pair->stub = tandem::v1::DecodeWorker::NewStub(MakeWorkerChannel(address, options_.security));
  }
  return pair;
}

bool NcclKvTransport::HasComm(const std::string& address) {
  std::shared_ptr<Pair> pair;
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(address);
    if (it == pairs_.end()) return false;
    pair = it->second;
  }
  absl::MutexLock lock(&pair->mu);
  return pair->comm != nullptr;
}

void NcclKvTransport::Drop(Pair& pair) {
  if (pair.comm != nullptr) ops_->CommAbort(pair.comm);
  if (pair.stream != nullptr) ops_->StreamDestroy(pair.stream);
  pair.comm = nullptr;
  pair.stream = nullptr;
}

absl::Status NcclKvTransport::Connect(Pair& pair, const KvTransferTarget& target,
                                      const tandem::v1::KvCompatibility& compat,
                                      absl::Time deadline) {
  const std::string& address = target.address;
  Drop(pair);
  absl::StatusOr<NcclUniqueId> id = ops_->GetUniqueId();
  if (!id.ok()) return TransportError(address, "ncclGetUniqueId", id.status());
  const uint64_t generation = ++pair.generation;
  const absl::Time connect_deadline = std::min(deadline, absl::Now() + options_.connect_timeout);

  tandem::v1::NcclConnectRequest request;
  request.set_peer_id(options_.peer_id);
  request.set_comm_generation(generation);
  request.set_unique_id(id->data(), id->size());
  *request.mutable_compat() = compat;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(connect_deadline));
  tandem::v1::NcclConnectResponse response;
  grpc::Status rpc_status;
  std::atomic<bool> rpc_done{false};
  // Both ranks must be inside ncclCommInitRank at the same time: the RPC
  // (whose handler runs the peer's init) on its own thread, ours here.
  std::thread rpc([&] {
    rpc_status = pair.stub->NcclConnect(&context, request, &response);
    rpc_done.store(true);
  });
  // Stop waiting for the peer as soon as its NcclConnect failed, or the
  // Prefill call was cancelled.
  absl::StatusOr<NcclOps::Comm> comm = ops_->CommInitRank(
      *id, 2, kSenderRank, connect_deadline,
      [&] { return (rpc_done.load() && !rpc_status.ok()) || ParentCancelled(target); });
  if (!comm.ok()) context.TryCancel();
  rpc.join();
  // The peer's error, unless it is only our own TryCancel after our init failed.
  if (!rpc_status.ok() && (comm.ok() || rpc_status.error_code() != grpc::StatusCode::CANCELLED)) {
    if (comm.ok()) ops_->CommAbort(*comm);
    return WithPeer(address, "NcclConnect", services::FromGrpcStatus(rpc_status));
  }
  if (!comm.ok()) return TransportError(address, "ncclCommInitRank", comm.status());
  absl::StatusOr<NcclOps::Stream> stream = ops_->StreamCreate();
  if (!stream.ok()) {
    ops_->CommAbort(*comm);
    return TransportError(address, "stream", stream.status());
  }
  pair.comm = *comm;
  pair.stream = *stream;
  ++num_connects_;
  return absl::OkStatus();
}

// One streamed handoff (docs/nccl.md, "Streamed"): `begin` at Open (the
// receiver reserves; nothing is posted), then one round per piece under the
// pair's mutex (segment -> ready -> ncclSend -> received), `sent` at Finish.
// Between rounds the pair is free for other handoffs to the same worker.
class NcclKvTransport::StreamedSend final : public KvSendStream {
 public:
  StreamedSend(NcclKvTransport* transport, const KvTransferTarget& target,
               tandem::v1::KvCompatibility compat, const KvSendPlan& plan, absl::Time deadline)
      : transport_(transport),
        target_(target),
        compat_(std::move(compat)),
        plan_(plan),
        deadline_(deadline),
        start_(absl::Now()) {}
  ~StreamedSend() override { End(); }

  // `begin` -> `ready`, connecting first when the pair has no communicator;
  // a receiver that lost our communicator (ABORTED) makes us reconnect once.
  absl::Status Begin();
  absl::Status Write(std::string_view bytes) override {
    return Round(bytes.data(), static_cast<int64_t>(bytes.size()), /*on_device=*/false);
  }
  absl::Status WriteDevice(std::shared_ptr<const engine::KvDeviceBytes> piece) override {
    if (piece == nullptr || piece->domain() != transport_->device_memory_domain()) {
      return Failed(absl::InvalidArgumentError(absl::StrCat(
          "NCCL KV transfer: a device piece not in ", transport_->device_memory_domain())));
    }
    return Round(static_cast<const char*>(piece->data()), piece->size(), /*on_device=*/true);
  }
  absl::StatusOr<KvSendResult> Finish() override;
  void Cancel() override {
    cancelled_.store(true);
    if (context_ != nullptr) context_->TryCancel();
  }

 private:
  using Stream =
      grpc::ClientReaderWriter<tandem::v1::NcclPushKvRequest, tandem::v1::NcclPushKvResponse>;
  absl::Status Round(const char* data, int64_t bytes, bool on_device);
  // Round's NCCL part, with the pair's mutex held: `segment` -> `ready`,
  // the sends, `received`. *comm_lost: the communicator's state is unknown.
  absl::Status RoundLocked(Pair& pair, const char* data, int64_t bytes, bool on_device,
                           bool* comm_lost);
  // Writes `request` (then WritesDone when asked) and reads the reply: OK
  // when it is `expected`, else the call ended with its status.
  absl::Status Exchange(const tandem::v1::NcclPushKvRequest& request, bool writes_done,
                        tandem::v1::NcclPushKvResponse::PartCase expected, absl::string_view what,
                        tandem::v1::NcclPushKvResponse* response);
  // Ends the call (cancelling it first when `cancel`: the receiver has not
  // ended it) and returns its status as this handoff's error.
  absl::Status EndWithStatus(absl::string_view what, bool cancel);
  absl::Status Failed(absl::Status st) {
    if (status_.ok()) status_ = st;
    End();
    return st;
  }
  void End() {
    if (stream_ == nullptr || ended_) return;
    ended_ = true;
    context_->TryCancel();  // the receiver drops its reservation
    stream_->Finish();
  }
  absl::Status Interrupted() const {
    if (cancelled_.load()) return absl::CancelledError("the KV handoff was cancelled");
    return CancelledBy(target_);
  }

  NcclKvTransport* const transport_;
  const KvTransferTarget target_;
  const tandem::v1::KvCompatibility compat_;
  const KvSendPlan plan_;
  const absl::Time deadline_;
  const absl::Time start_;
  std::shared_ptr<Pair> pair_;
  uint64_t generation_ = 0;  // of the communicator `begin` named
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<Stream> stream_;
  bool ended_ = false;
  absl::Status status_;  // the first failure
  int64_t written_ = 0;
  std::atomic<bool> cancelled_{false};
};

absl::Status NcclKvTransport::StreamedSend::Exchange(
    const tandem::v1::NcclPushKvRequest& request, bool writes_done,
    tandem::v1::NcclPushKvResponse::PartCase expected, absl::string_view what,
    tandem::v1::NcclPushKvResponse* response) {
  bool alive =
      stream_->Write(request) && (!writes_done || stream_->WritesDone()) && stream_->Read(response);
  if (alive && response->part_case() == expected) return absl::OkStatus();
  // A stream the receiver ended carries its status; one that answered
  // something unexpected is ended by us.
  return EndWithStatus(what, /*cancel=*/alive);
}

absl::Status NcclKvTransport::StreamedSend::EndWithStatus(absl::string_view what, bool cancel) {
  ended_ = true;
  if (cancel) context_->TryCancel();
  const grpc::Status st = stream_->Finish();
  if (st.ok() || st.error_code() == grpc::StatusCode::CANCELLED) {
    if (absl::Status c = Interrupted(); !c.ok()) return WithPeer(target_.address, what, c);
  }
  if (st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("NCCL KV transfer to ", target_.address, ": ", what, ": the stream ended"));
  }
  return WithPeer(target_.address, what, services::FromGrpcStatus(st));
}

absl::Status NcclKvTransport::StreamedSend::Begin() {
  pair_ = transport_->PairFor(target_.address);
  for (int attempt = 0;; ++attempt) {
    {
      absl::MutexLock lock(&pair_->mu);
      if (absl::Status c = Interrupted(); !c.ok()) {
        return WithPeer(target_.address, "before the transfer", c);
      }
      if (pair_->comm == nullptr) {
        TANDEM_RETURN_IF_ERROR(transport_->Connect(*pair_, target_, compat_, deadline_));
      }
      generation_ = pair_->generation;
    }
    stream_.reset();  // a call `begin` was refused on, before its context
    context_ = MakeTransferContext(target_, deadline_);
    ended_ = false;
    stream_ = pair_->stub->NcclPushKv(context_.get());
    tandem::v1::NcclPushKvRequest request;
    tandem::v1::NcclPushBegin* begin = request.mutable_begin();
    begin->set_peer_id(transport_->options_.peer_id);
    begin->set_comm_generation(generation_);
    *begin->mutable_header() = HostKvTransport::MakeHeader(target_, compat_, plan_);
    begin->set_streamed(true);
    tandem::v1::NcclPushKvResponse response;
    absl::Status st = Exchange(request, /*writes_done=*/false,
                               tandem::v1::NcclPushKvResponse::kReady, "receiver", &response);
    if (st.ok()) return st;
    // `begin` posts nothing on either side: the communicator stays unless
    // the receiver no longer has it.
    if (absl::IsAborted(st) && attempt == 0) {
      absl::MutexLock lock(&pair_->mu);
      if (pair_->generation == generation_) transport_->Drop(*pair_);
      continue;
    }
    return st;
  }
}

absl::Status NcclKvTransport::StreamedSend::Round(const char* data, int64_t bytes, bool on_device) {
  if (!status_.ok()) return status_;
  if (stream_ == nullptr || ended_) {
    return absl::FailedPreconditionError("NCCL KV transfer: the handoff has ended");
  }
  if (bytes < 1 || bytes % plan_.bytes_per_token != 0) {
    return Failed(absl::InvalidArgumentError("NCCL KV transfer: a piece of partial tokens"));
  }
  if (written_ + bytes > plan_.total_bytes()) {
    return Failed(absl::InvalidArgumentError("NCCL KV transfer: more bytes than declared"));
  }
  Pair& pair = *pair_;
  absl::MutexLock lock(&pair.mu);
  if (absl::Status c = Interrupted(); !c.ok()) {
    return Failed(WithPeer(target_.address, "between segments", c));
  }
  if (pair.comm == nullptr || pair.generation != generation_) {
    return Failed(absl::UnavailableError(
        absl::StrCat("NCCL KV transfer to ", target_.address,
                     ": the communicator was aborted by another transfer's failure")));
  }
  bool comm_lost = false;
  absl::Status st = RoundLocked(pair, data, bytes, on_device, &comm_lost);
  if (comm_lost) transport_->Drop(pair);  // ncclCommAbort; the receiver aborts its side
  if (!st.ok()) return Failed(st);
  written_ += bytes;
  return absl::OkStatus();
}

absl::Status NcclKvTransport::StreamedSend::RoundLocked(Pair& pair, const char* data, int64_t bytes,
                                                        bool on_device, bool* comm_lost) {
  NcclOps& ops = *transport_->ops_;
  const char* src = data;
  if (!on_device) {  // host bytes: through the pair's staging buffers
    if (absl::Status st = pair.staging.Reserve(bytes); !st.ok()) {
      return TransportError(target_.address, "staging", st);
    }
    std::copy_n(data, bytes, pair.staging.host());
    if (absl::Status st =
            ops.CopyToDevice(pair.staging.device(), pair.staging.host(), bytes, pair.stream);
        !st.ok()) {
      *comm_lost = true;
      return TransportError(target_.address, "upload", st);
    }
    src = static_cast<const char*>(pair.staging.device());
  }
  const std::vector<TokenSegment> segments = SplitTokenSegments(
      {{src, bytes}}, plan_.bytes_per_token, transport_->options_.max_segment_bytes);
  tandem::v1::NcclPushKvRequest request;
  for (const TokenSegment& seg : segments) {
    request.mutable_segment()->add_token_segments(seg.tokens);
  }
  tandem::v1::NcclPushKvResponse response;
  if (absl::Status st = Exchange(request, /*writes_done=*/false,
                                 tandem::v1::NcclPushKvResponse::kReady, "receiver", &response);
      !st.ok()) {
    *comm_lost = true;  // whether the receiver posted its receives is unknown
    return st;
  }
  const absl::Time nccl_deadline =
      std::min(deadline_, absl::Now() + transport_->options_.transfer_timeout);
  absl::Status sent = SendTokenSegments(ops, pair.comm, pair.stream, kReceiverRank, segments,
                                        nccl_deadline, [this] { return Interrupted(); });
  if (!sent.ok()) {
    *comm_lost = true;
    End();
    return TransportError(target_.address, "ncclSend", sent);
  }
  if (const bool alive = stream_->Read(&response); !alive || !response.has_received()) {
    *comm_lost = true;  // the receiver aborted its communicator
    return EndWithStatus("receiver", /*cancel=*/alive);
  }
  return absl::OkStatus();
}

absl::StatusOr<KvSendResult> NcclKvTransport::StreamedSend::Finish() {
  if (!status_.ok()) return status_;
  if (stream_ == nullptr || ended_) {
    return absl::FailedPreconditionError("NCCL KV transfer: the handoff has ended");
  }
  if (written_ != plan_.total_bytes()) {
    return Failed(absl::InvalidArgumentError("NCCL KV transfer: fewer bytes than declared"));
  }
  tandem::v1::NcclPushKvRequest request;
  request.mutable_sent();
  tandem::v1::NcclPushKvResponse response;
  if (absl::Status st = Exchange(request, /*writes_done=*/true,
                                 tandem::v1::NcclPushKvResponse::kDone, "receiver", &response);
      !st.ok()) {
    return Failed(st);
  }
  ended_ = true;
  const grpc::Status st = stream_->Finish();
  if (!st.ok()) return WithPeer(target_.address, "receiver", services::FromGrpcStatus(st));
  KvSendResult result;
  result.num_bytes = response.done().bytes_received();
  result.lease_seconds = response.done().lease_seconds();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  if (result.num_bytes != plan_.total_bytes()) {
    return absl::DataLossError(absl::StrCat("NCCL KV transfer to ", target_.address,
                                            ": receiver counted a different size"));
  }
  return result;
}

absl::StatusOr<std::unique_ptr<KvSendStream>> NcclKvTransport::Open(
    const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
    const KvSendPlan& plan, absl::Time deadline) {
  if (plan.token_ids.empty() || plan.bytes_per_token < 1) {
    return absl::InvalidArgumentError("NCCL KV transfer: no tokens or no bytes per token");
  }
  auto stream = std::make_unique<StreamedSend>(this, target, compat, plan, deadline);
  TANDEM_RETURN_IF_ERROR(stream->Begin());
  return std::unique_ptr<KvSendStream>(std::move(stream));
}

absl::StatusOr<KvSendResult> NcclKvTransport::Send(const KvTransferTarget& target,
                                                   const tandem::v1::KvCompatibility& compat,
                                                   const engine::KvExport& kv,
                                                   absl::Time deadline) {
  if (kv.device != nullptr) {
    return SendDevice(target, compat, KvSendPlan{kv.token_ids, kv.bytes_per_token}, {kv.device},
                      deadline);
  }
  Payload payload;
  payload.plan = KvSendPlan{kv.token_ids, kv.bytes_per_token};
  if (static_cast<int64_t>(kv.bytes.size()) != payload.plan.total_bytes()) {
    return absl::InvalidArgumentError(
        "NCCL KV transfer: KV export size != tokens x bytes_per_token");
  }
  payload.host = kv.bytes.data();
  return Transfer(target, compat, payload, deadline);
}

absl::StatusOr<KvSendResult> NcclKvTransport::SendDevice(
    const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
    const KvSendPlan& plan, const std::vector<std::shared_ptr<const engine::KvDeviceBytes>>& pieces,
    absl::Time deadline) {
  Payload payload;
  payload.plan = plan;
  payload.device = pieces;
  int64_t bytes = 0;
  for (const auto& p : pieces) {
    if (p == nullptr || p->domain() != ops_->memory_domain()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL KV transfer: a device piece not in ", ops_->memory_domain()));
    }
    bytes += p->size();
  }
  if (bytes != plan.total_bytes() || plan.bytes_per_token < 1 || bytes % plan.bytes_per_token) {
    return absl::InvalidArgumentError(
        "NCCL KV transfer: device pieces' size != tokens x bytes_per_token");
  }
  return Transfer(target, compat, payload, deadline);
}

absl::StatusOr<KvSendResult> NcclKvTransport::Transfer(const KvTransferTarget& target,
                                                       const tandem::v1::KvCompatibility& compat,
                                                       const Payload& payload,
                                                       absl::Time deadline) {
  const absl::Time start = absl::Now();
  std::shared_ptr<Pair> pair = PairFor(target.address);
  absl::MutexLock lock(&pair->mu);
  for (int attempt = 0;; ++attempt) {
    // Cancelled while it waited behind another transfer on this pair.
    if (absl::Status c = CancelledBy(target); !c.ok()) {
      return WithPeer(target.address, "before the transfer", c);
    }
    if (pair->comm == nullptr) {
      TANDEM_RETURN_IF_ERROR(Connect(*pair, target, compat, deadline));
    }
    bool stale = false;
    absl::StatusOr<KvSendResult> result =
        SendOnce(*pair, target, compat, payload, deadline, &stale);
    if (stale && attempt == 0) {
      Drop(*pair);
      continue;
    }
    if (result.ok()) result->seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return result;
  }
}

absl::Status NcclKvTransport::SendPayload(Pair& pair, const KvTransferTarget& target,
                                          const Payload& payload, const KvBlockLayout& layout,
                                          int32_t blocks_per_segment,
                                          const std::vector<TokenSegment>& segments,
                                          absl::Time deadline) {
  const absl::Time nccl_deadline = std::min(deadline, absl::Now() + options_.transfer_timeout);
  const NcclInterrupt interrupt = [&] { return CancelledBy(target); };
  if (payload.device.empty()) {
    return SendKvBlocks(*ops_, pair.comm, pair.stream, kReceiverRank, layout, blocks_per_segment,
                        payload.host, pair.staging, nccl_deadline, interrupt);
  }
  return SendTokenSegments(*ops_, pair.comm, pair.stream, kReceiverRank, segments, nccl_deadline,
                           interrupt);
}

absl::StatusOr<KvSendResult> NcclKvTransport::SendOnce(Pair& pair, const KvTransferTarget& target,
                                                       const tandem::v1::KvCompatibility& compat,
                                                       const Payload& payload, absl::Time deadline,
                                                       bool* stale) {
  const std::string& address = target.address;
  const KvSendPlan& plan = payload.plan;
  absl::StatusOr<KvBlockLayout> layout = MakeKvBlockLayout(
      plan.token_ids.size(), plan.bytes_per_token, compat.block_size(), compat.num_layers());
  if (!layout.ok()) return WithPeer(address, "KV export", layout.status());

  const std::unique_ptr<grpc::ClientContext> owned = MakeTransferContext(target, deadline);
  grpc::ClientContext& context = *owned;
  std::unique_ptr<
      grpc::ClientReaderWriter<tandem::v1::NcclPushKvRequest, tandem::v1::NcclPushKvResponse>>
      stream = pair.stub->NcclPushKv(&context);
  tandem::v1::NcclPushKvRequest request;
  tandem::v1::NcclPushBegin* begin = request.mutable_begin();
  begin->set_peer_id(options_.peer_id);
  begin->set_comm_generation(pair.generation);
  *begin->mutable_header() = HostKvTransport::MakeHeader(target, compat, plan);
  std::vector<TokenSegment> segments;  // the device pieces' sends
  if (payload.device.empty()) {
    begin->set_blocks_per_segment(BlocksPerSegment(*layout, options_.max_segment_bytes));
  } else {
    std::vector<std::pair<const char*, int64_t>> pieces;
    for (const auto& p : payload.device) {
      pieces.emplace_back(static_cast<const char*>(p->data()), p->size());
    }
    segments = SplitTokenSegments(pieces, plan.bytes_per_token, options_.max_segment_bytes);
    for (const TokenSegment& seg : segments) begin->add_token_segments(seg.tokens);
  }
  tandem::v1::NcclPushKvResponse response;
  // 1. The receiver accepts the header (or rejects it: then nothing was posted).
  const bool read = stream->Write(request) && stream->Read(&response);
  if (!read || !response.has_ready()) {
    if (read) context.TryCancel();  // a message other than `ready`: end the stream
    const grpc::Status st = stream->Finish();
    if (st.error_code() == grpc::StatusCode::ABORTED) *stale = true;
    // A timeout or a broken stream leaves it unknown whether the receiver
    // posted its receive; a fresh communicator is the safe state.
    if (st.ok() || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        st.error_code() == grpc::StatusCode::CANCELLED) {
      Drop(pair);
    }
    if (st.ok())
      return absl::UnavailableError(absl::StrCat(
          "NCCL KV transfer to ", address, ": the receiver ended the stream without accepting"));
    return WithPeer(address, "receiver", services::FromGrpcStatus(st));
  }
  // 2. Payload.
  absl::Status sent = SendPayload(pair, target, payload, *layout,
                                  request.begin().blocks_per_segment(), segments, deadline);
  if (!sent.ok()) {
    Drop(pair);           // ncclCommAbort here ...
    context.TryCancel();  // ... and the receiver aborts its side and the reservation
    stream->Finish();
    return TransportError(address, "ncclSend", sent);
  }
  // 3. The receiver's result.
  request.mutable_sent();
  const bool wrote = stream->Write(request) && stream->WritesDone();
  const bool got = wrote && stream->Read(&response) && response.has_done();
  const grpc::Status st = stream->Finish();
  if (!st.ok() || !got) {
    Drop(pair);  // the receiver aborted its communicator
    if (!st.ok()) return WithPeer(address, "receiver", services::FromGrpcStatus(st));
    return absl::UnavailableError(
        absl::StrCat("NCCL KV transfer to ", address, ": no result from the receiver"));
  }
  KvSendResult result;
  result.num_bytes = response.done().bytes_received();
  result.lease_seconds = response.done().lease_seconds();
  if (result.num_bytes != plan.total_bytes()) {
    return absl::DataLossError(
        absl::StrCat("NCCL KV transfer to ", address, ": receiver counted a different size"));
  }
  return result;
}

absl::Status CheckKvTransportKind(const std::string& kind) {
  if (kind == "host" || kind == "nccl") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--kv-transport: '", kind, "' is not one of host, nccl"));
}

absl::StatusOr<std::shared_ptr<NcclOps>> NcclOpsForTransport(const std::string& kind,
                                                             std::shared_ptr<NcclOps> given) {
  TANDEM_RETURN_IF_ERROR(CheckKvTransportKind(kind));
  if (kind == "host") return std::shared_ptr<NcclOps>();
  if (given != nullptr) return given;
  return MakeCudaNcclOps(0);
}

absl::StatusOr<std::unique_ptr<KvTransport>> MakeKvTransport(
    const std::string& kind, std::shared_ptr<NcclOps> ops,
    const services::ChannelSecurity& security) {
  TANDEM_ASSIGN_OR_RETURN(ops, NcclOpsForTransport(kind, std::move(ops)));
  if (kind == "host") {
    return std::unique_ptr<KvTransport>(
        std::make_unique<HostKvTransport>(kMaxChunkBytes, security));
  }
  NcclTransportOptions options;
  options.security = security;
  return std::unique_ptr<KvTransport>(
      std::make_unique<NcclKvTransport>(std::move(ops), std::move(options)));
}

}  // namespace tandem::transfer
