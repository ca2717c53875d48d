// Prefill and decode workers in-process over real gRPC on loopback (port 0),
// real engines on the tiny model (and SmolLM2 when present).
#include <atomic>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/common/compat.h"
#include "services/common/convert.h"
#include "services/decode/decode_server.h"
#include "services/prefill/prefill_server.h"
#include "services/transfer/host_kv_transport.h"
#include "services/transfer/kv_push_pipe.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/http_get.h"
#include "tests/util/prefill_call.h"
#include "tests/util/test_paths.h"
#include "tests/util/wait.h"

namespace tandem {
namespace {

using engine::CollectedOutput;
using engine::EngineRequest;

struct Cluster {
  std::unique_ptr<prefill::PrefillServer> prefill;
  std::unique_ptr<decode::DecodeServer> decode;
  std::unique_ptr<v1::PrefillWorker::Stub> p;
  std::unique_ptr<v1::DecodeWorker::Stub> d;
};

services::WorkerServerConfig TinyConfig(const engine::TinyModel& t, absl::Duration lease) {
  services::WorkerServerConfig c;
  c.file = t.file.get();
  c.model = t.model.get();
  c.model_name = "tiny";
  c.engine = engine::TinyEngineConfig(64);
  c.kv_lease = lease;
  return c;
}

Cluster StartCluster(const services::WorkerServerConfig& pc,
                     const services::WorkerServerConfig& dc) {
  Cluster c;
  auto p = prefill::PrefillServer::Start(pc);
  TANDEM_CHECK(p.ok());
  auto d = decode::DecodeServer::Start(dc);
  TANDEM_CHECK(d.ok());
  c.prefill = std::move(*p);
  c.decode = std::move(*d);
  c.p = v1::PrefillWorker::NewStub(transfer::MakeWorkerChannel(c.prefill->address()));
  c.d = v1::DecodeWorker::NewStub(transfer::MakeWorkerChannel(c.decode->address()));
  return c;
}

v1::WorkerStats Stats(v1::DecodeWorker::Stub& d) {
  grpc::ClientContext ctx;
  v1::WorkerStats s;
  EXPECT_TRUE(d.GetStats(&ctx, v1::WorkerStatsRequest(), &s).ok());
  return s;
}

// Router's job, done by hand: Prefill then Decode; returns all tokens.
CollectedOutput RunDisaggregated(Cluster& c, const EngineRequest& r, const std::string& handle) {
  CollectedOutput out;
  v1::PrefillRequest pr;
  pr.set_request_id(handle);
  for (int32_t t : r.prompt_token_ids) pr.add_prompt_token_ids(t);
  services::ToProto(r.params, pr.mutable_params());
  pr.set_decode_address(c.decode->address());
  pr.set_kv_handle(handle);
  v1::PrefillResponse presp;
  grpc::ClientContext pctx;
  grpc::Status st = testing::CallPrefill(*c.p, &pctx, pr, &presp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  if (!st.ok()) return out;
  out.token_ids.push_back(presp.first_token_id());
  out.logprobs.push_back(presp.first_logprobs().sampled().logprob());
  out.text = presp.first_text();
  out.finish.emplace();
  if (presp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    out.finish->reason = services::FromProto(presp.finish_reason());
    return out;
  }
  EXPECT_GT(presp.kv_bytes(), 0);
  v1::DecodeRequest dr;
  dr.set_request_id(handle);
  dr.set_kv_handle(handle);
  *dr.mutable_prompt_token_ids() = pr.prompt_token_ids();
  dr.set_first_token_id(presp.first_token_id());
  *dr.mutable_params() = pr.params();
  grpc::ClientContext dctx;
  auto reader = c.d->Decode(&dctx, dr);
  v1::DecodeResponse resp;
  while (reader->Read(&resp)) {
    for (int32_t t : resp.token_ids()) out.token_ids.push_back(t);
    for (const auto& lp : resp.logprobs()) out.logprobs.push_back(lp.sampled().logprob());
    out.text += resp.text();
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.finish->reason = services::FromProto(resp.finish_reason());
    }
  }
  st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  return out;
}

class PdWorkersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new engine::TinyModel(engine::LoadTinyModel(engine::DefaultTinyShape()));
  }
  static void TearDownTestSuite() { delete tiny_; }
  static engine::TinyModel* tiny_;
};
engine::TinyModel* PdWorkersTest::tiny_ = nullptr;

