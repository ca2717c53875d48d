// API keys for the public tandem.v1.Generation service (docs/security.md).
//
// `--api-key-file PATH`: one key per line; leading / trailing whitespace is
// trimmed, blank lines and lines starting with '#' are ignored. A file that
// is missing, unreadable or holds no key is a start-up error. Clients send
// metadata `authorization: Bearer <key>`; keys are compared in constant time
// (in the key's length: every configured key is compared in full).
//
// Thread safety: ApiKeySet is immutable after construction.
#ifndef TANDEM_SERVICES_COMMON_API_KEY_H_
#define TANDEM_SERVICES_COMMON_API_KEY_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace tandem::services {

inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kApiKeyEnvVar[] = "TANDEM_API_KEY";

// The keys of a key file's text; InvalidArgument when there is none or a
// key has control characters / spaces (which no header could carry).
absl::StatusOr<std::vector<std::string>> ParseApiKeys(std::string_view text);
// Reads and parses `path`; errors name --api-key-file and the path.
absl::StatusOr<std::vector<std::string>> LoadApiKeyFile(const std::string& path);

// Equal in time independent of where the bytes differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

class ApiKeySet {
 public:
  ApiKeySet() = default;  // empty: every call is allowed
  explicit ApiKeySet(std::vector<std::string> keys) : keys_(std::move(keys)) {}

  bool enabled() const { return !keys_.empty(); }
  // OK when disabled or the call carries `authorization: Bearer <a key>`;
  // else UNAUTHENTICATED saying what is missing or wrong.
  grpc::Status Check(const grpc::ServerContextBase& context) const;
  // The same on a header value (tests).
  grpc::Status CheckHeader(const std::string* authorization) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_API_KEY_H_
