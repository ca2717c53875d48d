// In-process router tests on port 0: the bad-input table (every malformed
// request gets its documented status and the server keeps serving),
// admission (RESOURCE_EXHAUSTED when full, UNAVAILABLE without workers),
// deadline and cancellation on a colocated engine.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "services/common/convert.h"
#include "services/router/router_server.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.pb.h"
#include "tests/util/test_paths.h"

namespace tandem::router {
namespace {

using tandem::v1::GenerateRequest;
using tandem::v1::GenerateResponse;

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> token_ids;
  tandem::v1::FinishReason finish_reason = tandem::v1::FINISH_REASON_UNSPECIFIED;
  tandem::v1::Usage usage;
};

StreamResult Call(tandem::v1::Generation::Stub& stub, const GenerateRequest& req,
                  absl::Duration timeout = absl::Seconds(60)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  StreamResult r;
  auto reader = stub.Generate(&ctx, req);
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    r.token_ids.insert(r.token_ids.end(), resp.token_ids().begin(), resp.token_ids().end());
    if (resp.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      r.finish_reason = resp.finish_reason();
      r.usage = resp.usage();
    }
  }
  r.status = reader->Finish();
  return r;
}

GenerateRequest Good() {
  GenerateRequest req;
  req.set_text("The capital of France is");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stop()->set_max_tokens(4);
  return req;
}

RouterServer::Options BaseOptions(const engine::Engine& eng) {
  RouterServer::Options o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.tokenizer = eng.tokenizer();
  const auto& config = eng.model().config();
  o.limits = {static_cast<int32_t>(config.context_length), static_cast<int32_t>(config.vocab_size),
              static_cast<int32_t>(config.context_length - 1)};
  o.model_shape = {config.num_layers, config.num_kv_heads, config.head_dim};
  o.model_name = "test";
  return o;
}

class RouterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine::EngineConfig config;
    config.model_path = testing::DefaultModelPath();
    config.kv_cache_memory_bytes = 256 << 20;
    auto eng = engine::Engine::Create(config);
    ASSERT_TRUE(eng.ok()) << eng.status();
    engine_ = std::move(eng).value().release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    RouterServer::Options o = BaseOptions(*engine_);
    o.local_engine = engine_;
    auto server = RouterServer::Start(std::move(o));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = tandem::v1::Generation::NewStub(channel_);
  }

  static engine::Engine* engine_;
  std::unique_ptr<RouterServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::Generation::Stub> stub_;
};
engine::Engine* RouterTest::engine_ = nullptr;

struct BadCase {
  std::string name;
  std::function<void(GenerateRequest*)> mutate;
  grpc::StatusCode code;
  std::string field;  // must appear in the error message
};