TEST_F(PdWorkersTest, HandoffMatchesColocated) {
  Cluster c =
      StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), TinyConfig(*tiny_, absl::Seconds(30)));
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = engine::MakeRequest(engine::RandomPrompt(9 + 17 * i, 256, 40 + i), 8,
                                          i % 2 ? 0.8 : 0.0, 100 + i);
    const CollectedOutput alone = engine::RunAlone(tiny_->model.get(), r);
    const CollectedOutput got = RunDisaggregated(c, r, "h" + std::to_string(i));
    engine::ExpectSameOutput(got, alone, "request " + std::to_string(i));
  }
  EngineRequest one = engine::MakeRequest(engine::RandomPrompt(12, 256, 3), 1);
  EXPECT_EQ(RunDisaggregated(c, one, "one").token_ids.size(), 1u);
  const v1::WorkerStats s = Stats(*c.d);
  EXPECT_EQ(s.num_blocks_used(), 0);
  EXPECT_EQ(s.num_leases(), 0);
}

// Writes `chunks` to PushKv and returns the status.
grpc::Status Push(v1::DecodeWorker::Stub& d, const std::vector<v1::KvChunk>& chunks) {
  grpc::ClientContext ctx;
  v1::PushKvResponse resp;
  auto w = d.PushKv(&ctx, &resp);
  for (const auto& ch : chunks) {
    if (!w->Write(ch)) break;
  }
  w->WritesDone();
  return w->Finish();
}

