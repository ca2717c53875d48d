// Security of a real cluster on loopback (docs/security.md), with a throwaway
// CA, node certificate (SAN 127.0.0.1 + localhost) and client certificate
// made by the `openssl` CLI in a temp dir:
//  - `tandem serve --tls-cert --tls-key --tls-ca`: router, prefill and decode
//    all on mTLS (the cluster only gets ready if registration, health polls
//    work over mTLS; a generation needs the prefill -> decode PushKv too).
//    A client with the CA and a client certificate is served (gRPC, `tandem
//    client`, `tandem bench`); plaintext, no client certificate, a
//    certificate from another CA, and not trusting the server all fail; a
//    worker refuses a plaintext peer.
//  - `--api-key-file`: no key / a wrong key / a malformed header ->
//    UNAUTHENTICATED with a clear message (counted in
//    tandem_request_errors_total), each listed key -> OK, grpc.health
//    answers without a key; `tandem client` takes $TANDEM_API_KEY.
//  - bad flag inputs exit 2 with a message naming the flag, before any model
//    is loaded.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_util.h"
#include "tests/util/http_get.h"
#include "tests/util/subprocess.h"

namespace tandem::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
}

// A throwaway PKI: ca.{crt,key}, node.{crt,key} (server + client auth, SAN
// 127.0.0.1 and localhost), client.{crt,key} (client auth), and
// rogue_ca / rogue_client (another CA). Returns "" or the openssl output.
std::string MakePki(const std::string& dir) {
  const std::string script = R"(set -e
cd ")" + dir + R"("
EC="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $EC -keyout ca.key -out ca.crt -days 2 -subj /CN=tandem-test-ca
openssl req -x509 $EC -keyout rogue_ca.key -out rogue_ca.crt -days 2 -subj /CN=rogue-ca
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' > node.ext
printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n' > client.ext
openssl req $EC -keyout node.key -out node.csr -subj /CN=tandem-node
openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 2 -extfile node.ext
openssl req $EC -keyout client.key -out client.csr -subj /CN=tandem-client
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 -extfile client.ext
openssl req $EC -keyout rogue_client.key -out rogue_client.csr -subj /CN=rogue-client
openssl x509 -req -in rogue_client.csr -CA rogue_ca.crt -CAkey rogue_ca.key -CAcreateserial -out rogue_client.crt -days 2 -extfile client.ext
)";
  ProcessResult r = RunProcess({"/bin/sh", "-c", script});
  return r.exit_code == 0 ? "" : "openssl failed (scripts/bootstrap.sh installs it):\n" + r.err;
}

tandem::v1::GenerateRequest Request() {
  tandem::v1::GenerateRequest req;
  req.set_text("The capital of France is");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stop()->set_max_tokens(8);
  return req;
}

struct Outcome {
  grpc::Status status;
  int num_tokens = 0;
  bool finished = false;
};

Outcome Generate(const std::shared_ptr<grpc::Channel>& channel, const std::string& key = "",
                 const std::string& authorization = "") {
  auto stub = tandem::v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  Outcome o;
  auto reader = stub->Generate(&ctx, Request());
  tandem::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    o.num_tokens += resp.token_ids_size();
    o.finished |= resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED;
  }
  o.status = reader->Finish();
  return o;
}

// grpc.health.v1.Health/Check for the whole server, without the health
// protos: SERVING is `08 01`.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, bool* serving) {
  static const grpc::internal::RpcMethod kMethod("/grpc.health.v1.Health/Check",
                                                 grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), kMethod, &ctx, request, &response);
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (s.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  *serving = bytes == std::string("\x08\x01", 2);
  return s;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir_template[] = "/tmp/tandem_security_XXXXXX";
    dir_ = new std::string(mkdtemp(dir_template));
    pki_error_ = new std::string(MakePki(*dir_));
  }
  static void TearDownTestSuite() {
    RunProcess({"/bin/rm", "-rf", *dir_});
    delete dir_;
    delete pki_error_;
  }
  void SetUp() override { ASSERT_EQ(*pki_error_, "") << *pki_error_; }

  static std::string P(const std::string& name) { return *dir_ + "/" + name; }
  // Channel credentials from files (empty name = not set).
  static std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address,
                                                   const std::string& ca, const std::string& cert,
                                                   const std::string& key) {
    grpc::SslCredentialsOptions o;
    if (!ca.empty()) o.pem_root_certs = ReadFile(P(ca));
    if (!cert.empty()) o.pem_cert_chain = ReadFile(P(cert));
    if (!key.empty()) o.pem_private_key = ReadFile(P(key));
    return grpc::CreateChannel(address, grpc::SslCredentials(o));
  }
  static std::shared_ptr<grpc::Channel> MtlsChannel(const std::string& address) {
    return TlsChannel(address, "ca.crt", "client.crt", "client.key");
  }
  std::vector<std::string> TlsFlags() const {
    return {"--tls-cert", P("node.crt"), "--tls-key", P("node.key"), "--tls-ca", P("ca.crt")};
  }

  static std::string* dir_;
  static std::string* pki_error_;
};
std::string* SecurityTest::dir_ = nullptr;
std::string* SecurityTest::pki_error_ = nullptr;

