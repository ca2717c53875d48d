// absl::Status <-> grpc::Status at the router's edges (same code numbering).
#ifndef TANDEM_SERVICES_ROUTER_GRPC_STATUS_H_
#define TANDEM_SERVICES_ROUTER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tandem::router {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_GRPC_STATUS_H_