TEST_F(PdWorkersTest, RefusesBadHeadersBeforeAnyByte) {
  services::WorkerServerConfig dc = TinyConfig(*tiny_, absl::Seconds(30));
  dc.engine.num_kv_blocks = 16;  // 256 tokens of capacity
  Cluster c = StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), dc);
  const v1::KvCompatibility compat = Stats(*c.d).compat();
  const int64_t bpt = c.decode->engine().kv_bytes_per_token();
  auto header = [&](int n) {
    v1::KvChunk ch;
    auto* h = ch.mutable_header();
    h->set_kv_handle("bad");
    *h->mutable_compat() = compat;
    h->set_num_tokens(n);
    h->set_bytes_per_token(bpt);
    h->set_total_bytes(n * bpt);
    for (int i = 0; i < n; ++i) h->add_token_ids(i % 256);
    return ch;
  };
  v1::KvChunk data;
  data.set_data(std::string(10 * bpt, '\0'));
  struct Case {
    std::string what;
    v1::KvChunk first;
    grpc::StatusCode code;
  };
  std::vector<Case> cases;
  {
    Case k{"compat hash", header(10), grpc::StatusCode::FAILED_PRECONDITION};
    k.first.mutable_header()->mutable_compat()->set_num_layers(99);
    k.first.mutable_header()->mutable_compat()->set_hash(
        services::CompatHash(k.first.header().compat()));
    cases.push_back(k);
  }
  {
    Case k{"hash only", header(10), grpc::StatusCode::FAILED_PRECONDITION};
    k.first.mutable_header()->mutable_compat()->set_hash(1);
    cases.push_back(k);
  }
  {
    Case k{"total_bytes", header(10), grpc::StatusCode::INVALID_ARGUMENT};
    k.first.mutable_header()->set_total_bytes(int64_t{1} << 40);
    cases.push_back(k);
  }
  {
    Case k{"bytes_per_token", header(10), grpc::StatusCode::INVALID_ARGUMENT};
    k.first.mutable_header()->set_bytes_per_token(bpt + 4);
    cases.push_back(k);
  }
  {
    Case k{"num_tokens", header(10), grpc::StatusCode::INVALID_ARGUMENT};
    k.first.mutable_header()->set_num_tokens(1 << 30);
    cases.push_back(k);
  }
  {
    Case k{"token_ids", header(10), grpc::StatusCode::INVALID_ARGUMENT};
    k.first.mutable_header()->add_token_ids(1);
    cases.push_back(k);
  }
  cases.push_back(Case{"no header", data, grpc::StatusCode::INVALID_ARGUMENT});
  for (const Case& k : cases) {
    grpc::Status st = Push(*c.d, {k.first, data});
    EXPECT_EQ(st.error_code(), k.code) << k.what << ": " << st.error_message();
  }
  // Payload larger / smaller than declared.
  v1::KvChunk big;
  big.set_data(std::string(11 * bpt, '\0'));
  EXPECT_EQ(Push(*c.d, {header(10), big}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::KvChunk small;
  small.set_data(std::string(3 * bpt, '\0'));
  EXPECT_EQ(Push(*c.d, {header(10), small}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Too big for the free KV capacity (16 blocks x 16 tokens).
  const grpc::Status full = Push(*c.d, {header(300)});
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  const v1::WorkerStats s = Stats(*c.d);
  EXPECT_EQ(s.num_leases(), 0);
  EXPECT_EQ(c.decode->service().leases().Stats().num_bytes, 0);
  // A good push is accepted after all that, then released twice.
  EXPECT_TRUE(Push(*c.d, {header(10), data}).ok());
  EXPECT_EQ(Stats(*c.d).num_leases(), 1);
  for (bool expected : {true, false}) {
    grpc::ClientContext ctx;
    v1::ReleaseKvRequest req;
    req.set_kv_handle("bad");
    v1::ReleaseKvResponse resp;
    ASSERT_TRUE(c.d->ReleaseKv(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.released(), expected);
  }
  EXPECT_EQ(Stats(*c.d).num_leases(), 0);
}

TEST_F(PdWorkersTest, PushKvThatDiesMidwayLeavesNothing) {
  Cluster c =
      StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), TinyConfig(*tiny_, absl::Seconds(30)));
  const int64_t bpt = c.decode->engine().kv_bytes_per_token();
  grpc::ClientContext ctx;
  v1::PushKvResponse resp;
  auto w = c.d->PushKv(&ctx, &resp);
  v1::KvChunk ch;
  auto* h = ch.mutable_header();
  h->set_kv_handle("dies");
  *h->mutable_compat() = Stats(*c.d).compat();
  h->set_num_tokens(100);
  h->set_bytes_per_token(bpt);
  h->set_total_bytes(100 * bpt);
  for (int i = 0; i < 100; ++i) h->add_token_ids(i);
  ASSERT_TRUE(w->Write(ch));
  ch.set_data(std::string(10 * bpt, '\0'));
  ASSERT_TRUE(w->Write(ch));
  // The header is in: the reservation is held while the payload arrives.
  ASSERT_TRUE(testing::WaitFor(
      [&] { return c.decode->service().leases().Stats().num_reserved == 1; }, absl::Seconds(10)));
  ctx.TryCancel();
  EXPECT_FALSE(w->Finish().ok());
  EXPECT_TRUE(testing::WaitFor(
      [&] { return c.decode->service().leases().Stats().num_reserved == 0; }, absl::Seconds(10)));
  EXPECT_EQ(c.decode->service().leases().Stats().num_reserved, 0);
  EXPECT_EQ(c.decode->service().leases().Stats().num_bytes, 0);
  EXPECT_EQ(Stats(*c.d).num_leases(), 0);
}

TEST_F(PdWorkersTest, LeaseExpiryFreesAndDecodeGetsNotFound) {
  services::WorkerServerConfig dc = TinyConfig(*tiny_, absl::Milliseconds(200));
  dc.metrics_address = "127.0.0.1:0";
  Cluster c = StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), dc);
  v1::PrefillRequest pr;
  for (int32_t t : engine::RandomPrompt(40, 256, 8)) pr.add_prompt_token_ids(t);
  pr.mutable_params()->set_max_tokens(5);
  pr.mutable_params()->set_top_logprobs(-1);
  pr.set_decode_address(c.decode->address());
  pr.set_kv_handle("expires");
  v1::PrefillResponse presp;
  grpc::ClientContext pctx;
  // The lease starts on the decode worker while the call is still running
  // (before its answer reaches us), so the call's start is the earliest it
  // can have started.
  const absl::Time call_start = absl::Now();
  ASSERT_TRUE(testing::CallPrefill(*c.p, &pctx, pr, &presp).ok());
  EXPECT_EQ(Stats(*c.d).num_leases(), 1);
  EXPECT_EQ(Stats(*c.d).num_leased_blocks(), 3);
  // The reaper frees it once the 200 ms lease has run out, not before.
  EXPECT_TRUE(testing::WaitFor([&] { return Stats(*c.d).num_leases() == 0; }, absl::Seconds(10)));
  EXPECT_GE(absl::Now() - call_start, absl::Milliseconds(200));
  EXPECT_EQ(Stats(*c.d).num_leased_blocks(), 0);
  v1::DecodeRequest dr;
  dr.set_kv_handle("expires");
  *dr.mutable_prompt_token_ids() = pr.prompt_token_ids();
  dr.set_first_token_id(presp.first_token_id());
  *dr.mutable_params() = pr.params();
  grpc::ClientContext dctx;
  auto reader = c.d->Decode(&dctx, dr);
  v1::DecodeResponse resp;
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Stats(*c.d).num_blocks_used(), 0);
  // The decode worker counts the failed call by its code.
  const std::string text = testing::HttpGetBody(c.decode->metrics_port(), "/metrics");
  const std::string want =
      "tandem_request_errors_total{code=\"NOT_FOUND\",model=\"tiny\",phase=\"decode\"} 1";
  EXPECT_NE(text.find(want), std::string::npos) << text.substr(0, 4000);
}

