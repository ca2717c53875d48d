// The cluster as users run it: `tandem serve` (router + prefill + decode
// processes on loopback) and `tandem serve --colocated`, driven over gRPC.
//  - 32 concurrent streaming requests through router -> prefill -> decode all
//    complete, with tokens bit-identical to --colocated and to
//    `tandem generate --json` for the same seeds;
//  - a client that cancels mid-stream leaves zero KV blocks in use on every
//    worker (their GetStats);
//  - a deadline mid-generation ends with finish_reason DEADLINE and status OK.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_util.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"

namespace tandem::testing {
namespace {

constexpr int kNumRequests = 32;
constexpr int kMaxTokens = 20;
const char* const kPrompts[] = {
    "The capital of France is",     "Once upon a time",    "def fibonacci(n):",
    "The three primary colors are", "Water boils at",      "My favourite animal is",
    "In 1969, the first man on",    "The quick brown fox",
};

struct Spec {
  std::string prompt;
  uint64_t seed;
};
std::vector<Spec> Specs() {
  std::vector<Spec> out;
  for (int i = 0; i < kNumRequests; ++i) out.push_back({kPrompts[i % 8], 1000u + i});
  return out;
}

tandem::v1::GenerateRequest MakeRequest(const Spec& s) {
  tandem::v1::GenerateRequest req;
  req.set_text(s.prompt);
  req.mutable_sampling()->set_temperature(0.8);
  req.mutable_sampling()->set_seed(s.seed);
  req.mutable_stop()->set_max_tokens(kMaxTokens);
  return req;
}

bool IsValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

struct Result {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;               // the concatenated deltas
  bool deltas_valid_utf8 = true;  // every delta on its own
  tandem::v1::FinishReason reason = tandem::v1::FINISH_REASON_UNSPECIFIED;
  int num_messages = 0;
};

Result Stream(tandem::v1::Generation::Stub& stub, const tandem::v1::GenerateRequest& req,
              int deadline_ms = 120000, int cancel_after = 0) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  Result r;
  auto reader = stub.Generate(&ctx, req);
  tandem::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    ++r.num_messages;
    r.tokens.insert(r.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    r.text += resp.text();
    r.deltas_valid_utf8 &= IsValidUtf8(resp.text());
    if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED)
      r.reason = resp.finish_reason();
    if (cancel_after > 0 && static_cast<int>(r.tokens.size()) >= cancel_after) ctx.TryCancel();
  }
  r.status = reader->Finish();
  return r;
}

std::vector<Result> RunConcurrently(const std::string& address) {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const std::vector<Spec> specs = Specs();
  std::vector<Result> results(specs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = Stream(*stub, MakeRequest(specs[i])); });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Every worker's KV back to zero (blocks used, leases), within a few seconds.
void ExpectNoKvInUse(const ServeProcess& cluster) {
  for (const Endpoint& e : cluster.endpoints()) {
    if (e.role == "router") continue;
    auto channel = grpc::CreateChannel(e.grpc_address, grpc::InsecureChannelCredentials());
    tandem::v1::WorkerStats stats;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    bool clean = false;
    while (!clean && std::chrono::steady_clock::now() < give_up) {
      grpc::ClientContext ctx;
      grpc::Status s;
      if (e.role == "prefill") {
        s = tandem::v1::PrefillWorker::NewStub(channel)->GetStats(&ctx, {}, &stats);
      } else {
        s = tandem::v1::DecodeWorker::NewStub(channel)->GetStats(&ctx, {}, &stats);
      }
      ASSERT_TRUE(s.ok()) << e.role << ": " << s.error_message();
      clean = stats.num_blocks_used() == 0 && stats.num_leases() == 0 &&
              stats.num_leased_blocks() == 0 && stats.num_running() == 0;
      if (!clean) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(clean) << e.role << " " << e.grpc_address << ": blocks used "
                       << stats.num_blocks_used() << ", leases " << stats.num_leases()
                       << ", leased blocks " << stats.num_leased_blocks() << ", running "
                       << stats.num_running();
  }
}

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new ServeProcess();
    const std::string err = cluster_->Start({"--prefill-workers", "1", "--decode-workers", "1"});
    if (!err.empty()) {
      start_error_ = new std::string(err);
    }
  }
  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      const int code = cluster_->Stop();
      EXPECT_EQ(code, 0) << cluster_->Log();
      // Children were reaped: no worker pid is left.
      for (const Endpoint& e : cluster_->endpoints()) {
        EXPECT_NE(kill(e.pid, 0) == 0 && e.role != "router", true) << e.role << " still alive";
      }
    }
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(start_error_, nullptr) << *start_error_; }
  static ServeProcess* cluster_;
  static std::string* start_error_;
};
ServeProcess* ClusterTest::cluster_ = nullptr;
std::string* ClusterTest::start_error_ = nullptr;