TEST_F(RouterTest, BadInputTableGetsDocumentedCodesAndServerKeepsServing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  const std::vector<BadCase> cases = {
      {"empty text", [](GenerateRequest* r) { r->set_text(""); }, kInvalid, "text"},
      {"no prompt", [](GenerateRequest* r) { r->clear_prompt(); }, kInvalid, "prompt"},
      {"empty token ids", [](GenerateRequest* r) { r->mutable_token_ids(); }, kInvalid,
       "token_ids"},
      {"token id >= vocab", [](GenerateRequest* r) { r->mutable_token_ids()->add_ids(49152); },
       kInvalid, "token_ids.ids[0]"},
      {"negative token id", [](GenerateRequest* r) { r->mutable_token_ids()->add_ids(-1); },
       kInvalid, "token_ids.ids[0]"},
      {"prompt over context",
       [](GenerateRequest* r) {
         for (int i = 0; i < 8192; ++i) r->mutable_token_ids()->add_ids(100);
       },
       kInvalid, "context length"},
      {"max_tokens 0", [](GenerateRequest* r) { r->mutable_stop()->set_max_tokens(0); }, kInvalid,
       "stop.max_tokens"},
      {"max_tokens huge", [](GenerateRequest* r) { r->mutable_stop()->set_max_tokens(1 << 30); },
       kInvalid, "stop.max_tokens"},
      {"prompt + max_tokens over context",
       [](GenerateRequest* r) {
         for (int i = 0; i < 8000; ++i) r->mutable_token_ids()->add_ids(100);
         r->mutable_stop()->set_max_tokens(500);
       },
       kInvalid, "stop.max_tokens"},
      {"negative temperature",
       [](GenerateRequest* r) { r->mutable_sampling()->set_temperature(-0.5); }, kInvalid,
       "sampling.temperature"},
      {"NaN temperature",
       [nan](GenerateRequest* r) { r->mutable_sampling()->set_temperature(nan); }, kInvalid,
       "sampling.temperature"},
      {"temperature > 100", [](GenerateRequest* r) { r->mutable_sampling()->set_temperature(101); },
       kInvalid, "sampling.temperature"},
      {"top_p > 1", [](GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5); }, kInvalid,
       "sampling.top_p"},
      {"top_p 0", [](GenerateRequest* r) { r->mutable_sampling()->set_top_p(0); }, kInvalid,
       "sampling.top_p"},
      {"top_k < 0", [](GenerateRequest* r) { r->mutable_sampling()->set_top_k(-1); }, kInvalid,
       "sampling.top_k"},
      {"speculative tokens > 16",
       [](GenerateRequest* r) { r->mutable_speculative()->set_num_speculative_tokens(17); },
       kInvalid, "speculative.num_speculative_tokens"},
      {"speculative tokens < 0",
       [](GenerateRequest* r) { r->mutable_speculative()->set_num_speculative_tokens(-1); },
       kInvalid, "speculative.num_speculative_tokens"},
      {"min_p > 1", [](GenerateRequest* r) { r->mutable_sampling()->set_min_p(2); }, kInvalid,
       "sampling.min_p"},
      {"repetition_penalty 0",
       [](GenerateRequest* r) { r->mutable_sampling()->set_repetition_penalty(0); }, kInvalid,
       "sampling.repetition_penalty"},
      {"presence_penalty 3",
       [](GenerateRequest* r) { r->mutable_sampling()->set_presence_penalty(3); }, kInvalid,
       "sampling.presence_penalty"},
      {"logit_bias id out of vocab",
       [](GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[60000] = 1; },
       kInvalid, "sampling.logit_bias"},
      {"logit_bias value 200",
       [](GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[5] = 200; },
       kInvalid, "sampling.logit_bias"},
      {"17 stop strings",
       [](GenerateRequest* r) {
         for (int i = 0; i < 17; ++i) r->mutable_stop()->add_stop("x");
       },
       kInvalid, "stop.stop"},
      {"stop string too long",
       [](GenerateRequest* r) { r->mutable_stop()->add_stop(std::string(300, 'a')); }, kInvalid,
       "stop.stop[0]"},
      {"stop token id out of range",
       [](GenerateRequest* r) { r->mutable_stop()->add_stop_token_ids(1 << 20); }, kInvalid,
       "stop.stop_token_ids"},
      {"65 stop token ids",
       [](GenerateRequest* r) {
         for (int i = 0; i < 65; ++i) r->mutable_stop()->add_stop_token_ids(i);
       },
       kInvalid, "stop.stop_token_ids"},
      {"min_tokens > max_tokens", [](GenerateRequest* r) { r->mutable_stop()->set_min_tokens(10); },
       kInvalid, "stop.min_tokens"},
      {"top_logprobs 21", [](GenerateRequest* r) { r->mutable_logprobs()->set_top_logprobs(21); },
       kInvalid, "logprobs.top_logprobs"},
      {"request_id too long", [](GenerateRequest* r) { r->set_request_id(std::string(200, 'r')); },
       kInvalid, "request_id"},
      {"cache_salt too long", [](GenerateRequest* r) { r->set_cache_salt(std::string(100, 's')); },
       kInvalid, "cache_salt"},
      {"empty chat role",
       [](GenerateRequest* r) { r->mutable_messages()->add_messages()->set_content("hi"); },
       kInvalid, "messages[0].role"},
      {"unknown chat role",
       [](GenerateRequest* r) {
         auto* m = r->mutable_messages()->add_messages();
         m->set_role("robot");
         m->set_content("hi");
       },
       kInvalid, "messages[0].role"},
      {"empty messages", [](GenerateRequest* r) { r->mutable_messages(); }, kInvalid, "messages"},
      {"unknown field (raw bytes)",
       [](GenerateRequest* r) {
         // Field 99, varint 1: unknown to this server; parsed, kept, and sent.
         std::string bytes = r->SerializeAsString() + std::string("\x98\x06\x01", 3);
         ASSERT_TRUE(r->ParseFromString(bytes));
       },
       kInvalid, "unknown field number 99"},
      {"unknown field in a nested message (raw bytes)",
       [](GenerateRequest* r) {
         std::string sampling = r->sampling().SerializeAsString() + std::string("\xa0\x1f\x05", 3);
         ASSERT_TRUE(r->mutable_sampling()->ParseFromString(sampling));
       },
       kInvalid, "sampling: unknown field number 500"},
  };
  ASSERT_GE(cases.size(), 15u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const BadCase& c = cases[i];
    GenerateRequest req = Good();  // setting another prompt kind replaces the oneof
    c.mutate(&req);
    StreamResult r = Call(*stub_, req);
    EXPECT_EQ(r.status.error_code(), c.code) << c.name << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.field), std::string::npos)
        << c.name << ": '" << r.status.error_message() << "' should name " << c.field;
    EXPECT_TRUE(r.token_ids.empty()) << c.name;
    if (i % 8 == 7) {  // still serving
      StreamResult ok = Call(*stub_, Good());
      EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
    }
  }
  StreamResult ok = Call(*stub_, Good());
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.token_ids.size(), 4u);
  EXPECT_EQ(ok.finish_reason, tandem::v1::FINISH_REASON_LENGTH);
}