TEST_F(PdWorkersTest, CancelMidDecodeFreesAllBlocks) {
  Cluster c =
      StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), TinyConfig(*tiny_, absl::Seconds(30)));
  v1::DecodeRequest dr;  // decode-side prefill (no handle)
  for (int32_t t : engine::RandomPrompt(30, 256, 9)) dr.add_prompt_token_ids(t);
  dr.set_first_token_id(-1);
  dr.mutable_params()->set_max_tokens(900);
  dr.mutable_params()->set_ignore_eos(true);
  dr.mutable_params()->set_top_logprobs(-1);
  grpc::ClientContext dctx;
  auto reader = c.d->Decode(&dctx, dr);
  v1::DecodeResponse resp;
  int n = 0;
  while (n < 5 && reader->Read(&resp)) n += resp.token_ids_size();
  EXPECT_EQ(n, 5);
  dctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  v1::WorkerStats s;
  for (int i = 0; i < 200; ++i) {
    s = Stats(*c.d);
    if (s.num_blocks_used() == 0 && s.num_running() == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(s.num_blocks_used(), 0);
  EXPECT_EQ(s.num_running(), 0);
}

TEST(PdWorkersRealModelTest, HandoffMatchesColocatedAndBandwidth) {
  const std::string path = testing::DefaultModelPath();
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no model at " << path;
  services::WorkerServerConfig config;
  config.model_path = path;
  config.engine.kv_cache_memory_bytes = 256 << 20;
  config.engine.num_threads = 2;
  Cluster c = StartCluster(config, config);
  const tokenizer::Tokenizer& tok = *c.prefill->engine().tokenizer();
  for (double temperature : {0.0, 0.8}) {
    EngineRequest r =
        engine::MakeRequest(tok.Encode("The capital of France is", true, true), 8, temperature, 11);
    const CollectedOutput alone = engine::Collect(**c.decode->engine().Submit(r));
    const CollectedOutput got = RunDisaggregated(c, r, "real" + std::to_string(temperature));
    engine::ExpectSameOutput(got, alone, "real model");
    EXPECT_EQ(got.text, alone.text);
  }
  // Loopback bandwidth of the host transport: 2000 tokens of SmolLM2 K/V.
  engine::KvExport kv;
  const engine::ModelConfig& mc = c.decode->engine().model().config();
  kv.num_layers = mc.num_layers;
  kv.num_kv_heads = mc.num_kv_heads;
  kv.head_dim = mc.head_dim;
  kv.bytes_per_token = c.decode->engine().kv_bytes_per_token();
  kv.token_ids.assign(2000, 1);
  kv.bytes.assign(2000 * kv.bytes_per_token, '\x3f');
  transfer::HostKvTransport transport;
  const v1::KvCompatibility compat = Stats(*c.d).compat();
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto sent = transport.Send({c.decode->address(), "bw" + std::to_string(i), "bw"}, compat, kv,
                               absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(sent.ok()) << sent.status();
    best = std::max(best, sent->num_bytes / sent->seconds / 1e6);
    c.decode->service().leases().Release("bw" + std::to_string(i));
  }
  std::printf("host KV transport loopback: %.1f MB in best %.1f MB/s\n", kv.bytes.size() / 1e6,
              best);
  EXPECT_EQ(Stats(*c.d).num_blocks_used(), 0);
}

// KvPushPipe over the host transport, as the prefill worker drives it: the
// pieces of one handoff land as one lease with exactly their bytes; a
// handoff cancelled between pieces, or refused at its header (compat), leaves
// no reservation or lease behind and reports why.
TEST_F(PdWorkersTest, StreamedPushInPiecesLandsAndCancelledOrRefusedLeavesNothing) {
  Cluster c =
      StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), TinyConfig(*tiny_, absl::Seconds(30)));
  const v1::KvCompatibility compat = Stats(*c.d).compat();
  transfer::KvSendPlan plan;
  plan.token_ids = engine::RandomPrompt(40, 256, 3);
  plan.bytes_per_token = c.decode->engine().kv_bytes_per_token();
  const std::string bytes(plan.total_bytes(), '\x11');
  transfer::HostKvTransport transport(/*chunk_bytes=*/4096);
  const transfer::KvLeaseTable& leases = c.decode->service().leases();
  {
    transfer::KvPushPipe pipe(&transport, {c.decode->address(), "pieces", "r"}, compat, plan,
                              absl::Now() + absl::Seconds(30));
    const size_t third = bytes.size() / 3;
    pipe.Push(bytes.substr(0, third));
    pipe.Push(bytes.substr(third, third));
    pipe.Push(bytes.substr(2 * third));
    absl::StatusOr<transfer::KvSendResult> r = pipe.Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_bytes, plan.total_bytes());
    EXPECT_EQ(leases.Stats().num_leases, 1);
    EXPECT_TRUE(c.decode->service().leases().Release("pieces"));
  }
  {
    transfer::KvPushPipe pipe(&transport, {c.decode->address(), "cancelled", "r"}, compat, plan,
                              absl::Now() + absl::Seconds(30));
    pipe.Push(bytes.substr(0, 1000));
    // The header reached the decode worker: its size is reserved.
    EXPECT_TRUE(testing::WaitFor([&] { return leases.Stats().num_reserved == 1; }));
    pipe.Cancel();
  }
  EXPECT_TRUE(testing::WaitFor([&] {
    return leases.Stats().num_reserved == 0 && leases.Stats().num_leases == 0 &&
           leases.Stats().num_bytes == 0;
  }));
  {
    v1::KvCompatibility other = compat;
    other.set_block_size(compat.block_size() * 2);
    transfer::KvPushPipe pipe(&transport, {c.decode->address(), "refused", "r"}, other, plan,
                              absl::Now() + absl::Seconds(30));
    pipe.Push(bytes);
    absl::StatusOr<transfer::KvSendResult> r = pipe.Finish();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_TRUE(pipe.failed());
  }
  EXPECT_EQ(leases.Stats().num_reserved, 0);
  EXPECT_EQ(leases.Stats().num_leases, 0);
}

