// The internal plane refuses what a peer must not be able to make it accept
// (docs/security.md, "What the internal plane checks"): a decode worker
// spoken to directly over real gRPC (PushKv, as a hostile or misconfigured
// prefill worker would) refuses a mismatched compat hash, any differing
// compat field (block size, dtype, shape, model), a forged hash, wrong
// bytes_per_token / total_bytes / token ids, more or less data than declared,
// a chunk over 4 MiB and a second header, each with an error naming what is
// wrong, and leaves no reservation or lease behind. The router's
// WorkerRegistry refuses a worker whose KV compatibility disagrees.
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/vocab.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/common/compat.h"
#include "services/decode/decode_server.h"
#include "services/router/router_server.h"
#include "services/transfer/host_kv_transport.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

class KvHandoffSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new engine::TinyModel(engine::LoadTinyModel(engine::DefaultTinyShape()));
  }
  static void TearDownTestSuite() {
    delete tiny_;
    tiny_ = nullptr;
  }
  void SetUp() override {
    services::WorkerServerConfig c;
    c.file = tiny_->file.get();
    c.model = tiny_->model.get();
    c.model_name = "tiny";
    c.engine = engine::TinyEngineConfig(64);
    c.kv_lease = absl::Seconds(30);
    auto d = decode::DecodeServer::Start(c);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
    stub_ = v1::DecodeWorker::NewStub(transfer::MakeWorkerChannel(decode_->address()));
    compat_ = Stats().compat();
    bpt_ = decode_->engine().kv_bytes_per_token();
    ASSERT_GT(bpt_, 0);
    ASSERT_NE(compat_.hash(), 0u);
  }

  v1::WorkerStats Stats() {
    grpc::ClientContext ctx;
    v1::WorkerStats s;
    EXPECT_TRUE(stub_->GetStats(&ctx, v1::WorkerStatsRequest(), &s).ok());
    return s;
  }

  // A well-formed header for `n` tokens.
  v1::KvChunk Header(int n, const std::string& handle = "h") const {
    v1::KvChunk ch;
    auto* h = ch.mutable_header();
    h->set_kv_handle(handle);
    h->set_request_id("r");
    *h->mutable_compat() = compat_;
    h->set_num_tokens(n);
    h->set_bytes_per_token(bpt_);
    h->set_total_bytes(n * bpt_);
    for (int i = 0; i < n; ++i) h->add_token_ids(i % 256);
    return ch;
  }
  static v1::KvChunk Data(int64_t bytes) {
    v1::KvChunk ch;
    ch.set_data(std::string(static_cast<size_t>(bytes), '\x5a'));
    return ch;
  }

  // Writes the chunks (stops at the first refused write) and returns the status.
  grpc::Status Push(const std::vector<v1::KvChunk>& chunks) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::PushKvResponse resp;
    auto w = stub_->PushKv(&ctx, &resp);
    for (const auto& ch : chunks) {
      if (!w->Write(ch)) break;
    }
    w->WritesDone();
    return w->Finish();
  }

  // Nothing reserved or leased, on the worker's own table and in GetStats.
  void ExpectNothingHeld(const std::string& what) {
    const transfer::KvLeaseStats s = decode_->service().leases().Stats();
    EXPECT_EQ(s.num_reserved, 0) << what;
    EXPECT_EQ(s.num_leases, 0) << what;
    EXPECT_EQ(s.num_bytes, 0) << what;
    const v1::WorkerStats ws = Stats();
    EXPECT_EQ(ws.num_leases(), 0) << what;
    EXPECT_EQ(ws.num_leased_blocks(), 0) << what;
  }

  static engine::TinyModel* tiny_;
  std::unique_ptr<decode::DecodeServer> decode_;
  std::unique_ptr<v1::DecodeWorker::Stub> stub_;
  v1::KvCompatibility compat_;
  int64_t bpt_ = 0;
};
engine::TinyModel* KvHandoffSecurityTest::tiny_ = nullptr;

struct Case {
  std::string name;
  std::vector<v1::KvChunk> chunks;
  grpc::StatusCode code;
  std::string message;  // must appear in the error message
};

