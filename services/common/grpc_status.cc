#include "services/common/grpc_status.h"

#include <string>

#include "absl/strings/numbers.h"

namespace tandem::services {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void SetRetryAfter(grpc::ServerContextBase* context, absl::Duration delay) {
  context->AddTrailingMetadata(kRetryAfterMetadataKey,
                               std::to_string(absl::ToInt64Milliseconds(delay)));
}

grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context,
                          absl::Duration retry_after) {
  if (status.code() == absl::StatusCode::kResourceExhausted && context != nullptr) {
    SetRetryAfter(context, retry_after);
  }
  return ToGrpcStatus(status);
}

std::optional<absl::Duration> RetryAfter(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kRetryAfterMetadataKey);
  if (it == trailers.end()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &ms) || ms < 0) {
    return std::nullopt;
  }
  return absl::Milliseconds(ms);
}

}  // namespace tandem::services