// speculative.num_speculative_tokens reaches the engine (colocated) and the
// worker protocol (disaggregated: WorkerSamplingParams) and is honoured: 0
// turns a server's speculation off for the request, unset leaves it on.
TEST(RouterSpecTest, PerRequestSpeculationIsCarriedAndHonoured) {
  engine::SamplingParams p;
  tandem::v1::WorkerSamplingParams wire;
  services::ToProto(p, &wire);
  EXPECT_FALSE(wire.has_num_speculative_tokens());
  auto back = services::FromProto(wire, 1000);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->num_speculative_tokens.has_value());
  p.num_speculative_tokens = 0;
  services::ToProto(p, &wire);
  ASSERT_TRUE(wire.has_num_speculative_tokens());
  back = services::FromProto(wire, 1000);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->num_speculative_tokens, 0);
  wire.set_num_speculative_tokens(99);  // a bad worker message is refused too
  EXPECT_FALSE(services::FromProto(wire, 1000).ok());

  engine::EngineConfig config;
  config.model_path = testing::DefaultModelPath();
  config.kv_cache_memory_bytes = 64 << 20;
  config.spec.method = engine::SpecDecodeConfig::Method::kNgram;
  auto eng = engine::Engine::Create(config);
  ASSERT_TRUE(eng.ok()) << eng.status();
  RouterServer::Options o = BaseOptions(**eng);
  o.local_engine = eng->get();
  auto server = RouterServer::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = tandem::v1::Generation::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
  GenerateRequest req;
  req.set_text("Copy: red green blue red green blue red green blue red green blue red green");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stop()->set_max_tokens(24);
  req.mutable_stop()->set_ignore_eos(true);
  req.mutable_speculative()->set_num_speculative_tokens(0);
  StreamResult off = Call(*stub, req);
  ASSERT_TRUE(off.status.ok()) << off.status.error_message();
  EXPECT_EQ((*eng)->Stats().spec.num_drafts, 0);
  req.clear_speculative();
  StreamResult on = Call(*stub, req);
  ASSERT_TRUE(on.status.ok()) << on.status.error_message();
  EXPECT_GT((*eng)->Stats().spec.num_drafts, 0);
  EXPECT_EQ(off.token_ids, on.token_ids);  // greedy: the same tokens either way
  (*server)->Shutdown();
}