TEST_F(ClusterTest, EndpointsFileListsEveryService) {
  ASSERT_EQ(cluster_->endpoints().size(), 3u);
  EXPECT_EQ(cluster_->endpoints()[0].role, "router");
  EXPECT_FALSE(cluster_->Address("prefill").empty());
  EXPECT_FALSE(cluster_->Address("decode").empty());
  for (const auto& e : cluster_->endpoints()) {
    EXPECT_GT(e.pid, 0);
    EXPECT_FALSE(e.metrics_address.empty());
  }
}

TEST_F(ClusterTest, ThirtyTwoConcurrentStreamsMatchColocatedAndGenerate) {
  std::vector<Result> disagg = RunConcurrently(cluster_->Address("router"));
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(disagg[i].status.ok()) << i << ": " << disagg[i].status.error_message();
    EXPECT_NE(disagg[i].reason, tandem::v1::FINISH_REASON_UNSPECIFIED) << i;
    EXPECT_FALSE(disagg[i].tokens.empty()) << i;
    EXPECT_GE(disagg[i].num_messages, 2) << i;  // streamed, then the final message
  }
  ExpectNoKvInUse(*cluster_);

  // The same requests on a colocated server.
  ServeProcess colocated;
  const std::string err = colocated.Start({"--colocated"});
  ASSERT_EQ(err, "") << err;
  std::vector<Result> coloc = RunConcurrently(colocated.Address("router"));
  EXPECT_EQ(colocated.Stop(), 0);

  // And `tandem generate` on a prompts file with the same seeds.
  const std::string prompts = cluster_->dir() + "/prompts.jsonl";
  {
    std::ofstream f(prompts);
    for (const Spec& s : Specs()) {
      f << "{\"prompt\": \"" << s.prompt << "\", \"seed\": " << s.seed << "}\n";
    }
  }
  std::vector<std::string> gen_args = {TandemBinary(),
                                       "generate",
                                       "--prompts-file",
                                       prompts,
                                       "--json",
                                       "--temperature",
                                       "0.8",
                                       "--max-tokens",
                                       std::to_string(kMaxTokens),
                                       "--concurrency",
                                       "32"};
  for (const std::string& a : DeviceArgs()) gen_args.push_back(a);
  ProcessResult gen = RunProcess(gen_args);
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  std::vector<std::vector<int32_t>> generated;
  std::vector<std::string> generated_text;
  std::stringstream lines(gen.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    Json j = Json::Parse(line);
    generated.push_back(j["token_ids"].ints());
    generated_text.push_back(j["text"].str);
  }
  ASSERT_EQ(generated.size(), static_cast<size_t>(kNumRequests));
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(coloc[i].status.ok()) << coloc[i].status.error_message();
    EXPECT_EQ(disagg[i].tokens, coloc[i].tokens)
        << "request " << i << " disaggregated vs colocated";
    EXPECT_EQ(disagg[i].tokens, generated[i]) << "request " << i << " vs tandem generate";
    // Text deltas: whole code points on both sides of the prefill -> decode
    // boundary, and the same text as the other two paths.
    EXPECT_TRUE(disagg[i].deltas_valid_utf8) << "request " << i;
    EXPECT_EQ(disagg[i].text, coloc[i].text) << "request " << i;
    EXPECT_EQ(disagg[i].text, generated_text[i]) << "request " << i;
  }
}

TEST_F(ClusterTest, CancelMidStreamLeavesNoKvOnAnyWorker) {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(cluster_->Address("router"), grpc::InsecureChannelCredentials()));
  tandem::v1::GenerateRequest req = MakeRequest({"Tell me a long story about", 5});
  req.mutable_stop()->set_max_tokens(2000);
  req.mutable_stop()->set_ignore_eos(true);
  std::vector<std::thread> threads;
  std::vector<Result> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = Stream(*stub, req, 120000, /*cancel_after=*/3 + i); });
  }
  for (auto& t : threads) t.join();
  for (const Result& r : results) {
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED) << r.status.error_message();
  }
  ExpectNoKvInUse(*cluster_);
  // Still serving.
  Result ok = Stream(*stub, MakeRequest({"Hello", 1}));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST_F(ClusterTest, DeadlineMidGenerationFinishesWithReasonDeadline) {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(cluster_->Address("router"), grpc::InsecureChannelCredentials()));
  tandem::v1::GenerateRequest req = MakeRequest({"Tell me a long story about", 9});
  req.mutable_stop()->set_max_tokens(4000);
  req.mutable_stop()->set_ignore_eos(true);
  Result r = Stream(*stub, req, /*deadline_ms=*/1500);
  EXPECT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
  EXPECT_EQ(r.reason, tandem::v1::FINISH_REASON_DEADLINE);
  EXPECT_GT(r.tokens.size(), 0u);
  EXPECT_LT(r.tokens.size(), 4000u);
  ExpectNoKvInUse(*cluster_);
}

// The device the cluster's engines run on: $TANDEM_TEST_DEVICE (DeviceArgs),
// else the CPU.
std::string TestDevice() {
  const std::vector<std::string> args = DeviceArgs();
  return args.empty() ? "cpu" : args.back();
}

// A KV dtype to pass through `tandem serve`: int8 on the CPU (not its
// default f16, so a worker that dropped the flag would show); f32 on CUDA,
// the only dtype its executor holds.
std::string PassThroughKvDtype(const std::string& device) {
  return device == "cuda" ? "f32" : "int8";
}