TEST_F(SecurityTest, MtlsClusterServesOnlyClientsWithACertificate) {
  ServeProcess cluster;
  std::vector<std::string> args = TlsFlags();
  args.insert(args.end(), {"--prefill-workers", "1", "--decode-workers", "1"});
  // Ready = both workers registered over mTLS and pass the router's mTLS polls.
  const std::string err = cluster.Start(args);
  ASSERT_EQ(err, "") << err;
  const std::string router = cluster.Address("router");
  EXPECT_NE(cluster.Log().find("security: mTLS"), std::string::npos) << cluster.Log();

  // With the CA and a client certificate: served, through prefill -> PushKv
  // (mTLS) -> decode.
  Outcome ok = Generate(MtlsChannel(router));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_code() << ": " << ok.status.error_message() << "\n"
                              << cluster.Log();
  EXPECT_GT(ok.num_tokens, 0);
  EXPECT_TRUE(ok.finished);
  // "localhost" is in the certificate too.
  const std::string port = router.substr(router.rfind(':') + 1);
  EXPECT_TRUE(Generate(MtlsChannel("localhost:" + port)).status.ok());

  // Plaintext, no client certificate, a certificate from another CA, and a
  // client that does not trust the server: all refused.
  struct Bad {
    std::string name;
    std::shared_ptr<grpc::Channel> channel;
  };
  const std::vector<Bad> bad = {
      {"plaintext", grpc::CreateChannel(router, grpc::InsecureChannelCredentials())},
      {"TLS without a client certificate", TlsChannel(router, "ca.crt", "", "")},
      {"client certificate of another CA",
       TlsChannel(router, "ca.crt", "rogue_client.crt", "rogue_client.key")},
      {"server not trusted", TlsChannel(router, "rogue_ca.crt", "client.crt", "client.key")},
  };
  for (const Bad& b : bad) {
    Outcome o = Generate(b.channel);
    EXPECT_FALSE(o.status.ok()) << b.name;
    EXPECT_EQ(o.num_tokens, 0) << b.name;
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << b.name << ": " << o.status.error_message();
  }

  // The workers' own ports: closed to a plaintext peer, open over mTLS.
  for (const std::string role : {"prefill", "decode"}) {
    const std::string address = cluster.Address(role);
    ASSERT_FALSE(address.empty()) << role;
    auto stats = [&](const std::shared_ptr<grpc::Channel>& channel, tandem::v1::WorkerStats* s) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      if (role == "prefill") {
        return tandem::v1::PrefillWorker::NewStub(channel)->GetStats(&ctx, {}, s);
      }
      return tandem::v1::DecodeWorker::NewStub(channel)->GetStats(&ctx, {}, s);
    };
    tandem::v1::WorkerStats s;
    EXPECT_FALSE(stats(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), &s).ok())
        << role << " answered a plaintext peer";
    EXPECT_FALSE(stats(TlsChannel(address, "ca.crt", "", ""), &s).ok())
        << role << " answered a peer without a client certificate";
    const grpc::Status st = stats(MtlsChannel(address), &s);
    ASSERT_TRUE(st.ok()) << role << ": " << st.error_message();
    EXPECT_EQ(s.num_leases(), 0) << role;
    EXPECT_EQ(s.role(), role);
  }

  // The CLI clients with the same files.
  ProcessResult client = RunProcess({TandemBinary(), "client", "--server", router, "--prompt",
                                     "Hello", "--max-tokens", "4", "--tls-ca", P("ca.crt"),
                                     "--tls-cert", P("client.crt"), "--tls-key", P("client.key")});
  EXPECT_EQ(client.exit_code, 0) << client.err;
  EXPECT_FALSE(client.out.empty());
  ProcessResult plain = RunProcess({TandemBinary(), "client", "--server", router, "--prompt",
                                    "Hello", "--max-tokens", "4", "--timeout-ms", "5000"});
  EXPECT_EQ(plain.exit_code, 1) << plain.err;
  ProcessResult bench = RunProcess(
      {TandemBinary(),  "bench",     "--server",      router,     "--num-requests", "2",
       "--concurrency", "1",         "--input-len",   "8",        "--output-len",   "4",
       "--timeout-s",   "60",        "--no-progress", "--tls-ca", P("ca.crt"),      "--tls-cert",
       P("client.crt"), "--tls-key", P("client.key")});
  EXPECT_EQ(bench.exit_code, 0) << bench.err;

  EXPECT_EQ(cluster.Stop(), 0) << cluster.Log();
}

