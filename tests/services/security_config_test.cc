// The pieces behind --api-key-file and --tls-*: key-file parsing, the bearer
// check, constant-time comparison, and which TLS flag combinations each role
// accepts (with the certificates of a throwaway CA made by `openssl`), plus
// one in-process server on mTLS that a plaintext or certificate-less client
// cannot reach.
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "services/common/api_key.h"
#include "services/common/tls.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace tandem::services {
namespace {

TEST(ApiKeyTest, ParsesKeysSkippingCommentsAndBlankLines) {
  auto keys = ParseApiKeys("# header\n\n  alpha-1  \r\n#beta\n\tgamma_2\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"alpha-1", "gamma_2"}));
  EXPECT_FALSE(ParseApiKeys("").ok());
  EXPECT_FALSE(ParseApiKeys("# only\n\n   \n").ok());
  EXPECT_NE(ParseApiKeys("a b\n").status().message().find("line 1"), std::string::npos);
  EXPECT_FALSE(ParseApiKeys("ok\nbad\x01key\n").ok());
  EXPECT_FALSE(ParseApiKeys(std::string(5000, 'k')).ok());
}

TEST(ApiKeyTest, LoadErrorsNameTheFlagAndPath) {
  auto missing = LoadApiKeyFile("/nonexistent/keys.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--api-key-file /nonexistent/keys.txt"),
            std::string::npos);
  auto dir = LoadApiKeyFile("/tmp");
  EXPECT_FALSE(dir.ok());
}

TEST(ApiKeyTest, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secreT", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secrets", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("sec\0et", 6), "secret"));
}