TEST_F(RouterTest, InvalidUtf8OnTheWireIsRejected) {
  // proto3 strings must be UTF-8, and this protobuf refuses to build such a
  // GenerateRequest on the client. So send another message with the same
  // wire shape: KvChunk's field 2 is `bytes`, GenerateRequest's is `text`.
  tandem::v1::KvChunk raw;
  raw.set_data(std::string("\xc3\x28 bad", 6));
  const grpc::internal::RpcMethod method("/tandem.v1.Generation/Generate",
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel_);
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<GenerateResponse>> reader(
      grpc::internal::ClientReaderFactory<GenerateResponse>::Create(channel_.get(), method, &ctx,
                                                                    raw));
  GenerateResponse resp;
  EXPECT_FALSE(reader->Read(&resp));
  grpc::Status s = reader->Finish();
  // gRPC rejects the request while parsing it, before the handler runs; the
  // router turns that INTERNAL into INVALID_ARGUMENT saying why (docs/api.md).
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("UTF-8"), std::string::npos) << s.error_message();
  std::fprintf(stderr, "invalid UTF-8 -> code %d '%s'\n", static_cast<int>(s.error_code()),
               s.error_message().c_str());
  EXPECT_TRUE(Call(*stub_, Good()).status.ok());
}

TEST_F(RouterTest, DefaultsAndRequestIdEcho) {
  GenerateRequest req;
  req.set_text("Hello");
  req.set_request_id("my-request");
  req.mutable_stop()->set_max_tokens(3);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  GenerateResponse resp;
  int n = 0;
  while (reader->Read(&resp)) {
    EXPECT_EQ(resp.request_id(), "my-request");
    ++n;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GE(n, 2);
  // Unset seed = FNV-1a of request_id: the same id gives the same tokens.
  StreamResult a = Call(*stub_, req), b = Call(*stub_, req);
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(DefaultSeed("my-request"), DefaultSeed("my-request"));
  EXPECT_NE(DefaultSeed("a"), DefaultSeed("b"));
}

TEST_F(RouterTest, TokenizeAndModelInfo) {
  tandem::v1::TokenizeRequest treq;
  treq.set_text("The capital of France is");
  tandem::v1::TokenizeResponse tresp;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub_->Tokenize(&c1, treq, &tresp).ok());
  EXPECT_EQ(std::vector<int32_t>(tresp.token_ids().begin(), tresp.token_ids().end()),
            (std::vector<int32_t>{504, 3575, 282, 4649, 314}));
  EXPECT_EQ(tresp.pieces_size(), 5);
  tandem::v1::ModelInfo info;
  grpc::ClientContext c2;
  ASSERT_TRUE(stub_->GetModelInfo(&c2, {}, &info).ok());
  EXPECT_EQ(info.context_length(), 8192);
  EXPECT_EQ(info.vocab_size(), 49152);
  EXPECT_FALSE(info.eos_token_ids().empty());
}

TEST_F(RouterTest, DeadlineMidGenerationEndsWithFinishReasonDeadline) {
  GenerateRequest req = Good();
  req.mutable_stop()->set_max_tokens(4000);
  req.mutable_stop()->set_ignore_eos(true);
  StreamResult r = Call(*stub_, req, absl::Milliseconds(700));
  EXPECT_TRUE(r.status.ok()) << r.status.error_code() << " " << r.status.error_message();
  EXPECT_EQ(r.finish_reason, tandem::v1::FINISH_REASON_DEADLINE);
  EXPECT_GT(r.token_ids.size(), 0u);
  EXPECT_LT(r.token_ids.size(), 4000u);
  EXPECT_EQ(r.usage.completion_tokens(), static_cast<int32_t>(r.token_ids.size()));
}

// Starts a 4000-token stream on `ctx` and reads until `min_tokens` tokens
// arrived (or the stream ended); *tokens is how many did.
std::unique_ptr<grpc::ClientReader<GenerateResponse>> StartLongStream(
    tandem::v1::Generation::Stub& stub, grpc::ClientContext* ctx, int min_tokens, int* tokens) {
  GenerateRequest req = Good();
  req.mutable_stop()->set_max_tokens(4000);
  req.mutable_stop()->set_ignore_eos(true);
  auto reader = stub.Generate(ctx, req);
  GenerateResponse resp;
  *tokens = 0;
  while (*tokens < min_tokens && reader->Read(&resp)) *tokens += resp.token_ids_size();
  return reader;
}

