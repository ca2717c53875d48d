#include "services/common/tls.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

namespace tandem::services {
namespace {

constexpr int64_t kMaxPemBytes = 1 << 20;

absl::Status Bad(const std::string& flag, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s %s: %s", flag, path, what));
}

// The file's bytes: a regular, readable, non-empty file of at most 1 MiB
// that holds a PEM block.
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Bad(flag, path, "no such file");
  if (!S_ISREG(st.st_mode)) return Bad(flag, path, "not a regular file");
  if (st.st_size == 0) return Bad(flag, path, "the file is empty");
  if (st.st_size > kMaxPemBytes) return Bad(flag, path, "larger than 1 MiB: not a PEM file");
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return Bad(flag, path, "cannot be read (permissions?)");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string bytes = ss.str();
  if (bytes.empty()) return Bad(flag, path, "cannot be read or is empty");
  if (bytes.find("-----BEGIN ") == std::string::npos) {
    return Bad(flag, path, "not PEM (no -----BEGIN line)");
  }
  return bytes;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

BioPtr MemBio(const std::string& bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// Never prompts for a passphrase (an encrypted key is refused instead).
int NoPassphrase(char*, int, int, void*) { return 0; }

// Every certificate in `pem`, in order.
std::vector<X509Ptr> ParseCerts(const std::string& pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = MemBio(pem);
  while (bio != nullptr) {
    X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr);
    if (x == nullptr) break;
    out.emplace_back(x);
  }
  ERR_clear_error();  // the end of input reads as an error
  return out;
}

absl::Status CheckValidity(const std::string& flag, const std::string& path, X509* cert) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return Bad(flag, path, "the certificate has expired");
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return Bad(flag, path, "the certificate is not valid yet (notBefore is in the future)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTls(const TlsOptions& o, bool server) {
  TlsMaterial m;
  if (!o.enabled()) return m;
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        o.cert_file.empty() ? "--tls-key needs --tls-cert (the certificate of that key)"
                            : "--tls-cert needs --tls-key (the certificate's private key)");
  }
  if (server && o.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca needs --tls-cert and --tls-key: a TLS server needs its own certificate and key");
  }
  if (!o.cert_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(m.cert, ReadPem("--tls-cert", o.cert_file));
    TANDEM_ASSIGN_OR_RETURN(m.key, ReadPem("--tls-key", o.key_file));
    std::vector<X509Ptr> chain = ParseCerts(m.cert);
    if (chain.empty()) return Bad("--tls-cert", o.cert_file, "no PEM certificate in it");
    TANDEM_RETURN_IF_ERROR(CheckValidity("--tls-cert", o.cert_file, chain[0].get()));
    BioPtr bio = MemBio(m.key);
    PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
    ERR_clear_error();
    if (key == nullptr) {
      return Bad("--tls-key", o.key_file,
                 "no PEM private key in it (an encrypted key is not supported)");
    }
    if (X509_check_private_key(chain[0].get(), key.get()) != 1) {
      ERR_clear_error();
      return Bad("--tls-key", o.key_file,
                 absl::StrCat("does not match the certificate in --tls-cert ", o.cert_file));
    }
  }
  if (!o.ca_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(m.ca, ReadPem("--tls-ca", o.ca_file));
    if (ParseCerts(m.ca).empty()) return Bad("--tls-ca", o.ca_file, "no PEM certificate in it");
  }
  return m;
}

absl::Status ValidateServerTls(const TlsOptions& options) {
  return LoadTls(options, /*server=*/true).status();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options) {
  if (!options.enabled()) return grpc::InsecureServerCredentials();
  TANDEM_ASSIGN_OR_RETURN(TlsMaterial m, LoadTls(options, /*server=*/true));
  grpc::SslServerCredentialsOptions so(
      m.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  so.pem_root_certs = m.ca;
  so.pem_key_cert_pairs.push_back({m.key, m.cert});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(so);
  if (creds == nullptr)
    return absl::InvalidArgumentError("TLS: gRPC refused the server credentials");
  return creds;
}

absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsOptions& options) {
  ChannelSecurity s;
  s.server_name = options.server_name;
  if (!options.enabled()) return s;
  TANDEM_ASSIGN_OR_RETURN(TlsMaterial m, LoadTls(options, /*server=*/false));
  grpc::SslCredentialsOptions co;
  co.pem_root_certs = m.ca;  // empty: gRPC's default roots
  co.pem_private_key = m.key;
  co.pem_cert_chain = m.cert;
  s.credentials = grpc::SslCredentials(co);
  if (s.credentials == nullptr) {
    return absl::InvalidArgumentError("TLS: gRPC refused the channel credentials");
  }
  return s;
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                             const ChannelSecurity& security,
                                             grpc::ChannelArguments args) {
  if (security.tls() && !security.server_name.empty()) {
    args.SetSslTargetNameOverride(security.server_name);
  }
  return grpc::CreateCustomChannel(
      address, security.tls() ? security.credentials : grpc::InsecureChannelCredentials(), args);
}

std::string DescribeTls(const TlsOptions& options) {
  if (!options.enabled()) return "plaintext";
  return !options.ca_file.empty() && !options.cert_file.empty() ? "mTLS" : "TLS";
}

}  // namespace tandem::services