// Compat: the hash alone, each field (with a hash recomputed so that only the
// field differs), and a forged hash (ours) over other fields.
TEST_F(KvHandoffSecurityTest, CompatMismatchesAreRefusedNamingTheField) {
  std::vector<Case> cases;
  auto with_compat = [&](const std::string& name, auto mutate, bool rehash,
                         const std::string& message) {
    v1::KvChunk h = Header(10);
    mutate(h.mutable_header()->mutable_compat());
    if (rehash)
      h.mutable_header()->mutable_compat()->set_hash(services::CompatHash(h.header().compat()));
    cases.push_back({name, {h, Data(10 * bpt_)}, grpc::StatusCode::FAILED_PRECONDITION, message});
  };
  with_compat(
      "hash only", [](v1::KvCompatibility* c) { c->set_hash(c->hash() ^ 1); }, false,
      "compat.hash");
  with_compat(
      "no compat at all", [](v1::KvCompatibility* c) { c->Clear(); }, false, "compat.model_name");
  with_compat(
      "block size", [](v1::KvCompatibility* c) { c->set_block_size(32); }, true,
      "compat.block_size is 32");
  with_compat(
      "dtype", [](v1::KvCompatibility* c) { c->set_kv_dtype("bf16"); }, true,
      "compat.kv_dtype is bf16");
  with_compat(
      "layers", [](v1::KvCompatibility* c) { c->set_num_layers(7); }, true, "compat.num_layers");
  with_compat(
      "kv heads", [](v1::KvCompatibility* c) { c->set_num_kv_heads(8); }, true,
      "compat.num_kv_heads");
  with_compat(
      "head dim", [](v1::KvCompatibility* c) { c->set_head_dim(128); }, true, "compat.head_dim");
  with_compat(
      "model", [](v1::KvCompatibility* c) { c->set_model_name("other"); }, true,
      "compat.model_name is other");
  with_compat(
      "weights", [](v1::KvCompatibility* c) { c->set_model_fingerprint(12345); }, true,
      "compat.model_fingerprint");
  // Our hash, copied, over a different block size: still refused.
  with_compat(
      "forged hash", [](v1::KvCompatibility* c) { c->set_block_size(8); }, false,
      "compat.block_size is 8");
  for (const Case& k : cases) {
    const grpc::Status st = Push(k.chunks);
    EXPECT_EQ(st.error_code(), k.code) << k.name << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(k.message), std::string::npos)
        << k.name << ": '" << st.error_message() << "' lacks '" << k.message << "'";
    EXPECT_NE(st.error_message().find("kv compat mismatch"), std::string::npos) << k.name;
    ExpectNothingHeld(k.name);
  }
}