// Waits (at most 10 s) until the engine runs no request.
void WaitEngineIdle(engine::Engine& engine) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up && engine.Stats().num_running > 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST_F(RouterTest, ClientCancelFreesTheEngineKv) {
  grpc::ClientContext ctx;
  int tokens = 0;
  auto reader = StartLongStream(*stub_, &ctx, 5, &tokens);
  ctx.TryCancel();
  GenerateResponse resp;
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  WaitEngineIdle(*engine_);
  EXPECT_EQ(engine_->Stats().num_running, 0);
  EXPECT_EQ(engine_->Stats().num_waiting, 0);
}

// The engine outlives the router (tandem serve --colocated, these tests):
// a request the engine finishes after the router is gone must not touch the
// router's metrics (a use-after-free ASan saw once).
TEST_F(RouterTest, RouterDestroyedMidRequestLeavesTheSharedEngineWorking) {
  grpc::ClientContext ctx;
  int tokens = 0;
  auto reader = StartLongStream(*stub_, &ctx, 3, &tokens);
  ASSERT_GE(tokens, 3);
  // Keep the engine in long prefill steps, so that it applies the router's
  // cancel (and runs the request's finish callback) only after the router
  // is gone.
  engine::EngineRequest busy;
  for (int i = 0; i < 1024; ++i) busy.prompt_token_ids.push_back(10 + i % 1000);
  busy.params.stop.max_tokens = 1;
  auto busy_handle = engine_->Submit(std::move(busy));
  ASSERT_TRUE(busy_handle.ok()) << busy_handle.status();
  while (engine_->Stats().num_running < 2) absl::SleepFor(absl::Milliseconds(1));
  server_->Shutdown(absl::ZeroDuration());
  server_.reset();  // the router's metrics are gone; the engine request may still run
  GenerateResponse resp;
  while (reader->Read(&resp)) {
  }
  reader->Finish();
  // The long prompt finishes after the cancel was applied (at the end of
  // the step running when it came), so the cancelled request's finish
  // callback has run by then.
  std::optional<engine::EngineEvent> e;
  while ((e = (*busy_handle)->Next(absl::Seconds(300))).has_value() &&
         !std::holds_alternative<engine::FinishEvent>(*e)) {
  }
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(std::get<engine::FinishEvent>(*e).reason, engine::FinishReason::kLength);
  WaitEngineIdle(*engine_);
  EXPECT_EQ(engine_->Stats().num_running, 0);
}

// A backend whose calls run until cancelled.
class StuckBackend final : public Backend {
 public:
  class Call final : public BackendCall {
   public:
    Call(StuckBackend* owner, std::shared_ptr<CallQueue> q) : owner_(owner), queue_(std::move(q)) {}
    ~Call() override { Cancel(); }
    void Cancel() override {
      if (done_.exchange(true)) return;
      BackendEvent e;
      e.finished = true;
      e.finish_reason = tandem::v1::FINISH_REASON_CANCELLED;
      queue_->Push(std::move(e));
      absl::MutexLock lock(&owner_->mu);
      --owner_->running;
    }
    StuckBackend* owner_;
    std::shared_ptr<CallQueue> queue_;
    std::atomic<bool> done_{false};
  };
  absl::StatusOr<std::unique_ptr<BackendCall>> Start(const PreparedRequest&,
                                                     std::shared_ptr<CallQueue> q) override {
    absl::MutexLock lock(&mu);
    ++running;
    return std::make_unique<Call>(this, std::move(q));
  }
  bool Ready() const override { return true; }
  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
};

TEST_F(RouterTest, ResourceExhaustedWhenFull) {
  StuckBackend backend;
  RouterServer::Options o = BaseOptions(*engine_);
  o.backend_override = &backend;
  o.max_inflight = 2;
  auto server = RouterServer::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = tandem::v1::Generation::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1, c2;
  auto r1 = stub->Generate(&c1, Good());
  auto r2 = stub->Generate(&c2, Good());
  {
    absl::MutexLock lock(&backend.mu);
    auto two = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(backend.mu) { return backend.running == 2; };
    ASSERT_TRUE(backend.mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10)));
  }
  grpc::ClientContext c3;
  auto r3 = stub->Generate(&c3, Good());
  GenerateResponse resp;
  EXPECT_FALSE(r3->Read(&resp));
  grpc::Status s3 = r3->Finish();
  EXPECT_EQ(s3.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s3.error_message();
  EXPECT_NE(s3.error_message().find("retry"), std::string::npos);
  EXPECT_NE(s3.error_details().find("google.rpc.RetryInfo"), std::string::npos);
  EXPECT_EQ(c3.GetServerTrailingMetadata().count("retry-after-ms"), 1u);
  c1.TryCancel();
  c2.TryCancel();
  while (r1->Read(&resp)) {
  }
  while (r2->Read(&resp)) {
  }
  r1->Finish();
  r2->Finish();
  (*server)->Shutdown();
}

