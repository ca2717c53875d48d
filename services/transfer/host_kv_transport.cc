#include "services/transfer/host_kv_transport.h"

#include <algorithm>
#include <deque>

#include "common/status.h"
#include "grpcpp/alarm.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/common/fault_injection.h"
#include "services/common/grpc_status.h"

namespace tandem::transfer {

std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const services::ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  return services::CreateChannel(address, security, args);
}

std::unique_ptr<grpc::ClientContext> MakeTransferContext(const KvTransferTarget& target,
                                                         absl::Time deadline) {
  std::unique_ptr<grpc::ClientContext> context =
      target.parent != nullptr ? grpc::ClientContext::FromServerContext(*target.parent)
                               : std::make_unique<grpc::ClientContext>();
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
  return context;
}

std::shared_ptr<tandem::v1::DecodeWorker::Stub> HostKvTransport::StubFor(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = tandem::v1::DecodeWorker::NewStub(MakeWorkerChannel(address, security_));
  }
  return stub;
}

tandem::v1::KvTransferHeader HostKvTransport::MakeHeader(const KvTransferTarget& target,
                                                         const tandem::v1::KvCompatibility& compat,
                                                         const KvSendPlan& plan) {
  tandem::v1::KvTransferHeader h;
  h.set_kv_handle(target.kv_handle);
  h.set_request_id(target.request_id);
  *h.mutable_compat() = compat;
  h.set_num_tokens(static_cast<int32_t>(plan.token_ids.size()));
  h.set_bytes_per_token(plan.bytes_per_token);
  h.set_total_bytes(plan.total_bytes());
  for (int32_t id : plan.token_ids) h.add_token_ids(id);
  return h;
}

namespace {

// The test hook TANDEM_FAULT_KV_PUSH_DELAY_MS: how long a push holds its
// payload after the header (read once).
absl::Duration PushFaultDelay() {
  static const absl::Duration delay = services::FaultDelay(services::kFaultKvPushDelay);
  return delay;
}

// The result of a PushKv call that ended OK: the receiver's count must be
// what the header declared.
absl::StatusOr<KvSendResult> PushResult(const tandem::v1::PushKvResponse& response,
                                        int64_t total_bytes, absl::Time start) {
  KvSendResult result;
  result.num_bytes = response.bytes_received();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.lease_seconds = response.lease_seconds();
  if (result.num_bytes != total_bytes) {
    return absl::DataLossError("PushKv: receiver counted a different number of bytes");
  }
  return result;
}

// One PushKv call: the header went out at Open; Write sends raw chunks.
class HostKvSendStream final : public KvSendStream {
 public:
  HostKvSendStream(std::shared_ptr<tandem::v1::DecodeWorker::Stub> stub,
                   std::unique_ptr<grpc::ClientContext> context, int64_t chunk_bytes,
                   int64_t total_bytes)
      : stub_(std::move(stub)),
        context_(std::move(context)),
        chunk_bytes_(chunk_bytes),
        total_bytes_(total_bytes),
        start_(absl::Now()) {
    writer_ = stub_->PushKv(context_.get(), &response_);
  }
  ~HostKvSendStream() override {
    if (!finished_) {
      context_->TryCancel();  // the receiver drops the partial push and its reservation
      (void)writer_->Finish();
    }
  }

  absl::Status WriteHeader(const tandem::v1::KvTransferHeader& header) {
    tandem::v1::KvChunk chunk;
    *chunk.mutable_header() = header;
    return writer_->Write(chunk) ? absl::OkStatus() : Broken();
  }

  absl::Status Write(std::string_view bytes) override {
    if (broken_) return absl::FailedPreconditionError("PushKv: write after a failed write");
    if (sent_ + static_cast<int64_t>(bytes.size()) > total_bytes_) {
      return absl::InvalidArgumentError("PushKv: more bytes than the header declared");
    }
    for (size_t off = 0; off < bytes.size(); off += static_cast<size_t>(chunk_bytes_)) {
      const size_t n = std::min(static_cast<size_t>(chunk_bytes_), bytes.size() - off);
      chunk_.set_data(bytes.data() + off, n);
      if (!writer_->Write(chunk_)) return Broken();
      sent_ += static_cast<int64_t>(n);
    }
    return absl::OkStatus();
  }

