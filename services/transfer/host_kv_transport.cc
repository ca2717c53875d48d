#include "services/transfer/host_kv_transport.h"

#include <algorithm>

#include "common/status.h"
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
    KvSendResult result;
    result.num_bytes = response_.bytes_received();
    result.seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    result.lease_seconds = response_.lease_seconds();
    if (result.num_bytes != total_bytes_) {
      return absl::DataLossError("PushKv: receiver counted a different number of bytes");
    }
    return result;
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

}  // namespace

absl::StatusOr<std::unique_ptr<KvSendStream>> HostKvTransport::Open(
    const KvTransferTarget& target, const tandem::v1::KvCompatibility& compat,
    const KvSendPlan& plan, absl::Time deadline) {
  auto stream = std::make_unique<HostKvSendStream>(StubFor(target.address),
                                                   MakeTransferContext(target, deadline),
                                                   chunk_bytes_, plan.total_bytes());
  TANDEM_RETURN_IF_ERROR(stream->WriteHeader(MakeHeader(target, compat, plan)));
  static const absl::Duration fault_delay = services::FaultDelay(services::kFaultKvPushDelay);
  if (fault_delay > absl::ZeroDuration()) absl::SleepFor(fault_delay);  // tests only
  return std::unique_ptr<KvSendStream>(std::move(stream));
}

}  // namespace tandem::transfer