// Shutdown while deadline alarms fire: streams with deadlines 1 ms apart,
// the server shut down as soon as the first has ended with DEADLINE, so
// others' alarm callbacks run during and after gRPC's Shutdown (they run
// outside the call, after OnDone). When Shutdown returns every reactor, and
// the AdmittedCall it owns, is gone: they touch the service, destroyed next
// (ASan saw a reactor outlive it once).
TEST_F(RouterTest, ShutdownWhileDeadlineAlarmsFireEndsEveryCallFirst) {
  constexpr int kStreams = 64;
  StuckBackend backend;
  RouterServer::Options o = BaseOptions(*engine_);
  o.backend_override = &backend;
  auto server = RouterServer::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = tandem::v1::Generation::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<GenerateResponse>>> readers;
  const absl::Time first = absl::Now() + absl::Seconds(2);
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(absl::ToChronoTime(first + absl::Milliseconds(i)));
    readers.push_back(stub->Generate(contexts.back().get(), Good()));
  }
  GenerateResponse resp;
  while (readers[0]->Read(&resp)) {
  }
  (*server)->Shutdown(absl::ZeroDuration());
  // Every AdmittedCall (owned by its reactor) has given its slot back.
  EXPECT_EQ((*server)->generation()->num_inflight(), 0) << "reactors alive after Shutdown";
  server->reset();  // the service goes; no reactor may touch it after this
  for (auto& r : readers) {
    while (r->Read(&resp)) {
    }
    r->Finish();
  }
}

TEST_F(RouterTest, UnavailableWithoutWorkers) {
  RouterServer::Options o = BaseOptions(*engine_);
  o.static_decode = {"127.0.0.1:1"};  // nothing listens there
  auto server = RouterServer::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = tandem::v1::Generation::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), grpc::InsecureChannelCredentials()));
  StreamResult r = Call(*stub, Good());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  // Bad input is still INVALID_ARGUMENT, never reported as overload.
  GenerateRequest bad = Good();
  bad.mutable_stop()->set_max_tokens(0);
  EXPECT_EQ(Call(*stub, bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  (*server)->Shutdown();
}

TEST(WorkerPoolTest, RegisterChecksRoleAddressAndKvCompat) {
  WorkerPool::Options o;
  o.model = {30, 3, 64};
  WorkerPool pool(o);
  tandem::v1::RegisterRequest req;
  req.set_role("prefill");
  req.set_address("127.0.0.1:1");
  req.mutable_compat()->set_num_layers(30);
  req.mutable_compat()->set_num_kv_heads(3);
  req.mutable_compat()->set_head_dim(64);
  req.mutable_compat()->set_hash(42);
  EXPECT_TRUE(pool.Register(req).ok());
  tandem::v1::RegisterRequest bad = req;
  bad.set_role("janitor");
  EXPECT_EQ(pool.Register(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_address("nowhere");
  EXPECT_EQ(pool.Register(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.mutable_compat()->set_num_layers(12);
  EXPECT_EQ(pool.Register(bad).code(), absl::StatusCode::kFailedPrecondition);
  bad = req;
  bad.set_address("127.0.0.1:2");
  bad.mutable_compat()->set_hash(43);  // disagrees with the first worker
  EXPECT_EQ(pool.Register(bad).code(), absl::StatusCode::kFailedPrecondition);
  // Registered but never answered a poll: not healthy, so not picked.
  EXPECT_EQ(pool.NumHealthy("prefill"), 0);
  EXPECT_EQ(pool.PickPrefill({1, 2, 3}, 0), nullptr);
  pool.PollOnce();
  EXPECT_EQ(pool.List().size(), 1u);
}

}  // namespace
}  // namespace tandem::router
