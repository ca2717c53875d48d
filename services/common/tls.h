// TLS for Tandem's gRPC (docs/security.md). One TlsOptions per process,
// threaded through the config structs (WorkerServerConfig, RouterServer::
// Options, the CLI flags --tls-cert / --tls-key / --tls-ca / --tls-server-name):
//
//   server side (router, prefill, decode):
//     nothing set            -> insecure (plaintext h2c; today's default)
//     cert + key             -> TLS, clients are not asked for a certificate
//     cert + key + ca        -> mTLS: every client must present a certificate
//                               signed by `ca` (router clients included: the
//                               router has one port)
//     ca or key alone, cert without key -> InvalidArgument
//   client side (every channel a Tandem process opens: worker -> router
//   Register, router -> workers, prefill -> decode PushKv, `tandem client`):
//     nothing set            -> insecure
//     ca                     -> TLS, the server's certificate is verified
//                               against `ca` (without: the system roots)
//     cert + key             -> presented as the client certificate (mTLS)
//     server_name            -> the name expected in the server's
//                               certificate instead of the dialed host
//                               (e.g. pods dialed by IP, one shared DNS SAN)
//
// Files are read and checked once, at start-up, with errors that name the
// flag and the file: missing / unreadable / empty, not PEM, a private key
// that does not belong to the certificate. Certificates are not reloaded
// (restart to rotate).
#ifndef TANDEM_SERVICES_COMMON_TLS_H_
#define TANDEM_SERVICES_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace tandem::services {

struct TlsOptions {
  std::string cert_file;    // PEM certificate chain (--tls-cert)
  std::string key_file;     // PEM private key of cert_file (--tls-key)
  std::string ca_file;      // PEM CA bundle (--tls-ca)
  std::string server_name;  // client side: expected peer name (--tls-server-name)

  // True when any file is set: TLS on.
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// The PEM contents of TlsOptions, checked.
struct TlsMaterial {
  std::string cert;
  std::string key;
  std::string ca;
};

// Reads and checks the files. `server`: cert + key are required (and a CA
// alone is an error); otherwise cert and key are optional but go together.
// InvalidArgument naming the flag (--tls-cert, ...) and the path.
absl::StatusOr<TlsMaterial> LoadTls(const TlsOptions& options, bool server);

// The checks of LoadTls for the server role, for flag validation before a
// slow start-up (model loading).
absl::Status ValidateServerTls(const TlsOptions& options);

// Insecure when !options.enabled().
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

// What a client channel needs: credentials plus the expected server name.
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null = insecure
  std::string server_name;                                // empty = the dialed host
  bool tls() const { return credentials != nullptr; }
};

// Insecure (null credentials) when !options.enabled().
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsOptions& options);

// grpc::CreateCustomChannel with `security` (credentials, and the target
// name override when server_name is set) added to `args`.
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             const ChannelSecurity& security,
                                             grpc::ChannelArguments args = {});

// "TLS (mTLS)" / "TLS" / "plaintext": for start-up log lines.
std::string DescribeTls(const TlsOptions& options);

}  // namespace tandem::services

#endif  // TANDEM_SERVICES_COMMON_TLS_H_
