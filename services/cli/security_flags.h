// The security flags shared by the cluster commands (docs/security.md):
// --tls-cert / --tls-key / --tls-ca / --tls-server-name on router, prefill,
// decode and serve (server + internal channels) and on client / bench (the
// channel to the router); --api-key / $TANDEM_API_KEY on the clients.
#ifndef TANDEM_SERVICES_CLI_SECURITY_FLAGS_H_
#define TANDEM_SERVICES_CLI_SECURITY_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/cli/args.h"
#include "services/common/tls.h"

namespace tandem::cli {

// Server role: the process serves with cert + key (mTLS with --tls-ca) and
// dials its peers with the same files.
void AddServerTlsFlags(ArgParser& p, services::TlsOptions& tls);
// Client role: --tls-ca turns TLS on; --tls-cert / --tls-key add a client
// certificate (needed when the router runs mTLS).
void AddClientTlsFlags(ArgParser& p, services::TlsOptions& tls);

// The flags of `tls` as argv for a child process (only the ones set).
std::vector<std::string> TlsArgs(const services::TlsOptions& tls);

// --api-key when set, else $TANDEM_API_KEY, else "" (no key).
std::string ResolveApiKey(const std::string& flag_value);

}  // namespace tandem::cli

#endif  // TANDEM_SERVICES_CLI_SECURITY_FLAGS_H_
