// absl::Status <-> grpc::Status at the services edge.
//
// Codes map one to one (both follow google.rpc.Code). Retry hint for
// RESOURCE_EXHAUSTED, in two forms every Tandem server sends together:
//  - a google.rpc.Status with a google.rpc.RetryInfo detail in
//    grpc-status-details-bin (what gRPC clients in any language read;
//    encoded by hand, the googleapis protos are not part of the build);
//  - a plain trailing metadata entry `retry-after-ms: <decimal ms>`.
// Servers return ToGrpcStatus(status, context, delay) (or SetRetryAfter +
// ResourceExhaustedWithRetry); clients read RetryAfter / RetryInfoDelay.
#ifndef TANDEM_SERVICES_COMMON_GRPC_STATUS_H_
#define TANDEM_SERVICES_COMMON_GRPC_STATUS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"

namespace tandem::services {

inline constexpr char kRetryAfterMetadataKey[] = "retry-after-ms";

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Adds the retry-after-ms trailer (server side).
void SetRetryAfter(grpc::ServerContextBase* context, absl::Duration delay);
// A RESOURCE_EXHAUSTED status whose details (grpc-status-details-bin) are a
// google.rpc.Status{code, message, details: [RetryInfo{retry_delay}]}.
grpc::Status ResourceExhaustedWithRetry(const std::string& message, absl::Duration retry_after);
// ToGrpcStatus; when the code is RESOURCE_EXHAUSTED, the RetryInfo details
// and (context != null) the retry-after-ms trailer too (default 100 ms).
grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context,
                          absl::Duration retry_after = absl::Milliseconds(100));
// The server's retry-after-ms trailer, if any (client side, after Finish).
std::optional<absl::Duration> RetryAfter(const grpc::ClientContext& context);
// RetryInfo.retry_delay from a status' error_details (a serialized
// google.rpc.Status); nullopt when absent or malformed.
std::optional<absl::Duration> RetryInfoDelay(const grpc::Status& status);

// Server interceptor: gRPC's own RESOURCE_EXHAUSTED answers (the sync
// server's thread quota is used up: "Server Threadpool Exhausted", sent
// before any handler runs) get the same RetryInfo details and retry-after-ms
// trailer as Tandem's. Statuses that already carry details are left alone.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RetryHintInterceptorFactory(
    absl::Duration retry_after);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_GRPC_STATUS_H_