// `tandem serve --kv-cache-dtype D` passes the dtype to its workers: both
// advertise it in their KV compatibility, the handoff carries D bytes, and
// the streams equal `tandem generate --kv-cache-dtype D` on the same device
// (D: PassThroughKvDtype). On CUDA the token comparison needs
// TANDEM_BATCH_INVARIANT=1 (a different batch mix changes the GEMM path's
// rounding otherwise), as ThirtyTwoConcurrentStreams does there.
TEST(ClusterKvDtypeTest, ServePassesTheKvDtypeToItsWorkers) {
  const std::string device = TestDevice();
  const std::string dtype = PassThroughKvDtype(device);
  ServeProcess cluster;
  const std::string err =
      cluster.Start({"--prefill-workers", "1", "--decode-workers", "1", "--kv-cache-dtype", dtype});
  ASSERT_EQ(err, "") << err;
  for (const Endpoint& e : cluster.endpoints()) {
    if (e.role == "router") continue;
    auto channel = grpc::CreateChannel(e.grpc_address, grpc::InsecureChannelCredentials());
    tandem::v1::WorkerStats stats;
    grpc::ClientContext ctx;
    const grpc::Status st =
        e.role == "prefill"
            ? tandem::v1::PrefillWorker::NewStub(channel)->GetStats(&ctx, {}, &stats)
            : tandem::v1::DecodeWorker::NewStub(channel)->GetStats(&ctx, {}, &stats);
    ASSERT_TRUE(st.ok()) << e.role << ": " << st.error_message();
    EXPECT_EQ(stats.compat().kv_dtype(), dtype) << e.role;
  }
  std::vector<Result> disagg = RunConcurrently(cluster.Address("router"));
  ExpectNoKvInUse(cluster);
  EXPECT_EQ(cluster.Stop(), 0) << cluster.Log();
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(disagg[i].status.ok()) << i << ": " << disagg[i].status.error_message();
    EXPECT_FALSE(disagg[i].tokens.empty()) << i;
  }
  const char* invariant = std::getenv("TANDEM_BATCH_INVARIANT");
  if (device == "cuda" && (invariant == nullptr || std::string(invariant) != "1")) {
    GTEST_SKIP() << "cuda without TANDEM_BATCH_INVARIANT=1: tokens not compared with generate";
  }
  const std::string prompts = cluster.dir() + "/prompts.jsonl";
  {
    std::ofstream f(prompts);
    for (const Spec& sp : Specs()) {
      f << "{\"prompt\": \"" << sp.prompt << "\", \"seed\": " << sp.seed << "}\n";
    }
  }
  std::vector<std::string> gen_args = {TandemBinary(), "generate", "--prompts-file", prompts};
  for (const std::string& a :
       {std::string("--json"), std::string("--temperature"), std::string("0.8"),
        std::string("--max-tokens"), std::to_string(kMaxTokens), std::string("--concurrency"),
        std::string("32"), std::string("--kv-cache-dtype"), dtype}) {
    gen_args.push_back(a);
  }
  for (const std::string& a : DeviceArgs()) gen_args.push_back(a);
  ProcessResult gen = RunProcess(gen_args);
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  std::stringstream lines(gen.out);
  int i = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    ASSERT_LT(i, kNumRequests);
    EXPECT_EQ(disagg[i].tokens, Json::Parse(line)["token_ids"].ints()) << "request " << i;
    ++i;
  }
  EXPECT_EQ(i, kNumRequests);
}

// A KV dtype the device's executor does not hold (on CUDA: int8 and fp8),
// or no dtype at all, is refused by `tandem serve` before it starts a
// worker: one line naming --kv-cache-dtype, exit 2.
TEST(ClusterKvDtypeTest, ServeRefusesAKvDtypeTheDeviceLacks) {
  const std::string device = TestDevice();
  std::vector<std::pair<std::string, std::string>> cases = {
      {"int3", "tandem serve: --kv-cache-dtype: unknown dtype 'int3' ("}};
  if (device == "cuda") {
    for (const char* d : {"int8", "fp8"}) {
      cases.push_back({d, std::string("tandem serve: --kv-cache-dtype ") + d +
                              ": the CUDA executor holds f32, f16 or bf16 KV caches only (use "
                              "--kv-cache-dtype f32|f16|bf16 with --device cuda)\n"});
    }
  }
  for (const auto& [dtype, want] : cases) {
    std::vector<std::string> argv = {TandemBinary(), "serve", "--port",           "0",
                                     "--http-port",  "0",     "--kv-cache-dtype", dtype};
    for (const std::string& a : DeviceArgs()) argv.push_back(a);
    ProcessResult r = RunProcess(argv);
    EXPECT_EQ(r.exit_code, 2) << dtype << ": " << r.err;
    EXPECT_EQ(r.err.rfind(want, 0), 0u) << dtype << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << dtype << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << dtype;
  }
}

}  // namespace
}  // namespace tandem::testing