  void Cancel() override { context_->TryCancel(); }

  absl::StatusOr<KvSendResult> Finish() override {
    if (broken_) return absl::FailedPreconditionError("PushKv: finish after a failed write");
    if (sent_ != total_bytes_) {
      return absl::InvalidArgumentError("PushKv: fewer bytes than the header declared");
    }
    const bool ok = writer_->WritesDone();
    finished_ = true;
    const grpc::Status status = writer_->Finish();
    if (!status.ok()) return services::FromGrpcStatus(status);
    if (!ok) return absl::UnavailableError("PushKv stream broke");
    return PushResult(response_, total_bytes_, start_);
  }

 private:
  // The stream closed under a write: the receiver's status says why.
  absl::Status Broken() {
    broken_ = true;
    finished_ = true;
    const grpc::Status status = writer_->Finish();
    if (!status.ok()) return services::FromGrpcStatus(status);
    return absl::UnavailableError("PushKv stream broke");
  }

  const std::shared_ptr<tandem::v1::DecodeWorker::Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> context_;
  const int64_t chunk_bytes_;
  const int64_t total_bytes_;
  const absl::Time start_;
  tandem::v1::PushKvResponse response_;
  std::unique_ptr<grpc::ClientWriter<tandem::v1::KvChunk>> writer_;
  tandem::v1::KvChunk chunk_;
  int64_t sent_ = 0;
  bool broken_ = false;
  bool finished_ = false;
};

// One PushKv call on gRPC's callback API: pieces queue, and each write is
// started by the previous one's completion, so no thread waits on the wire.
// The reactor keeps itself alive (self_) until OnDone; a hold keeps OnDone
// from coming while a Write or Close may still start an operation.
class AsyncPush final : public KvAsyncSendStream,
                        public grpc::ClientWriteReactor<tandem::v1::KvChunk> {
 public:
  AsyncPush(std::unique_ptr<grpc::ClientContext> context, int64_t chunk_bytes, int64_t total_bytes,
            DoneCallback on_done)
      : context_(std::move(context)),
        chunk_bytes_(chunk_bytes),
        total_bytes_(total_bytes),
        on_done_(std::move(on_done)),
        start_(absl::Now()) {}

  // Starts the call with the header as its first write. `delay` (a test
  // hook) holds the payload after the header without blocking the caller.
  static std::shared_ptr<AsyncPush> Start(tandem::v1::DecodeWorker::Stub* stub,
                                          std::unique_ptr<grpc::ClientContext> context,
                                          int64_t chunk_bytes,
                                          const tandem::v1::KvTransferHeader& h,
                                          absl::Duration delay, DoneCallback on_done) {
    auto p = std::make_shared<AsyncPush>(std::move(context), chunk_bytes, h.total_bytes(),
                                         std::move(on_done));
    p->self_ = p;
    *p->header_.mutable_header() = h;
    stub->async()->PushKv(p->context_.get(), &p->response_, p.get());
    p->AddHold();  // until the last write or the end
    {
      absl::MutexLock lock(&p->mu_);
      p->held_ = delay > absl::ZeroDuration();
      p->writing_ = true;
      p->StartWrite(&p->header_);
    }
    p->StartCall();
    if (delay > absl::ZeroDuration()) {
      // A weak reference: the alarm may fire (or be cancelled) after the end.
      p->alarm_.Set(absl::ToChronoTime(absl::Now() + delay),
                    [w = std::weak_ptr<AsyncPush>(p)](bool) {
                      if (std::shared_ptr<AsyncPush> q = w.lock()) q->Unhold();
                    });
    }
    return p;
  }

  void Write(std::string bytes) override {
    absl::MutexLock lock(&mu_);
    if (closed_ || released_) return;
    if (queued_ + sent_ + static_cast<int64_t>(bytes.size()) > total_bytes_) {
      error_ = absl::InvalidArgumentError("PushKv: more bytes than the header declared");
      context_->TryCancel();
      ReleaseLocked();
      return;
    }
    queued_ += static_cast<int64_t>(bytes.size());
    pieces_.push_back(std::move(bytes));
    if (!writing_) NextLocked();
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    if (closed_ || released_) return;
    closed_ = true;
    if (sent_ + queued_ != total_bytes_) {
      error_ = absl::InvalidArgumentError("PushKv: fewer bytes than the header declared");
      context_->TryCancel();
      ReleaseLocked();
      return;
    }
    if (!writing_) NextLocked();
  }

  void Cancel() override {
    context_->TryCancel();  // a write in flight fails; the receiver drops the push
    absl::MutexLock lock(&mu_);
    closed_ = true;
    if (!writing_) ReleaseLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {  // the stream broke (or was cancelled): OnDone has the status
      ReleaseLocked();
      return;
    }
    NextLocked();
  }

  void OnDone(const grpc::Status& status) override {
    absl::StatusOr<KvSendResult> result = Result(status);
    DoneCallback notify = std::move(on_done_);
    std::shared_ptr<AsyncPush> self = std::move(self_);  // last act: may free this
    notify(std::move(result));
  }

 private:
  absl::StatusOr<KvSendResult> Result(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    if (!status.ok()) return services::FromGrpcStatus(status);
    if (!writes_done_) return absl::UnavailableError("PushKv stream broke");
    return PushResult(response_, total_bytes_, start_);
  }

  void Unhold() {
    absl::MutexLock lock(&mu_);
    held_ = false;
    if (!writing_) NextLocked();
  }

  // Starts the next chunk of the queue, or WritesDone once closed and
  // drained (then the hold goes: no operation follows).
  void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (released_ || held_) return;
    if (!pieces_.empty()) {
      std::string& piece = pieces_.front();
      const size_t n = std::min(static_cast<size_t>(chunk_bytes_), piece.size() - offset_);
      chunk_.set_data(piece.data() + offset_, n);
      offset_ += n;
      queued_ -= static_cast<int64_t>(n);
      sent_ += static_cast<int64_t>(n);
      if (offset_ == piece.size()) {
        pieces_.pop_front();
        offset_ = 0;
      }
      writing_ = true;
      StartWrite(&chunk_);
      return;
    }
    if (closed_) {
      writes_done_ = true;
      StartWritesDone();
      ReleaseLocked();
    }
  }

  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (released_) return;
    released_ = true;
    pieces_.clear();
    RemoveHold();  // OnDone is scheduled, never run inline here
  }

  const std::unique_ptr<grpc::ClientContext> context_;
  const int64_t chunk_bytes_;
  const int64_t total_bytes_;
  DoneCallback on_done_;
  const absl::Time start_;
  std::shared_ptr<AsyncPush> self_;
  grpc::Alarm alarm_;
  tandem::v1::KvChunk header_;
  tandem::v1::PushKvResponse response_;

  absl::Mutex mu_;
  std::deque<std::string> pieces_ ABSL_GUARDED_BY(mu_);
  size_t offset_ ABSL_GUARDED_BY(mu_) = 0;  // into pieces_.front()
  tandem::v1::KvChunk chunk_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // bytes in pieces_ not yet started
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;    // bytes whose write was started
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;  // the test hook's delay after the header
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<KvAsyncSendStream> HostKvTransport::OpenAsync(
    const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
    const KvSendPlan& plan, absl::Time deadline, KvAsyncSendStream::DoneCallback on_done) {
  const absl::Duration fault_delay = PushFaultDelay();
  return AsyncPush::Start(StubFor(target.address).get(), MakeTransferContext(target, deadline),
                          chunk_bytes_, MakeHeader(target, compat, plan), fault_delay,
                          std::move(on_done));
}

absl::StatusOr<std::unique_ptr<KvSendStream>> HostKvTransport::Open(
    const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
    const KvSendPlan& plan, absl::Time deadline) {
  auto stream = std::make_unique<HostKvSendStream>(StubFor(target.address),
                                                   MakeTransferContext(target, deadline),
                                                   chunk_bytes_, plan.total_bytes());
  TANDEM_RETURN_IF_ERROR(stream->WriteHeader(MakeHeader(target, compat, plan)));
  const absl::Duration fault_delay = PushFaultDelay();
  if (fault_delay > absl::ZeroDuration()) absl::SleepFor(fault_delay);  // tests only
  return std::unique_ptr<KvSendStream>(std::move(stream));
}

}  // namespace tandem::transfer