// Server-only TLS (no --tls-ca): clients need no certificate; the processes
// verify each other against gRPC's default roots, here the test CA through
// GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (docs/security.md).
TEST_F(SecurityTest, ServerOnlyTlsServesClientsWithoutACertificate) {
  setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", P("ca.crt").c_str(), 1);
  ServeProcess cluster;
  const std::string err = cluster.Start({"--tls-cert", P("node.crt"), "--tls-key", P("node.key")});
  unsetenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH");
  ASSERT_EQ(err, "") << err;
  const std::string router = cluster.Address("router");
  EXPECT_NE(cluster.Log().find("security: TLS"), std::string::npos) << cluster.Log();
  Outcome ok = Generate(TlsChannel(router, "ca.crt", "", ""));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message() << "\n" << cluster.Log();
  EXPECT_GT(ok.num_tokens, 0);
  Outcome plain = Generate(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  Outcome untrusted = Generate(TlsChannel(router, "rogue_ca.crt", "", ""));
  EXPECT_EQ(untrusted.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ProcessResult client = RunProcess({TandemBinary(), "client", "--server", router, "--prompt",
                                     "Hello", "--max-tokens", "4", "--tls-ca", P("ca.crt")});
  EXPECT_EQ(client.exit_code, 0) << client.err;
  EXPECT_EQ(cluster.Stop(), 0) << cluster.Log();
}

TEST_F(SecurityTest, ApiKeyIsRequiredForGenerationButNotForHealth) {
  const std::string keys = P("keys.txt");
  WriteFile(keys,
            "# Tandem API keys\n\n  key-one-0123456789  \n# retired: old-key\nkey-two-abcdef\n");
  ServeProcess cluster;
  const std::string err = cluster.Start({"--colocated", "--api-key-file", keys});
  ASSERT_EQ(err, "") << err;
  const std::string router = cluster.Address("router");
  auto channel = grpc::CreateChannel(router, grpc::InsecureChannelCredentials());

  Outcome none = Generate(channel);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << none.status.error_message();
  EXPECT_NE(none.status.error_message().find("missing API key"), std::string::npos)
      << none.status.error_message();
  EXPECT_EQ(none.num_tokens, 0);

  Outcome wrong = Generate(channel, "key-one-012345678");  // a prefix of a key
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(wrong.status.error_message().find("invalid API key"), std::string::npos)
      << wrong.status.error_message();
  Outcome longer = Generate(channel, "key-one-01234567890");
  EXPECT_EQ(longer.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  Outcome commented = Generate(channel, "old-key");
  EXPECT_EQ(commented.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  Outcome basic = Generate(channel, "", "Basic a2V5LW9uZS0wMTIzNDU2Nzg5");
  EXPECT_EQ(basic.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(basic.status.error_message().find("Bearer"), std::string::npos);

  for (const std::string key : {"key-one-0123456789", "key-two-abcdef"}) {
    Outcome ok = Generate(channel, key);
    EXPECT_TRUE(ok.status.ok()) << key << ": " << ok.status.error_message();
    EXPECT_GT(ok.num_tokens, 0) << key;
  }
  // The scheme is case-insensitive (RFC 7235).
  EXPECT_TRUE(Generate(channel, "", "bearer key-two-abcdef").status.ok());

  // Every Generation RPC, not only Generate.
  auto stub = tandem::v1::Generation::NewStub(channel);
  {
    grpc::ClientContext ctx;
    tandem::v1::ModelInfo info;
    EXPECT_EQ(stub->GetModelInfo(&ctx, {}, &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer key-two-abcdef");
    tandem::v1::ModelInfo info;
    EXPECT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_GT(info.vocab_size(), 0);
  }
  {
    grpc::ClientContext ctx;
    tandem::v1::TokenizeRequest req;
    req.set_text("hello");
    tandem::v1::TokenizeResponse resp;
    EXPECT_EQ(stub->Tokenize(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }

  // Health stays open.
  bool serving = false;
  const grpc::Status health = HealthCheck(channel, &serving);
  EXPECT_TRUE(health.ok()) << health.error_message();
  EXPECT_TRUE(serving);

  // Rejections are counted: tandem_request_errors_total{code="UNAUTHENTICATED"}.
  std::string metrics_address;
  for (const Endpoint& e : cluster.endpoints()) {
    if (e.role == "router") metrics_address = e.metrics_address;
  }
  const int metrics_port = std::stoi(metrics_address.substr(metrics_address.rfind(':') + 1));
  const std::string text = HttpGetBody(metrics_port, "/metrics");
  bool counted = false;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("tandem_request_errors_total{", 0) == 0 &&
        line.find("code=\"UNAUTHENTICATED\"") != std::string::npos) {
      counted = std::stod(line.substr(line.rfind(' ') + 1)) >= 7;
    }
  }
  EXPECT_TRUE(counted) << text;

  // `tandem client`: the key from $TANDEM_API_KEY or --api-key.
  const std::vector<std::string> client = {TandemBinary(), "client", "--server",     router,
                                           "--prompt",     "Hello",  "--max-tokens", "4"};
  ProcessResult no_key = RunProcess(client);
  EXPECT_EQ(no_key.exit_code, 1);
  EXPECT_NE(no_key.err.find("missing API key"), std::string::npos) << no_key.err;
  ProcessResult env_key = RunProcess(client, {"TANDEM_API_KEY=key-one-0123456789"});
  EXPECT_EQ(env_key.exit_code, 0) << env_key.err;
  std::vector<std::string> with_flag = client;
  with_flag.insert(with_flag.end(), {"--api-key", "key-two-abcdef"});
  ProcessResult flag_key = RunProcess(with_flag, {"TANDEM_API_KEY=wrong"});  // the flag wins
  EXPECT_EQ(flag_key.exit_code, 0) << flag_key.err;
  ProcessResult wrong_env = RunProcess(client, {"TANDEM_API_KEY=wrong"});
  EXPECT_EQ(wrong_env.exit_code, 1);
  EXPECT_NE(wrong_env.err.find("invalid API key"), std::string::npos) << wrong_env.err;

  EXPECT_EQ(cluster.Stop(), 0) << cluster.Log();
}

TEST_F(SecurityTest, BadFlagInputsExitWithAClearMessage) {
  WriteFile(P("empty.pem"), "");
  WriteFile(P("empty_keys.txt"), "# nothing but comments\n\n   \n");
  struct Case {
    std::vector<std::string> args;
    std::string message;  // must appear on stderr
  };
  const std::string missing = P("missing.pem");
  const std::vector<Case> cases = {
      {{"serve", "--tls-cert", missing, "--tls-key", P("node.key")}, "--tls-cert " + missing},
      {{"serve", "--tls-cert", missing, "--tls-key", P("node.key")}, "no such file"},
      {{"serve", "--tls-key", P("node.key")}, "--tls-key needs --tls-cert"},
      {{"serve", "--tls-cert", P("node.crt")}, "--tls-cert needs --tls-key"},
      {{"router", "--tls-ca", P("ca.crt")}, "--tls-ca needs --tls-cert and --tls-key"},
      {{"router", "--tls-cert", P("node.crt"), "--tls-key", P("client.key")},
       "does not match the certificate"},
      {{"prefill", "--tls-cert", P("node.key"), "--tls-key", P("node.key")}, "no PEM certificate"},
      {{"decode", "--tls-cert", P("node.crt"), "--tls-key", P("empty.pem")}, "empty"},
      {{"decode", "--tls-cert", P("node.crt"), "--tls-key", P("node.key"), "--tls-ca",
        P("node.ext")},
       "not PEM"},
      {{"serve", "--api-key-file", P("empty_keys.txt")}, "no key"},
      {{"router", "--api-key-file", missing}, "--api-key-file " + missing},
      {{"client", "--prompt", "x", "--tls-ca", missing}, "--tls-ca " + missing},
      {{"client", "--prompt", "x", "--tls-ca", P("ca.crt"), "--tls-cert", P("client.crt")},
       "--tls-cert needs --tls-key"},
      {{"bench", "--tls-ca", missing}, "--tls-ca " + missing},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {TandemBinary()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    // The checks run before any model is loaded: fast.
    const auto start = std::chrono::steady_clock::now();
    ProcessResult r = RunProcess(argv);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string joined;
    for (const std::string& a : c.args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;  // a usage error, not a crash
    EXPECT_NE(r.err.find(c.message), std::string::npos) << joined << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << ": " << r.err;
    EXPECT_LT(seconds, 10) << joined;
  }
}

}  // namespace
}  // namespace tandem::testing
