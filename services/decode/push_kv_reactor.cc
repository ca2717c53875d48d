#include "services/decode/push_kv_reactor.h"

#include "services/common/grpc_status.h"

namespace tandem::decode {

PushKvReactor::PushKvReactor(DecodeServiceImpl* service, grpc::CallbackServerContext* context,
                             tandem::v1::PushKvResponse* response)
    : service_(service), context_(context), response_(response), active_(&service->active_rpcs_) {
  StartRead(&chunk_);
}

void PushKvReactor::OnReadDone(bool ok) {
  if (!receiver_.has_value()) {
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "PushKv: empty stream"));
      return;
    }
    if (!OnHeader()) return;
  } else if (!ok) {  // the pusher closed its side (or cancelled)
    OnEnd();
    return;
  } else {
    if (chunk_.part_case() != tandem::v1::KvChunk::kData) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "PushKv: a second header"));
      return;
    }
    const absl::Status st = receiver_->AddData(chunk_.data());
    if (!st.ok()) {
      End(services::ToGrpcStatus(st));
      return;
    }
  }
  StartRead(&chunk_);
}

bool PushKvReactor::OnHeader() {
  if (!chunk_.has_header()) {
    End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "PushKv: the first message must be the header"));
    return false;
  }
  // Everything is checked before any payload byte is read or memory taken.
  receiver_.emplace(&service_->leases_, service_->push_limits());
  absl::Status st = receiver_->Validate(chunk_.header());
  if (!st.ok()) {
    End(services::ToGrpcStatus(st));
    return false;
  }
  if (service_->draining_.load()) {
    End(DrainingStatus());
    return false;
  }
  st = receiver_->Reserve(service_->free_kv_bytes());
  if (!st.ok()) {
    End(services::ToGrpcStatus(st, context_));
    return false;
  }
  start_ = absl::Now();
  return true;
}

void PushKvReactor::OnEnd() {
  if (context_->IsCancelled()) {
    End(grpc::Status(grpc::StatusCode::CANCELLED, "PushKv cancelled"));
    return;
  }
  absl::StatusOr<int64_t> committed = receiver_->Commit();
  if (!committed.ok()) {
    End(services::ToGrpcStatus(committed.status()));
    return;
  }
  const int64_t received = *committed;
  services::WorkerRuntime* runtime = service_->runtime_;
  runtime->metrics().kv_transfer_bytes->Inc(static_cast<double>(received));
  runtime->metrics().kv_transfer_time->Observe(absl::ToDoubleSeconds(absl::Now() - start_));
  response_->set_bytes_received(received);
  response_->set_lease_seconds(absl::ToDoubleSeconds(service_->leases_.lease()));
  End(grpc::Status::OK);
}

void PushKvReactor::End(const grpc::Status& status) {
  receiver_.reset();  // an uncommitted reservation is aborted before the pusher hears
  Finish(status);
}

}  // namespace tandem::decode
