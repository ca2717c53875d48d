// absl::Status <-> grpc::Status at the services edge.
//
// Codes map one to one (both follow google.rpc.Code). Retry hint for
// RESOURCE_EXHAUSTED / UNAVAILABLE: a plain trailing metadata entry
// `retry-after-ms: <decimal milliseconds>` (not google.rpc.RetryInfo in
// grpc-status-details-bin: no googleapis protos are needed on either side).
// Servers call SetRetryAfter before returning; clients read RetryAfter.
#ifndef TANDEM_SERVICES_COMMON_GRPC_STATUS_H_
#define TANDEM_SERVICES_COMMON_GRPC_STATUS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace tandem::services {

inline constexpr char kRetryAfterMetadataKey[] = "retry-after-ms";

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Adds the retry-after-ms trailer (server side).
void SetRetryAfter(grpc::ServerContextBase* context, absl::Duration delay);
// ToGrpcStatus, plus a retry-after-ms trailer when the code is
// RESOURCE_EXHAUSTED (default 100 ms).
grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context,
                          absl::Duration retry_after = absl::Milliseconds(100));
// The server's retry-after-ms trailer, if any (client side, after Finish).
std::optional<absl::Duration> RetryAfter(const grpc::ClientContext& context);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_GRPC_STATUS_H_