TEST_F(KvHandoffSecurityTest, SizeAndFramingViolationsAreRefusedAndLeaveNothing) {
  std::vector<Case> cases;
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->set_bytes_per_token(bpt_ * 2);
    h.mutable_header()->set_total_bytes(10 * bpt_ * 2);
    cases.push_back({"bytes_per_token",
                     {h, Data(10 * bpt_)},
                     grpc::StatusCode::INVALID_ARGUMENT,
                     "bytes_per_token"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->set_bytes_per_token(0);
    cases.push_back(
        {"bytes_per_token 0", {h}, grpc::StatusCode::INVALID_ARGUMENT, "bytes_per_token 0"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->set_total_bytes(int64_t{1} << 40);
    cases.push_back({"total_bytes huge", {h}, grpc::StatusCode::INVALID_ARGUMENT, "total_bytes"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->set_total_bytes(10 * bpt_ - 1);
    cases.push_back({"total_bytes off by one",
                     {h, Data(10 * bpt_ - 1)},
                     grpc::StatusCode::INVALID_ARGUMENT,
                     "total_bytes"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->set_num_tokens(1 << 30);
    cases.push_back({"num_tokens", {h}, grpc::StatusCode::INVALID_ARGUMENT, "num_tokens"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->set_token_ids(3, 1 << 20);
    cases.push_back(
        {"token outside vocab", {h}, grpc::StatusCode::INVALID_ARGUMENT, "outside vocabulary"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->add_token_ids(1);
    cases.push_back({"token_ids count", {h}, grpc::StatusCode::INVALID_ARGUMENT, "token_ids"});
  }
  {
    v1::KvChunk h = Header(10);
    h.mutable_header()->clear_kv_handle();
    cases.push_back({"no handle", {h}, grpc::StatusCode::INVALID_ARGUMENT, "kv_handle"});
  }
  cases.push_back({"more data than declared",
                   {Header(10), Data(6 * bpt_), Data(5 * bpt_)},
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "more data than the declared total_bytes"});
  cases.push_back({"less data than declared",
                   {Header(10), Data(9 * bpt_)},
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "of total_bytes"});
  cases.push_back({"chunk over 4 MiB",
                   {Header(10), Data(transfer::kMaxChunkBytes + 1)},
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "exceeds the 4 MiB chunk limit"});
  cases.push_back({"second header",
                   {Header(10), Data(bpt_), Header(10)},
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "a second header"});
  cases.push_back({"data before the header",
                   {Data(bpt_), Header(10)},
                   grpc::StatusCode::INVALID_ARGUMENT,
                   "the first message must be the header"});
  cases.push_back({"empty stream", {}, grpc::StatusCode::INVALID_ARGUMENT, "empty stream"});
  for (const Case& k : cases) {
    const grpc::Status st = Push(k.chunks);
    EXPECT_EQ(st.error_code(), k.code) << k.name << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(k.message), std::string::npos)
        << k.name << ": '" << st.error_message() << "' lacks '" << k.message << "'";
    ExpectNothingHeld(k.name);
  }
  // The same handle is usable afterwards: nothing was left under it.
  const grpc::Status good = Push({Header(10), Data(4 * bpt_), Data(6 * bpt_)});
  ASSERT_TRUE(good.ok()) << good.error_message();
  EXPECT_EQ(Stats().num_leases(), 1);
  grpc::ClientContext ctx;
  v1::ReleaseKvRequest req;
  req.set_kv_handle("h");
  v1::ReleaseKvResponse resp;
  ASSERT_TRUE(stub_->ReleaseKv(&ctx, req, &resp).ok());
  EXPECT_TRUE(resp.released());
  ExpectNothingHeld("after release");
}

// A reused handle is refused while the first push holds it, and refusing it
// does not disturb the first.
TEST_F(KvHandoffSecurityTest, DuplicateHandleIsRefused) {
  ASSERT_TRUE(Push({Header(10, "dup"), Data(10 * bpt_)}).ok());
  const grpc::Status again = Push({Header(10, "dup"), Data(10 * bpt_)});
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ALREADY_EXISTS) << again.error_message();
  EXPECT_EQ(Stats().num_leases(), 1);
  grpc::ClientContext ctx;
  v1::ReleaseKvRequest req;
  req.set_kv_handle("dup");
  v1::ReleaseKvResponse resp;
  ASSERT_TRUE(stub_->ReleaseKv(&ctx, req, &resp).ok());
  EXPECT_TRUE(resp.released());
  ExpectNothingHeld("after release");
}

// WorkerRegistry.Register over real gRPC: a worker whose KV compatibility
// disagrees with the router's model or with the workers already registered
// is refused with FAILED_PRECONDITION and never enters the pool.
TEST_F(KvHandoffSecurityTest, RouterRefusesAWorkerWithMismatchedCompat) {
  auto file = gguf::GgufFile::Open(testing::DefaultModelPath());
  if (!file.ok()) GTEST_SKIP() << "no model (for the router's tokenizer): " << file.status();
  auto vocab = tokenizer::VocabFromGguf(**file);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  auto tok = tokenizer::Tokenizer::Create(std::move(*vocab));
  ASSERT_TRUE(tok.ok()) << tok.status();

  const engine::ModelConfig& mc = tiny_->model->config();
  router::RouterServer::Options o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.tokenizer = tok->get();
  o.limits = {static_cast<int32_t>(mc.context_length), static_cast<int32_t>(mc.vocab_size),
              static_cast<int32_t>(mc.context_length - 1)};
  o.model_shape = {mc.num_layers, mc.num_kv_heads, mc.head_dim};
  o.model_name = "tiny";
  auto router = router::RouterServer::Start(std::move(o));
  ASSERT_TRUE(router.ok()) << router.status();
  auto registry = v1::WorkerRegistry::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*router)->port()), grpc::InsecureChannelCredentials()));
  auto reg = [&](const std::string& address, const v1::KvCompatibility& compat) {
    v1::RegisterRequest req;
    req.set_role("decode");
    req.set_address(address);
    *req.mutable_compat() = compat;
    grpc::ClientContext ctx;
    v1::RegisterResponse resp;
    return registry->Register(&ctx, req, &resp);
  };
  // The real worker's compat is accepted.
  ASSERT_TRUE(reg(decode_->address(), compat_).ok());

  v1::KvCompatibility other_model = compat_;
  other_model.set_model_fingerprint(compat_.model_fingerprint() ^ 0xff);
  other_model.set_hash(services::CompatHash(other_model));
  grpc::Status st = reg("127.0.0.1:2", other_model);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("KV compatibility hash"), std::string::npos)
      << st.error_message();

  v1::KvCompatibility other_shape = compat_;
  other_shape.set_num_layers(static_cast<int32_t>(mc.num_layers) + 1);
  other_shape.set_hash(services::CompatHash(other_shape));
  st = reg("127.0.0.1:3", other_shape);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("layers"), std::string::npos) << st.error_message();

  v1::KvCompatibility other_block = compat_;
  other_block.set_block_size(compat_.block_size() * 2);
  other_block.set_hash(services::CompatHash(other_block));
  st = reg("127.0.0.1:4", other_block);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();

  const std::vector<router::WorkerSnapshot> workers = (*router)->pool()->List();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].address, decode_->address());
  (*router)->Shutdown();
}

}  // namespace
}  // namespace tandem