// The host transport's push runs on gRPC's callback API (no thread of its
// own): a pipe given more or fewer bytes than its plan declared fails with
// InvalidArgument and leaves no reservation; one with on_done reports once,
// from a transport thread, with the result already in TryResult.
TEST_F(PdWorkersTest, AsyncPushChecksItsSizeAndCallsOnDoneOnce) {
  Cluster c =
      StartCluster(TinyConfig(*tiny_, absl::Seconds(30)), TinyConfig(*tiny_, absl::Seconds(30)));
  const v1::KvCompatibility compat = Stats(*c.d).compat();
  transfer::KvSendPlan plan;
  plan.token_ids = engine::RandomPrompt(24, 256, 5);
  plan.bytes_per_token = c.decode->engine().kv_bytes_per_token();
  const std::string bytes(plan.total_bytes(), '\x22');
  transfer::HostKvTransport transport(/*chunk_bytes=*/1000);
  const transfer::KvLeaseTable& leases = c.decode->service().leases();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (const std::string& payload : {bytes + "x", bytes.substr(1)}) {
    transfer::KvPushPipe pipe(&transport, {c.decode->address(), "size", "r"}, compat, plan,
                              deadline);
    pipe.Push(payload);
    absl::StatusOr<transfer::KvSendResult> r = pipe.Finish();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  EXPECT_TRUE(testing::WaitFor(
      [&] { return leases.Stats().num_reserved == 0 && leases.Stats().num_leases == 0; }));
  std::atomic<int> calls{0};
  std::atomic<bool> had_result{false};
  std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> on_caller{false};
  transfer::KvPushPipe* self = nullptr;
  transfer::KvPushPipe pipe(&transport, {c.decode->address(), "done", "r"}, compat, plan, deadline,
                            [&] {
                              had_result.store(self->TryResult().has_value());
                              on_caller.store(std::this_thread::get_id() == caller);
                              calls.fetch_add(1);
                            });
  self = &pipe;
  for (size_t off = 0; off < bytes.size(); off += 700) pipe.Push(bytes.substr(off, 700));
  EXPECT_TRUE(pipe.Close());
  ASSERT_TRUE(testing::WaitFor([&] { return calls.load() == 1; }));
  EXPECT_TRUE(had_result.load());
  EXPECT_FALSE(on_caller.load());
  std::optional<absl::StatusOr<transfer::KvSendResult>> r = pipe.TryResult();
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->ok()) << r->status();
  EXPECT_EQ((*r)->num_bytes, plan.total_bytes());
  EXPECT_TRUE(c.decode->service().leases().Release("done"));
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace tandem
