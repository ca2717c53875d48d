#include "services/transfer/host_kv_transport.h"

#include <algorithm>

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
                                                         const engine::KvExport& kv) {
  tandem::v1::KvTransferHeader h;
  h.set_kv_handle(target.kv_handle);
  h.set_request_id(target.request_id);
  *h.mutable_compat() = compat;
  h.set_num_tokens(static_cast<int32_t>(kv.num_tokens()));
  h.set_bytes_per_token(kv.bytes_per_token);
  h.set_total_bytes(static_cast<int64_t>(kv.bytes.size()));
  for (int32_t id : kv.token_ids) h.add_token_ids(id);
  return h;
}

absl::StatusOr<KvSendResult> HostKvTransport::Send(const KvTransferTarget& target,
                                                   const tandem::v1::KvCompatibility& compat,
                                                   const engine::KvExport& kv,
                                                   absl::Time deadline) {
  const absl::Time start = absl::Now();
  auto stub = StubFor(target.address);
  const std::unique_ptr<grpc::ClientContext> owned = MakeTransferContext(target, deadline);
  grpc::ClientContext& context = *owned;
  tandem::v1::PushKvResponse response;
  std::unique_ptr<grpc::ClientWriter<tandem::v1::KvChunk>> writer =
      stub->PushKv(&context, &response);
  tandem::v1::KvChunk chunk;
  *chunk.mutable_header() = MakeHeader(target, compat, kv);
  bool ok = writer->Write(chunk);
  static const absl::Duration fault_delay = services::FaultDelay(services::kFaultKvPushDelay);
  if (fault_delay > absl::ZeroDuration()) absl::SleepFor(fault_delay);  // tests only
  const int64_t total = static_cast<int64_t>(kv.bytes.size());
  for (int64_t off = 0; ok && off < total; off += chunk_bytes_) {
    const int64_t n = std::min(chunk_bytes_, total - off);
    chunk.set_data(kv.bytes.data() + off, n);
    // The last chunk may coalesce with WritesDone.
    ok = writer->Write(chunk);
  }
  if (ok) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return services::FromGrpcStatus(status);
  if (!ok) return absl::UnavailableError("PushKv stream broke");
  KvSendResult result;
  result.num_bytes = response.bytes_received();
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.lease_seconds = response.lease_seconds();
  if (result.num_bytes != total) {
    return absl::DataLossError("PushKv: receiver counted a different number of bytes");
  }
  return result;
}

}  // namespace tandem::transfer
