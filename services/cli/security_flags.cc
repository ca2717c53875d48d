#include "services/cli/security_flags.h"

#include <cstdlib>

#include "services/common/api_key.h"

namespace tandem::cli {

void AddServerTlsFlags(ArgParser& p, services::TlsOptions& tls) {
  p.AddString("tls-cert", &tls.cert_file,
              "PEM certificate of this server (and its client certificate toward peers)");
  p.AddString("tls-key", &tls.key_file, "PEM private key of --tls-cert");
  p.AddString("tls-ca", &tls.ca_file,
              "PEM CA bundle: verifies peers; with it every client must present a certificate "
              "(mTLS)");
  p.AddString("tls-server-name", &tls.server_name,
              "name expected in peers' certificates instead of the dialed host (e.g. pod IPs)");
}

void AddClientTlsFlags(ArgParser& p, services::TlsOptions& tls) {
  p.AddString("tls-ca", &tls.ca_file, "PEM CA bundle that signed the router's certificate (TLS)");
  p.AddString("tls-cert", &tls.cert_file, "PEM client certificate (a router running mTLS)");
  p.AddString("tls-key", &tls.key_file, "PEM private key of --tls-cert");
  p.AddString("tls-server-name", &tls.server_name,
              "name expected in the router's certificate instead of the --server host");
}

std::vector<std::string> TlsArgs(const services::TlsOptions& tls) {
  std::vector<std::string> out;
  auto add = [&](const char* flag, const std::string& v) {
    if (v.empty()) return;
    out.push_back(flag);
    out.push_back(v);
  };
  add("--tls-cert", tls.cert_file);
  add("--tls-key", tls.key_file);
  add("--tls-ca", tls.ca_file);
  add("--tls-server-name", tls.server_name);
  return out;
}

std::string ResolveApiKey(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  const char* env = std::getenv(services::kApiKeyEnvVar);
  return env != nullptr ? std::string(env) : std::string();
}

}  // namespace tandem::cli