TEST(ApiKeyTest, BearerHeaderCheck) {
  ApiKeySet open;
  EXPECT_TRUE(open.CheckHeader(nullptr).ok());
  ApiKeySet set({"k1", "key-two"});
  EXPECT_TRUE(set.enabled());
  auto check = [&](const std::string& v) { return set.CheckHeader(&v); };
  EXPECT_EQ(set.CheckHeader(nullptr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(set.CheckHeader(nullptr).error_message().find("missing API key"), std::string::npos);
  EXPECT_TRUE(check("Bearer k1").ok());
  EXPECT_TRUE(check("Bearer key-two").ok());
  EXPECT_TRUE(check("BEARER key-two").ok());
  EXPECT_EQ(check("Bearer k2").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(check("Bearer k1 ").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(check("Bearer key-tw").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(check("Bearer ").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(check("k1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(check("Basic azE=").error_message().find("Bearer"), std::string::npos);
  EXPECT_NE(check("Bearer nope").error_message().find("invalid API key"), std::string::npos);
}

class TlsConfigTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tandem_tls_unit_XXXXXX";
    dir_ = new std::string(mkdtemp(tmpl));
    const std::string script = "set -e; cd '" + *dir_ + R"('
EC="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $EC -keyout ca.key -out ca.crt -days 2 -subj /CN=unit-ca
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > node.ext
openssl req $EC -keyout node.key -out node.csr -subj /CN=node
openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 2 -extfile node.ext
openssl req $EC -keyout other.key -out other.csr -subj /CN=other
openssl req -x509 $EC -keyout old.key -out old.crt -subj /CN=old -not_before 20200101000000Z -not_after 20200102000000Z 2>/dev/null || true
)";
    testing::ProcessResult r = testing::RunProcess({"/bin/sh", "-c", script});
    error_ = new std::string(r.exit_code == 0 ? "" : r.err);
  }
  static void TearDownTestSuite() {
    testing::RunProcess({"/bin/rm", "-rf", *dir_});
    delete dir_;
    delete error_;
  }
  void SetUp() override { ASSERT_EQ(*error_, "") << "openssl: " << *error_; }
  static std::string P(const std::string& n) { return *dir_ + "/" + n; }
  static TlsOptions Opts(const std::string& cert, const std::string& key, const std::string& ca) {
    TlsOptions o;
    if (!cert.empty()) o.cert_file = P(cert);
    if (!key.empty()) o.key_file = P(key);
    if (!ca.empty()) o.ca_file = P(ca);
    return o;
  }
  static std::string* dir_;
  static std::string* error_;
};
std::string* TlsConfigTest::dir_ = nullptr;
std::string* TlsConfigTest::error_ = nullptr;

TEST_F(TlsConfigTest, ServerAndClientRoleRules) {
  EXPECT_FALSE(TlsOptions().enabled());
  EXPECT_TRUE(ValidateServerTls(TlsOptions()).ok());  // plaintext
  EXPECT_EQ(DescribeTls(TlsOptions()), "plaintext");
  EXPECT_TRUE(ValidateServerTls(Opts("node.crt", "node.key", "")).ok());
  EXPECT_EQ(DescribeTls(Opts("node.crt", "node.key", "")), "TLS");
  EXPECT_TRUE(ValidateServerTls(Opts("node.crt", "node.key", "ca.crt")).ok());
  EXPECT_EQ(DescribeTls(Opts("node.crt", "node.key", "ca.crt")), "mTLS");
  // A server needs its own certificate.
  EXPECT_FALSE(ValidateServerTls(Opts("", "", "ca.crt")).ok());
  // A client may verify the server only.
  EXPECT_TRUE(LoadTls(Opts("", "", "ca.crt"), /*server=*/false).ok());
  auto client_only = MakeChannelSecurity(Opts("", "", "ca.crt"));
  ASSERT_TRUE(client_only.ok());
  EXPECT_TRUE(client_only->tls());
  EXPECT_FALSE(MakeChannelSecurity(TlsOptions())->tls());
  for (bool server : {true, false}) {
    EXPECT_NE(LoadTls(Opts("node.crt", "", "ca.crt"), server)
                  .status()
                  .message()
                  .find("--tls-cert needs --tls-key"),
              std::string::npos);
    EXPECT_NE(LoadTls(Opts("", "node.key", "ca.crt"), server)
                  .status()
                  .message()
                  .find("--tls-key needs --tls-cert"),
              std::string::npos);
    EXPECT_NE(LoadTls(Opts("node.crt", "other.key", ""), server)
                  .status()
                  .message()
                  .find("does not match"),
              std::string::npos);
    EXPECT_NE(LoadTls(Opts("node.crt", "node.key", "node.key"), server)
                  .status()
                  .message()
                  .find("--tls-ca"),
              std::string::npos);
    EXPECT_NE(
        LoadTls(Opts("missing", "node.key", ""), server).status().message().find("no such file"),
        std::string::npos);
  }
  // An expired certificate is refused up front (when this openssl can make one).
  std::ifstream old(P("old.crt"));
  if (old.good()) {
    EXPECT_NE(LoadTls(Opts("old.crt", "old.key", ""), true).status().message().find("expired"),
              std::string::npos);
  }
}

// A real server on mTLS from TlsOptions: a client with MakeChannelSecurity
// of the same files gets through; plaintext and certificate-less ones do not.
TEST_F(TlsConfigTest, MtlsServerRefusesPlaintextAndAnonymousClients) {
  auto creds = MakeServerCredentials(Opts("node.crt", "node.key", "ca.crt"));
  ASSERT_TRUE(creds.ok()) << creds.status();
  tandem::v1::WorkerRegistry::Service service;  // UNIMPLEMENTED handlers are enough
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", *creds, &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto call = [&](std::shared_ptr<grpc::Channel> channel) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    tandem::v1::RegisterResponse resp;
    return tandem::v1::WorkerRegistry::NewStub(channel)->Register(&ctx, {}, &resp).error_code();
  };
  auto mtls = MakeChannelSecurity(Opts("node.crt", "node.key", "ca.crt"));
  ASSERT_TRUE(mtls.ok());
  // Reached the handler: UNIMPLEMENTED (the base service), not a transport error.
  EXPECT_EQ(call(CreateChannel(address, *mtls)), grpc::StatusCode::UNIMPLEMENTED);
  auto anonymous = MakeChannelSecurity(Opts("", "", "ca.crt"));
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(call(CreateChannel(address, *anonymous)), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(call(CreateChannel(address, ChannelSecurity())), grpc::StatusCode::UNAVAILABLE);
  // The expected name can be overridden (the certificate has no DNS name).
  ChannelSecurity wrong_name = *mtls;
  wrong_name.server_name = "not-in-the-cert.example";
  EXPECT_EQ(call(CreateChannel(address, wrong_name)), grpc::StatusCode::UNAVAILABLE);
  server->Shutdown();
}

}  // namespace
}  // namespace tandem::services
