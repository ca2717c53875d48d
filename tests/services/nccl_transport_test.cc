// The NCCL KV transport on CPU: block packing, the sender (NcclKvTransport)
// and the receiver (NcclKvReceiver) over real gRPC on loopback with the
// in-process FakeNcclOps in place of CUDA / NCCL: the protocol, its ordering,
// timeouts, ncclCommAbort on failure, both sides released, communicators
// re-created, concurrency; and real Prefill / Decode servers with
// --kv-transport=nccl on the fake. The same code on a GPU: tests/gpu/.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/background_free.h"
#include "common/status.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "services/common/compat.h"
#include "services/common/convert.h"
#include "services/decode/decode_server.h"
#include "services/prefill/prefill_server.h"
#include "services/transfer/fake_nccl_ops.h"
#include "services/transfer/host_kv_transport.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/kv_lease_table.h"
#include "services/transfer/nccl_kv_path.h"
#include "services/transfer/nccl_kv_transport.h"
#include "services/transfer/nccl_receiver.h"
#include "tests/engine/engine_test_util.h"
#include "tests/util/prefill_call.h"
#include "tests/util/wait.h"

namespace tandem::transfer {
namespace {

using testing::WaitFor;

constexpr int kBlock = 16;
constexpr int kLayers = 3;
constexpr int kHeads = 2;
constexpr int kDim = 4;
constexpr int kVocab = 1000;

int64_t Bpt() { return engine::KvExport::BytesPerToken(kLayers, kHeads, kDim); }

v1::KvCompatibility TestCompat() {
  v1::KvCompatibility c;
  c.set_model_name("test");
  c.set_model_fingerprint(42);
  c.set_kv_dtype("f32");
  c.set_block_size(kBlock);
  c.set_num_layers(kLayers);
  c.set_num_kv_heads(kHeads);
  c.set_head_dim(kDim);
  c.set_hash(services::CompatHash(c));
  return c;
}

std::string RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(static_cast<size_t>(n), '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

engine::KvExport MakeKv(int num_tokens, uint32_t seed) {
  engine::KvExport kv;
  for (int i = 0; i < num_tokens; ++i) kv.token_ids.push_back((i * 7 + seed) % kVocab);
  kv.num_layers = kLayers;
  kv.num_kv_heads = kHeads;
  kv.head_dim = kDim;
  kv.bytes_per_token = Bpt();
  kv.bytes = RandomBytes(num_tokens * Bpt(), seed);
  return kv;
}

// ---- block packing -----------------------------------------------------------

TEST(KvBlockPackingTest, RoundTripAwkwardSizes) {
  struct Case {
    int64_t tokens, block_size, layers, row_floats;
  };
  const std::vector<Case> cases = {{1, 16, 1, 1},  {1, 16, 30, 8},  {15, 16, 2, 3},
                                   {16, 16, 2, 3}, {17, 16, 2, 3},  {33, 16, 30, 8},
                                   {5, 1, 4, 2},   {100, 7, 64, 1}, {257, 256, 2, 64}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " block " << c.block_size
                                      << " layers " << c.layers << " row " << c.row_floats);
    const int64_t bpt = 2 * c.layers * c.row_floats * 4;
    absl::StatusOr<KvBlockLayout> l = MakeKvBlockLayout(c.tokens, bpt, c.block_size, c.layers);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->num_blocks, (c.tokens + c.block_size - 1) / c.block_size);
    EXPECT_EQ(l->row_bytes, c.row_floats * 4);
    EXPECT_EQ(l->staging_bytes(), l->num_blocks * c.block_size * bpt);
    const std::string src = RandomBytes(l->payload_bytes(), static_cast<uint32_t>(c.tokens));
    std::string staged(static_cast<size_t>(l->staging_bytes()), '\x55');
    PackKvBlocks(*l, src.data(), staged.data());
    // Every row lands at [block][layer][K|V][slot][row].
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t r = 0; r < 2 * c.layers; ++r) {
        const int64_t b = t / c.block_size, j = t % c.block_size;
        const int64_t at = b * l->block_bytes + (r * c.block_size + j) * l->row_bytes;
        ASSERT_EQ(staged.compare(at, l->row_bytes, src, t * bpt + r * l->row_bytes, l->row_bytes),
                  0)
            << "token " << t << " row " << r;
      }
    }
    // The padding of the last block is zeros.
    const int64_t used = c.tokens - (l->num_blocks - 1) * c.block_size;
    for (int64_t r = 0; r < 2 * c.layers; ++r) {
      for (int64_t j = used; j < c.block_size; ++j) {
        const int64_t at =
            (l->num_blocks - 1) * l->block_bytes + (r * c.block_size + j) * l->row_bytes;
        ASSERT_EQ(staged.substr(at, l->row_bytes), std::string(l->row_bytes, '\0'));
      }
    }
    std::string back(static_cast<size_t>(l->payload_bytes()), '\0');
    UnpackKvBlocks(*l, staged.data(), back.data());
    EXPECT_EQ(back, src);
  }
}

TEST(KvBlockPackingTest, RejectsBadGeometry) {
  EXPECT_EQ(MakeKvBlockLayout(0, 64, 16, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKvBlockLayout(4, 64, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKvBlockLayout(4, 64, 16, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKvBlockLayout(4, 66, 16, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKvBlockLayout(int64_t{1} << 40, 64, 16, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKvBlockLayout(1, int64_t{1} << 40, 1 << 20, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvBlockPackingTest, SegmentsCoverEveryBlockOnce) {
  absl::StatusOr<KvBlockLayout> l = MakeKvBlockLayout(100, 64, 16, 2);  // 7 blocks of 1 KiB
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(BlocksPerSegment(*l, 1), 1);
  EXPECT_EQ(BlocksPerSegment(*l, 3 * 1024 + 5), 3);
  EXPECT_EQ(BlocksPerSegment(*l, int64_t{1} << 30), 7);
  for (int64_t bps = 1; bps <= 7; ++bps) {
    ASSERT_TRUE(CheckBlocksPerSegment(*l, bps).ok());
    const std::vector<KvSegment> segs = KvSegments(*l, bps);
    int64_t next = 0;
    for (const KvSegment& s : segs) {
      EXPECT_EQ(s.offset, next);
      EXPECT_EQ(s.bytes % l->block_bytes, 0);
      EXPECT_LE(s.bytes, bps * l->block_bytes);
      next += s.bytes;
    }
    EXPECT_EQ(next, l->staging_bytes());
    EXPECT_EQ(static_cast<int64_t>(segs.size()), (7 + bps - 1) / bps);
  }
  EXPECT_FALSE(CheckBlocksPerSegment(*l, 0).ok());
  EXPECT_FALSE(CheckBlocksPerSegment(*l, 8).ok());
}

// The single-GPU test's path (tests/gpu/nccl_gpu_test.cc) on the fake: one
// rank, grouped sends and receives to itself, packing included.
TEST(NcclLoopbackTest, OneRankSendsToItself) {
  auto fabric = std::make_shared<FakeNcclFabric>();
  FakeNcclOps ops(fabric);
  absl::StatusOr<NcclUniqueId> id = ops.GetUniqueId();
  ASSERT_TRUE(id.ok());
  absl::StatusOr<NcclOps::Comm> comm =
      ops.CommInitRank(*id, 1, 0, absl::Now() + absl::Seconds(5), {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<NcclOps::Stream> stream = ops.StreamCreate();
  ASSERT_TRUE(stream.ok());
  {
    NcclStaging send(&ops), recv(&ops);
    for (int tokens : {1, 15, 16, 17, 70}) {
      const engine::KvExport kv = MakeKv(tokens, tokens);
      absl::StatusOr<KvBlockLayout> l = MakeKvBlockLayout(tokens, Bpt(), kBlock, kLayers);
      ASSERT_TRUE(l.ok());
      for (int64_t bps : {int64_t{1}, std::min<int64_t>(2, l->num_blocks), l->num_blocks}) {
        absl::StatusOr<std::string> got =
            LoopbackKvBlocks(ops, *comm, *stream, 0, *l, bps, kv.bytes.data(), send, recv,
                             absl::Now() + absl::Seconds(5));
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, kv.bytes) << tokens << " tokens, " << bps << " blocks per segment";
      }
    }
  }
  EXPECT_EQ(ops.live_device_bytes(), 0);
  ops.StreamDestroy(*stream);
  ops.CommAbort(*comm);
}

// ---- sender + receiver over gRPC with the fake ops ---------------------------

// A DecodeWorker with only the NCCL RPCs, on its own lease table.
class TestDecodeService final : public v1::DecodeWorker::Service {
 public:
  TestDecodeService(std::shared_ptr<NcclOps> ops, absl::Duration transfer_timeout)
      : ops_(std::move(ops)),
        transfer_timeout_(transfer_timeout),
        leases_(absl::Seconds(30), kBlock) {
    Restart();
  }

  grpc::Status NcclConnect(grpc::ServerContext* context, const v1::NcclConnectRequest* request,
                           v1::NcclConnectResponse* response) override {
    return receiver()->Connect(context, request, response);
  }
  grpc::Status NcclPushKv(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::NcclPushKvResponse, v1::NcclPushKvRequest>* stream) override {
    return receiver()->PushKv(context, stream);
  }

  // A decode worker restart: every communicator is forgotten (aborted).
  void Restart() {
    NcclReceiverConfig rc;
    rc.compat = TestCompat();
    rc.bytes_per_token = Bpt();
    rc.max_tokens = 4096;
    rc.vocab_size = kVocab;
    rc.free_bytes = [this] { return free_bytes.load(); };
    rc.draining = [this] { return draining.load(); };
    rc.on_received = [this](int64_t, double) { ++received; };
    rc.connect_timeout = absl::Seconds(5);
    rc.transfer_timeout = transfer_timeout_;
    auto r = std::make_shared<NcclKvReceiver>(ops_, std::move(rc), &leases_);
    absl::MutexLock lock(&mu_);
    receiver_ = std::move(r);
  }
  std::shared_ptr<NcclKvReceiver> receiver() {
    absl::MutexLock lock(&mu_);
    return receiver_;
  }
  KvLeaseTable& leases() { return leases_; }

  std::atomic<int64_t> free_bytes{int64_t{1} << 30};
  std::atomic<bool> draining{false};
  std::atomic<int> received{0};

 private:
  std::shared_ptr<NcclOps> ops_;
  const absl::Duration transfer_timeout_;
  KvLeaseTable leases_;
  absl::Mutex mu_;
  std::shared_ptr<NcclKvReceiver> receiver_ ABSL_GUARDED_BY(mu_);
};

struct DecodeNode {
  std::shared_ptr<FakeNcclOps> ops;
  std::unique_ptr<TestDecodeService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  ~DecodeNode() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }
  // No reservation, no communicator left on this side.
  bool Released() {
    return service->leases().Stats().num_reserved == 0 && ops->num_live_comms() == 0 &&
           service->receiver()->num_peers() == 0;
  }
};

std::unique_ptr<DecodeNode> StartDecode(std::shared_ptr<FakeNcclFabric> fabric,
                                        absl::Duration transfer_timeout = absl::Seconds(5)) {
  auto node = std::make_unique<DecodeNode>();
  node->ops = std::make_shared<FakeNcclOps>(fabric);
  node->service = std::make_unique<TestDecodeService>(node->ops, transfer_timeout);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(node->service.get());
  node->server = b.BuildAndStart();
  TANDEM_CHECK(node->server != nullptr && port > 0);
  node->address = "127.0.0.1:" + std::to_string(port);
  return node;
}

NcclTransportOptions FastOptions() {
  NcclTransportOptions o;
  o.connect_timeout = absl::Seconds(5);
  o.transfer_timeout = absl::Seconds(5);
  return o;
}

absl::StatusOr<KvSendResult> SendKv(NcclKvTransport& t, const DecodeNode& node,
                                    const std::string& handle, const engine::KvExport& kv,
                                    const v1::KvCompatibility& compat = TestCompat()) {
  return t.Send(KvTransferTarget{node.address, handle, "req-" + handle}, compat, kv,
                absl::Now() + absl::Seconds(10));
}

// The leased KV of `handle` equals `kv`.
void ExpectLeased(DecodeNode& node, const std::string& handle, const engine::KvExport& kv) {
  absl::StatusOr<std::shared_ptr<const engine::KvExport>> got =
      node.service->leases().Claim(handle);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->token_ids, kv.token_ids);
  EXPECT_EQ((*got)->num_layers, kLayers);
  EXPECT_EQ((*got)->num_kv_heads, kHeads);
  EXPECT_EQ((*got)->head_dim, kDim);
  EXPECT_EQ((*got)->bytes_per_token, Bpt());
  EXPECT_TRUE((*got)->bytes == kv.bytes) << handle << ": payload differs";
  EXPECT_TRUE((*got)->Validate().ok());
}

class NcclTransportTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeNcclFabric> fabric_ = std::make_shared<FakeNcclFabric>();
  std::shared_ptr<FakeNcclOps> prefill_ops_ = std::make_shared<FakeNcclOps>(fabric_);
};

TEST_F(NcclTransportTest, TransfersAndReusesTheCommunicator) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  for (int i = 0; i < 3; ++i) {
    const int tokens = std::vector<int>{1, 17, 100}[i];
    const engine::KvExport kv = MakeKv(tokens, 10 + i);
    absl::StatusOr<KvSendResult> r = SendKv(t, *node, "h" + std::to_string(i), kv);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_bytes, static_cast<int64_t>(kv.bytes.size()));
    EXPECT_DOUBLE_EQ(r->lease_seconds, 30);
    ExpectLeased(*node, "h" + std::to_string(i), kv);
  }
  EXPECT_EQ(t.num_connects(), 1);
  EXPECT_TRUE(t.HasComm(node->address));
  EXPECT_EQ(node->service->received.load(), 3);
  EXPECT_EQ(node->service->receiver()->num_peers(), 1);
  EXPECT_EQ(node->ops->num_aborts(), 0);
  EXPECT_EQ(prefill_ops_->num_aborts(), 0);
}

TEST_F(NcclTransportTest, SplitsIntoSegmentsOfWholeBlocks) {
  auto node = StartDecode(fabric_);
  NcclTransportOptions o = FastOptions();
  o.max_segment_bytes = 2 * kBlock * Bpt();  // 2 blocks per send
  NcclKvTransport t(prefill_ops_, o);
  const engine::KvExport kv = MakeKv(5 * kBlock + 3, 7);  // 6 blocks -> 3 segments
  ASSERT_TRUE(SendKv(t, *node, "seg", kv).ok());
  EXPECT_EQ(prefill_ops_->num_sends(), 3);
  EXPECT_EQ(node->ops->num_recvs(), 3);
  ExpectLeased(*node, "seg", kv);
}

TEST_F(NcclTransportTest, RejectedHeaderNeverPostsTheSend) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  ASSERT_TRUE(SendKv(t, *node, "ok", MakeKv(4, 1)).ok());
  const int64_t sends = prefill_ops_->num_sends(), recvs = node->ops->num_recvs();

  v1::KvCompatibility other = TestCompat();
  other.set_model_fingerprint(43);
  other.set_hash(services::CompatHash(other));
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "bad", MakeKv(4, 2), other);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();

  node->service->free_bytes = 100;  // no room
  r = SendKv(t, *node, "full", MakeKv(4, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  node->service->free_bytes = int64_t{1} << 30;

  node->service->draining = true;
  r = SendKv(t, *node, "draining", MakeKv(4, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  node->service->draining = false;

  engine::KvExport big_id = MakeKv(4, 4);
  big_id.token_ids[2] = kVocab;  // outside the vocabulary
  r = SendKv(t, *node, "vocab", big_id);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  EXPECT_EQ(prefill_ops_->num_sends(), sends) << "a rejected header must not reach ncclSend";
  EXPECT_EQ(node->ops->num_recvs(), recvs);
  const KvLeaseStats s = node->service->leases().Stats();
  EXPECT_EQ(s.num_reserved, 0);
  EXPECT_EQ(s.num_leases, 1);  // "ok"
  // A rejection leaves the communicator alone.
  EXPECT_TRUE(t.HasComm(node->address));
  EXPECT_EQ(prefill_ops_->num_aborts(), 0);
  ASSERT_TRUE(SendKv(t, *node, "after", MakeKv(9, 5)).ok());
  EXPECT_EQ(t.num_connects(), 1);
}

TEST_F(NcclTransportTest, CompatMismatchRefusedAtConnect) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  v1::KvCompatibility other = TestCompat();
  other.set_block_size(32);
  other.set_hash(services::CompatHash(other));
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "x", MakeKv(4, 1), other);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(prefill_ops_->num_inits(), 0);
  EXPECT_EQ(node->ops->num_inits(), 0);
  EXPECT_EQ(prefill_ops_->num_sends(), 0);
}

TEST_F(NcclTransportTest, SendTimeoutAbortsAndReleasesBothSides) {
  auto node = StartDecode(fabric_);
  NcclTransportOptions o = FastOptions();
  o.transfer_timeout = absl::Milliseconds(300);
  NcclKvTransport t(prefill_ops_, o);
  prefill_ops_->faults().hang_send = true;
  const absl::Time start = absl::Now();
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "slow", MakeKv(40, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_NE(r.status().message().find(node->address), std::string::npos) << r.status();
  // Sender: its communicator aborted and dropped.
  EXPECT_FALSE(t.HasComm(node->address));
  EXPECT_EQ(prefill_ops_->num_aborts(), 1);
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  // Receiver: communicator aborted, reservation gone, nothing leased.
  EXPECT_TRUE(WaitFor([&] { return node->Released(); }));
  EXPECT_EQ(node->service->leases().Stats().num_leases, 0);
  EXPECT_EQ(node->service->leases().Stats().num_bytes, 0);
  EXPECT_EQ(node->service->receiver()->num_aborts(), 1);
  // The next transfer makes a new communicator.
  prefill_ops_->faults().hang_send = false;
  const engine::KvExport kv = MakeKv(40, 2);
  ASSERT_TRUE(SendKv(t, *node, "again", kv).ok());
  EXPECT_EQ(t.num_connects(), 2);
  ExpectLeased(*node, "again", kv);
}

TEST_F(NcclTransportTest, ReceiverTimeoutReleasesBothSides) {
  auto node = StartDecode(fabric_, absl::Milliseconds(200));
  NcclTransportOptions o = FastOptions();
  o.transfer_timeout = absl::Milliseconds(800);
  NcclKvTransport t(prefill_ops_, o);
  prefill_ops_->faults().hang_send = true;
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "slow", MakeKv(3, 1));
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status()) || absl::IsUnavailable(r.status()))
      << r.status();
  EXPECT_FALSE(t.HasComm(node->address));
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  EXPECT_TRUE(WaitFor([&] { return node->Released(); }));
  prefill_ops_->faults().hang_send = false;
  ASSERT_TRUE(SendKv(t, *node, "again", MakeKv(3, 2)).ok());
  EXPECT_EQ(t.num_connects(), 2);
}

TEST_F(NcclTransportTest, NcclErrorsAbortAndReleaseBothSides) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  // Sender-side error.
  prefill_ops_->faults().fail_send = true;
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "a", MakeKv(20, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  EXPECT_TRUE(WaitFor([&] { return node->Released(); }));
  prefill_ops_->faults().fail_send = false;
  // Receiver-side error.
  node->ops->faults().fail_recv = true;
  r = SendKv(t, *node, "b", MakeKv(20, 2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  EXPECT_TRUE(WaitFor([&] { return node->Released(); }));
  node->ops->faults().fail_recv = false;
  // Receiver's staging allocation fails: refused, reservation released.
  node->ops->faults().fail_alloc = true;
  r = SendKv(t, *node, "c", MakeKv(20, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(WaitFor([&] { return node->Released(); }));
  node->ops->faults().fail_alloc = false;
  // Each failure re-created the communicator; the next transfer works.
  const engine::KvExport kv = MakeKv(20, 4);
  ASSERT_TRUE(SendKv(t, *node, "d", kv).ok());
  ExpectLeased(*node, "d", kv);
  EXPECT_EQ(t.num_connects(), 4);
}

TEST_F(NcclTransportTest, InitTimeoutAndFailureLeaveNoCommunicator) {
  auto node = StartDecode(fabric_);
  NcclTransportOptions o = FastOptions();
  o.connect_timeout = absl::Milliseconds(300);
  NcclKvTransport t(prefill_ops_, o);
  node->ops->faults().hang_init = true;  // the decode side never joins
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "a", MakeKv(4, 1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status()) || absl::IsUnavailable(r.status()))
      << r.status();
  EXPECT_FALSE(t.HasComm(node->address));
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  node->ops->faults().hang_init = false;
  node->ops->faults().fail_init = true;  // the decode side fails at once
  const absl::Time start = absl::Now();
  r = SendKv(t, *node, "b", MakeKv(4, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(250)) << "the sender stops waiting at once";
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  EXPECT_EQ(node->service->receiver()->num_peers(), 0);
  node->ops->faults().fail_init = false;
  ASSERT_TRUE(SendKv(t, *node, "c", MakeKv(4, 1)).ok());
  EXPECT_EQ(t.num_connects(), 1);
}

TEST_F(NcclTransportTest, ReconnectsAfterTheReceiverRestarted) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  ASSERT_TRUE(SendKv(t, *node, "a", MakeKv(4, 1)).ok());
  node->service->Restart();  // forgets our communicator
  const engine::KvExport kv = MakeKv(30, 2);
  absl::StatusOr<KvSendResult> r = SendKv(t, *node, "b", kv);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(t.num_connects(), 2);
  ExpectLeased(*node, "b", kv);
  // A streamed handoff's `begin` gets ABORTED the same way: reconnect, retry.
  node->service->Restart();
  absl::StatusOr<std::unique_ptr<KvSendStream>> s =
      t.Open(KvTransferTarget{node->address, "c", "req-c"}, TestCompat(),
             KvSendPlan{kv.token_ids, kv.bytes_per_token}, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Write(kv.bytes).ok());
  ASSERT_TRUE((*s)->Finish().ok());
  EXPECT_EQ(t.num_connects(), 3);
  ExpectLeased(*node, "c", kv);
}

// A streamed `begin` the receiver refuses is the receiver's error; nothing
// was posted or reserved and the communicator stays.
TEST_F(NcclTransportTest, StreamedBeginRefusalsAreTheReceivers) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  const engine::KvExport kv = MakeKv(12, 3);
  auto open = [&](const v1::KvCompatibility& compat) {
    return t
        .Open(KvTransferTarget{node->address, "x", "req-x"}, compat,
              KvSendPlan{kv.token_ids, kv.bytes_per_token}, absl::Now() + absl::Seconds(10))
        .status();
  };
  ASSERT_TRUE(SendKv(t, *node, "ok", kv).ok());  // the communicator
  node->service->free_bytes = 100;
  EXPECT_EQ(open(TestCompat()).code(), absl::StatusCode::kResourceExhausted);
  node->service->free_bytes = int64_t{1} << 30;
  node->service->draining = true;
  EXPECT_EQ(open(TestCompat()).code(), absl::StatusCode::kUnavailable);
  node->service->draining = false;
  v1::KvCompatibility other = TestCompat();
  other.set_model_fingerprint(43);
  other.set_hash(services::CompatHash(other));
  EXPECT_EQ(open(other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(node->service->leases().Stats().num_reserved, 0);
  EXPECT_EQ(prefill_ops_->num_aborts(), 0);
  EXPECT_TRUE(t.HasComm(node->address));
  EXPECT_EQ(t.num_connects(), 1);
}

TEST_F(NcclTransportTest, ConcurrentTransfersToTwoReceivers) {
  auto a = StartDecode(fabric_);
  auto b = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  constexpr int kPerThread = 5;
  std::vector<engine::KvExport> kvs;
  for (int i = 0; i < 4 * kPerThread; ++i) kvs.push_back(MakeKv(1 + 13 * i % 90, 100 + i));
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      DecodeNode& node = th % 2 == 0 ? *a : *b;
      for (int i = 0; i < kPerThread; ++i) {
        const int k = th * kPerThread + i;
        absl::StatusOr<KvSendResult> r = SendKv(t, node, "k" + std::to_string(k), kvs[k]);
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 4 * kPerThread);
  EXPECT_EQ(t.num_connects(), 2);
  for (int th = 0; th < 4; ++th) {
    for (int i = 0; i < kPerThread; ++i) {
      const int k = th * kPerThread + i;
      ExpectLeased(th % 2 == 0 ? *a : *b, "k" + std::to_string(k), kvs[k]);
    }
  }
}

TEST_F(NcclTransportTest, TwoSendersToOneReceiver) {
  auto node = StartDecode(fabric_);
  auto other_ops = std::make_shared<FakeNcclOps>(fabric_);
  NcclKvTransport t1(prefill_ops_, FastOptions()), t2(other_ops, FastOptions());
  ASSERT_NE(t1.peer_id(), t2.peer_id());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < 4; ++i) {
        absl::StatusOr<KvSendResult> r =
            SendKv(s == 0 ? t1 : t2, *node, absl::StrCat("s", s, "-", i), MakeKv(20, s * 10 + i));
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(node->service->receiver()->num_peers(), 2);
}

// ---- streamed handoffs (Open / Write / Finish: what a prefill worker uses) ---

std::unique_ptr<KvSendStream> OpenKv(NcclKvTransport& t, const DecodeNode& node,
                                     const std::string& handle, const engine::KvExport& kv) {
  absl::StatusOr<std::unique_ptr<KvSendStream>> s =
      t.Open(KvTransferTarget{node.address, handle, "req-" + handle}, TestCompat(),
             KvSendPlan{kv.token_ids, kv.bytes_per_token}, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Tokens [from, to) of kv as one piece: host bytes, or a copy in "device"
// memory of the fake ops' domain ("cpu": host memory) for WriteDevice.
absl::Status WriteTokens(KvSendStream& s, const engine::KvExport& kv, int from, int to,
                         bool device = false) {
  const std::string_view piece =
      std::string_view(kv.bytes).substr(from * Bpt(), (to - from) * Bpt());
  if (!device) return s.Write(piece);
  char* mem = new char[piece.size()];
  std::copy(piece.begin(), piece.end(), mem);
  return s.WriteDevice(
      std::make_shared<engine::KvDeviceBytes>(mem, static_cast<int64_t>(piece.size()), "cpu",
                                              [](void* p) { delete[] static_cast<char*>(p); }));
}

// Each piece is one round that has landed on the receiver when Write
// returns, while the handoff is still open (reserved, not leased); the
// pieces are split into segments of at most max_segment_bytes.
TEST_F(NcclTransportTest, StreamsEachPieceAsItIsWritten) {
  for (const bool device : {false, true}) {
    SCOPED_TRACE(device ? "device pieces" : "host pieces");
    auto node = StartDecode(fabric_);
    NcclTransportOptions o = FastOptions();
    o.max_segment_bytes = 8 * Bpt();
    auto ops = std::make_shared<FakeNcclOps>(fabric_);  // the previous case's was aborted
    NcclKvTransport t(ops, o);
    const KvLeaseTable& leases = node->service->leases();
    const engine::KvExport kv = MakeKv(45, device ? 4 : 3);
    const std::string handle = device ? "dev" : "host";
    std::unique_ptr<KvSendStream> s = OpenKv(t, *node, handle, kv);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(leases.Stats().num_reserved, 1) << "`begin` reserves the whole size";
    const int64_t recvs = node->ops->num_recvs();
    EXPECT_EQ(recvs, 0) << "`begin` posts nothing";
    ASSERT_TRUE(WriteTokens(*s, kv, 0, 16, device).ok());  // 8 + 8
    EXPECT_EQ(node->ops->num_recvs(), 2);
    ASSERT_TRUE(WriteTokens(*s, kv, 16, 38, device).ok());  // 8 + 8 + 6
    EXPECT_EQ(node->ops->num_recvs(), 5);
    EXPECT_EQ(leases.Stats().num_reserved, 1);
    EXPECT_EQ(leases.Stats().num_leases, 0);
    ASSERT_TRUE(WriteTokens(*s, kv, 38, 45, device).ok());
    absl::StatusOr<KvSendResult> r = s->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_bytes, static_cast<int64_t>(kv.bytes.size()));
    EXPECT_EQ(node->ops->num_recvs(), 6);
    ExpectLeased(*node, handle, kv);
    EXPECT_EQ(leases.Stats().num_reserved, 0);
    EXPECT_EQ(t.num_connects(), 1);
    EXPECT_EQ(ops->num_aborts(), 0);
  }
}

// The pair's communicator is held for a round, not for a handoff: a second
// handoff to the same decode worker completes while the first is still
// waiting for its next piece (no head-of-line blocking behind a prefill).
TEST_F(NcclTransportTest, HandoffsToOneWorkerInterleave) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  const engine::KvExport a = MakeKv(40, 1), b = MakeKv(30, 2);
  std::unique_ptr<KvSendStream> sa = OpenKv(t, *node, "a", a);
  ASSERT_NE(sa, nullptr);
  ASSERT_TRUE(WriteTokens(*sa, a, 0, 20).ok());
  std::unique_ptr<KvSendStream> sb = OpenKv(t, *node, "b", b);
  ASSERT_NE(sb, nullptr);
  ASSERT_TRUE(WriteTokens(*sb, b, 0, 30).ok());
  ASSERT_TRUE(sb->Finish().ok());
  ExpectLeased(*node, "b", b);
  EXPECT_EQ(node->service->leases().Stats().num_reserved, 1);  // a's
  ASSERT_TRUE(WriteTokens(*sa, a, 20, 40).ok());
  ASSERT_TRUE(sa->Finish().ok());
  ExpectLeased(*node, "a", a);
  EXPECT_EQ(t.num_connects(), 1);
}

// Many handoffs to one worker from several threads at once, each in
// several pieces: the rounds of all of them share one communicator, and
// every payload lands where it belongs.
TEST_F(NcclTransportTest, ConcurrentStreamedHandoffsShareOnePair) {
  auto node = StartDecode(fabric_);
  NcclTransportOptions o = FastOptions();
  o.max_segment_bytes = 5 * Bpt();
  NcclKvTransport t(prefill_ops_, o);
  constexpr int kThreads = 4, kPerThread = 6;
  std::vector<engine::KvExport> kvs;
  for (int i = 0; i < kThreads * kPerThread; ++i) kvs.push_back(MakeKv(3 + 11 * i % 57, 200 + i));
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        const int k = th * kPerThread + i;
        const engine::KvExport& kv = kvs[k];
        const int n = static_cast<int>(kv.token_ids.size());
        std::unique_ptr<KvSendStream> s = OpenKv(t, *node, "k" + std::to_string(k), kv);
        if (s == nullptr) continue;
        bool good = true;
        for (int from = 0; from < n && good; from += 7) {  // pieces of 7 tokens
          good = WriteTokens(*s, kv, from, std::min(n, from + 7), /*device=*/k % 2 == 1).ok();
        }
        absl::StatusOr<KvSendResult> r = s->Finish();
        EXPECT_TRUE(good && r.ok()) << r.status();
        if (good && r.ok()) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  EXPECT_EQ(t.num_connects(), 1);
  EXPECT_EQ(prefill_ops_->num_aborts(), 0);
  for (int k = 0; k < kThreads * kPerThread; ++k) {
    ExpectLeased(*node, "k" + std::to_string(k), kvs[k]);
  }
}

// Dropped (or cancelled) between pieces no NCCL operation is in flight: the
// receiver frees the reservation and both sides keep the communicator.
TEST_F(NcclTransportTest, HandoffDroppedBetweenPiecesKeepsTheCommunicator) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  const KvLeaseTable& leases = node->service->leases();
  const engine::KvExport kv = MakeKv(30, 5);
  std::unique_ptr<KvSendStream> s = OpenKv(t, *node, "dropped", kv);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(WriteTokens(*s, kv, 0, 10).ok());
  s.reset();
  EXPECT_TRUE(WaitFor([&] { return leases.Stats().num_reserved == 0; }));
  s = OpenKv(t, *node, "cancelled", kv);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(WriteTokens(*s, kv, 0, 10).ok());
  s->Cancel();
  const absl::Status st = WriteTokens(*s, kv, 10, 30);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_FALSE(s->Finish().ok());
  EXPECT_TRUE(WaitFor([&] { return leases.Stats().num_reserved == 0; }));
  EXPECT_EQ(leases.Stats().num_leases, 0);
  EXPECT_EQ(leases.Stats().num_bytes, 0);
  EXPECT_EQ(prefill_ops_->num_aborts(), 0);
  EXPECT_EQ(node->ops->num_aborts(), 0);
  EXPECT_TRUE(t.HasComm(node->address));
  ASSERT_TRUE(SendKv(t, *node, "after", kv).ok());
  ExpectLeased(*node, "after", kv);
  EXPECT_EQ(t.num_connects(), 1);
}

// A round that fails (here a hung ncclSend) aborts the pair's communicator
// on both sides; another handoff open on the same pair fails at its next
// piece; every reservation is released; the next handoff reconnects.
TEST_F(NcclTransportTest, FailedRoundAbortsThePairAndFailsItsOpenHandoffs) {
  auto node = StartDecode(fabric_);
  NcclTransportOptions o = FastOptions();
  o.transfer_timeout = absl::Milliseconds(300);
  NcclKvTransport t(prefill_ops_, o);
  const engine::KvExport a = MakeKv(20, 1), b = MakeKv(20, 2);
  std::unique_ptr<KvSendStream> sa = OpenKv(t, *node, "a", a);
  std::unique_ptr<KvSendStream> sb = OpenKv(t, *node, "b", b);
  ASSERT_TRUE(sa != nullptr && sb != nullptr);
  ASSERT_TRUE(WriteTokens(*sa, a, 0, 10).ok());
  prefill_ops_->faults().hang_send = true;
  absl::Status st = WriteTokens(*sa, a, 10, 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find(node->address), std::string::npos) << st;
  EXPECT_FALSE(t.HasComm(node->address));
  prefill_ops_->faults().hang_send = false;
  st = WriteTokens(*sb, b, 0, 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(sb->Finish().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(prefill_ops_->num_live_comms(), 0);
  EXPECT_TRUE(WaitFor([&] { return node->Released(); }));
  EXPECT_EQ(node->service->leases().Stats().num_leases, 0);
  ASSERT_TRUE(SendKv(t, *node, "again", b).ok());
  ExpectLeased(*node, "again", b);
  EXPECT_EQ(t.num_connects(), 2);
}

// Pieces must be whole tokens and add up to what Open declared; a misuse
// fails the handoff without touching the communicator.
TEST_F(NcclTransportTest, StreamedPiecesMustBeWholeDeclaredTokens) {
  auto node = StartDecode(fabric_);
  NcclKvTransport t(prefill_ops_, FastOptions());
  const engine::KvExport kv = MakeKv(10, 6);
  std::unique_ptr<KvSendStream> s = OpenKv(t, *node, "partial", kv);
  ASSERT_NE(s, nullptr);
  absl::Status st = s->Write(std::string_view(kv.bytes).substr(0, Bpt() + Bpt() / 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(s->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  s = OpenKv(t, *node, "more", kv);
  ASSERT_TRUE(WriteTokens(*s, kv, 0, 6).ok());
  st = WriteTokens(*s, kv, 0, 6);  // 12 of 10 tokens
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  s = OpenKv(t, *node, "fewer", kv);
  ASSERT_TRUE(WriteTokens(*s, kv, 0, 6).ok());
  EXPECT_EQ(s->Finish().status().code(), absl::StatusCode::kInvalidArgument);
  s.reset();
  EXPECT_TRUE(WaitFor([&] { return node->service->leases().Stats().num_reserved == 0; }));
  EXPECT_EQ(node->service->leases().Stats().num_leases, 0);
  EXPECT_EQ(prefill_ops_->num_aborts(), 0);
  EXPECT_TRUE(t.HasComm(node->address));
}

// ---- the receiver against a hostile / confused peer --------------------------

class NcclReceiverProtocolTest : public NcclTransportTest {
 protected:
  void SetUp() override {
    node_ = StartDecode(fabric_);
    stub_ = v1::DecodeWorker::NewStub(MakeWorkerChannel(node_->address));
  }
  grpc::Status Push(const v1::NcclPushKvRequest& first) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto s = stub_->NcclPushKv(&ctx);
    s->Write(first);
    s->WritesDone();
    v1::NcclPushKvResponse resp;
    while (s->Read(&resp)) {
    }
    return s->Finish();
  }
  v1::NcclPushKvRequest Begin(int tokens) {
    const engine::KvExport kv = MakeKv(tokens, 1);
    v1::NcclPushKvRequest req;
    auto* b = req.mutable_begin();
    b->set_peer_id("nobody");
    b->set_comm_generation(1);
    *b->mutable_header() = HostKvTransport::MakeHeader(
        {node_->address, "h", "r"}, TestCompat(), KvSendPlan{kv.token_ids, kv.bytes_per_token});
    b->set_blocks_per_segment(1);
    return req;
  }
  std::unique_ptr<DecodeNode> node_;
  std::unique_ptr<v1::DecodeWorker::Stub> stub_;
};

TEST_F(NcclReceiverProtocolTest, RefusesBadMessagesBeforeAnyNcclOperation) {
  v1::NcclPushKvRequest sent;
  sent.mutable_sent();
  EXPECT_EQ(Push(sent).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::NcclPushKvRequest r = Begin(20);
  r.mutable_begin()->set_blocks_per_segment(0);
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Begin(20);
  r.mutable_begin()->set_blocks_per_segment(3);  // 2 blocks only
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Begin(20);
  r.mutable_begin()->mutable_header()->set_total_bytes(19 * Bpt());
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Begin(20);
  r.mutable_begin()->mutable_header()->set_bytes_per_token(Bpt() * 2);
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The token-major (GPU-resident) form: segments of whole tokens summing to
  // the header's, blocks_per_segment 0.
  for (const std::vector<int64_t>& bad :
       std::vector<std::vector<int64_t>>{{19}, {10, 11}, {0, 20}, {-1, 21}, {20, 0}}) {
    r = Begin(20);
    r.mutable_begin()->set_blocks_per_segment(0);
    for (int64_t n : bad) r.mutable_begin()->add_token_segments(n);
    EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.size();
  }
  r = Begin(20);
  r.mutable_begin()->add_token_segments(20);  // and blocks_per_segment 1
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Begin(20);  // valid, but no communicator with "nobody"
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::ABORTED);
  r.mutable_begin()->set_blocks_per_segment(0);
  r.mutable_begin()->add_token_segments(7);
  r.mutable_begin()->add_token_segments(13);
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::ABORTED);

  v1::NcclConnectRequest c;
  c.set_peer_id("p");
  c.set_unique_id("short");
  *c.mutable_compat() = TestCompat();
  grpc::ClientContext ctx;
  v1::NcclConnectResponse resp;
  EXPECT_EQ(stub_->NcclConnect(&ctx, c, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  c.set_unique_id(std::string(kNcclUniqueIdBytes, 'x'));
  c.set_peer_id("");
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->NcclConnect(&ctx2, c, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  EXPECT_EQ(node_->ops->num_recvs(), 0);
  EXPECT_EQ(node_->ops->num_inits(), 0);
  const KvLeaseStats s = node_->service->leases().Stats();
  EXPECT_EQ(s.num_reserved + s.num_leases, 0);
}

TEST_F(NcclReceiverProtocolTest, StaleGenerationIsAborted) {
  NcclTransportOptions o = FastOptions();
  o.peer_id = "nobody";
  NcclKvTransport t(prefill_ops_, o);
  ASSERT_TRUE(SendKv(t, *node_, "first", MakeKv(5, 1)).ok());  // generation 1
  v1::NcclPushKvRequest r = Begin(20);
  r.mutable_begin()->set_comm_generation(7);
  EXPECT_EQ(Push(r).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(node_->service->leases().Stats().num_reserved, 0);
}

// A streamed push from a confused peer: every bad message is refused before
// anything is posted for it, the reservation is released and the
// communicator stays.
TEST_F(NcclReceiverProtocolTest, StreamedPushRefusesBadRounds) {
  NcclTransportOptions o = FastOptions();
  o.peer_id = "nobody";
  NcclKvTransport t(prefill_ops_, o);
  ASSERT_TRUE(SendKv(t, *node_, "first", MakeKv(5, 1)).ok());  // generation 1
  const int64_t recvs = node_->ops->num_recvs();
  auto streamed_begin = [&] {
    v1::NcclPushKvRequest r = Begin(20);
    r.mutable_begin()->set_blocks_per_segment(0);
    r.mutable_begin()->set_streamed(true);
    return r;
  };
  auto segment = [](std::vector<int64_t> tokens) {
    v1::NcclPushKvRequest r;
    for (int64_t n : tokens) r.mutable_segment()->add_token_segments(n);
    return r;
  };
  v1::NcclPushKvRequest sent;
  sent.mutable_sent();
  // `begin` then `rest`: the status, and whether `begin` was accepted.
  auto push = [&](const v1::NcclPushKvRequest& begin,
                  const std::vector<v1::NcclPushKvRequest>& rest, bool* ready) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto s = stub_->NcclPushKv(&ctx);
    v1::NcclPushKvResponse resp;
    *ready = s->Write(begin) && s->Read(&resp) && resp.has_ready();
    for (const auto& m : rest) s->Write(m);
    s->WritesDone();
    while (s->Read(&resp)) {
    }
    return s->Finish();
  };
  bool ready = false;
  v1::NcclPushKvRequest b = streamed_begin();
  b.mutable_begin()->set_blocks_per_segment(1);
  EXPECT_EQ(push(b, {}, &ready).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(ready);
  b = streamed_begin();
  b.mutable_begin()->add_token_segments(20);
  EXPECT_EQ(push(b, {}, &ready).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  struct Case {
    const char* name;
    std::vector<v1::NcclPushKvRequest> rest;
    grpc::StatusCode code;
  };
  const Case cases[] = {
      {"more tokens than declared", {segment({21})}, grpc::StatusCode::INVALID_ARGUMENT},
      {"an empty segment", {segment({0, 5})}, grpc::StatusCode::INVALID_ARGUMENT},
      {"no segments", {segment({})}, grpc::StatusCode::INVALID_ARGUMENT},
      {"`sent` before every token", {sent}, grpc::StatusCode::INVALID_ARGUMENT},
      {"a second `begin`", {streamed_begin()}, grpc::StatusCode::INVALID_ARGUMENT},
      {"the stream closed", {}, grpc::StatusCode::CANCELLED},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(push(streamed_begin(), c.rest, &ready).error_code(), c.code);
    EXPECT_TRUE(ready);
    EXPECT_EQ(node_->service->leases().Stats().num_reserved, 0);
  }
  EXPECT_EQ(node_->ops->num_recvs(), recvs) << "nothing posted for a refused round";
  EXPECT_EQ(node_->ops->num_aborts(), 0);
  EXPECT_EQ(node_->service->leases().Stats().num_leases, 1);  // "first"
  // The communicator is still good for a streamed handoff.
  const engine::KvExport kv = MakeKv(12, 9);
  std::unique_ptr<KvSendStream> s = OpenKv(t, *node_, "streamed", kv);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(WriteTokens(*s, kv, 0, 12).ok());
  ASSERT_TRUE(s->Finish().ok());
  ExpectLeased(*node_, "streamed", kv);
  EXPECT_EQ(t.num_connects(), 1);
}

TEST(NcclTransportKindTest, FlagValuesAndMissingGpu) {
  EXPECT_TRUE(CheckKvTransportKind("host").ok());
  EXPECT_TRUE(CheckKvTransportKind("nccl").ok());
  EXPECT_EQ(CheckKvTransportKind("rdma").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeKvTransport("rdma", nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(MakeKvTransport("host", nullptr).ok());
  absl::StatusOr<std::shared_ptr<NcclOps>> host = NcclOpsForTransport("host", nullptr);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(*host, nullptr);
  absl::StatusOr<std::shared_ptr<NcclOps>> cuda = MakeCudaNcclOps(0);
  if (cuda.ok()) GTEST_SKIP() << "a CUDA device is present (NCCL built in)";
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(cuda.status().message().find(NcclBuiltIn() ? "CUDA device" : "no NCCL"),
            std::string::npos)
      << cuda.status();
  EXPECT_EQ(MakeKvTransport("nccl", nullptr).status().code(), absl::StatusCode::kUnavailable);
}

// ---- real Prefill / Decode servers with --kv-transport=nccl on the fake -------

class NcclWorkersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new engine::TinyModel(engine::LoadTinyModel(engine::DefaultTinyShape()));
  }
  static void TearDownTestSuite() { delete tiny_; }
  services::WorkerServerConfig Config(std::shared_ptr<NcclOps> ops) {
    services::WorkerServerConfig c;
    c.file = tiny_->file.get();
    c.model = tiny_->model.get();
    c.model_name = "tiny";
    c.engine = engine::TinyEngineConfig(64);
    c.kv_transport = "nccl";
    c.nccl_ops = std::move(ops);
    return c;
  }
  // A prefill and a decode server on one fake NCCL fabric (destroyed, and
  // so shut down, prefill first).
  struct Workers {
    std::shared_ptr<FakeNcclOps> pops, dops;
    std::unique_ptr<decode::DecodeServer> d;
    std::unique_ptr<prefill::PrefillServer> p;
    std::unique_ptr<v1::PrefillWorker::Stub> ps;
  };
  // The ops' memory domains: "cpu" (the CPU executors') makes that side
  // GPU-resident (no staging), anything else stages through the host.
  // prefill_chunk > 0: the prefill engine's token budget per step (chunked
  // prefill).
  void StartWorkers(Workers* w, const std::string& prefill_domain = "cpu",
                    const std::string& decode_domain = "cpu", int64_t prefill_chunk = 0) {
    auto fabric = std::make_shared<FakeNcclFabric>();
    w->pops = std::make_shared<FakeNcclOps>(fabric, prefill_domain);
    w->dops = std::make_shared<FakeNcclOps>(fabric, decode_domain);
    services::WorkerServerConfig pc = Config(w->pops);
    if (prefill_chunk > 0) pc.engine.scheduler.max_num_batched_tokens = prefill_chunk;
    auto p = prefill::PrefillServer::Start(pc);
    ASSERT_TRUE(p.ok()) << p.status();
    w->p = *std::move(p);
    auto d = decode::DecodeServer::Start(Config(w->dops));
    ASSERT_TRUE(d.ok()) << d.status();
    w->d = *std::move(d);
    w->ps = v1::PrefillWorker::NewStub(MakeWorkerChannel(w->p->address()));
  }
  static v1::PrefillRequest MakePrefill(const engine::EngineRequest& r, const std::string& handle,
                                        const std::string& decode_address) {
    v1::PrefillRequest pr;
    pr.set_request_id(handle);
    for (int32_t t : r.prompt_token_ids) pr.add_prompt_token_ids(t);
    services::ToProto(r.params, pr.mutable_params());
    pr.set_decode_address(decode_address);
    pr.set_kv_handle(handle);
    return pr;
  }
  void RunHandoffs(const std::string& prefill_domain, const std::string& decode_domain,
                   int64_t prefill_chunk = 0);
  // Decodes `handle` (prefilled as pr, first token `first`) on w.d: all the
  // tokens, the first included.
  static std::vector<int32_t> Decode(Workers& w, const v1::PrefillRequest& pr, int32_t first);
  static engine::TinyModel* tiny_;
};
engine::TinyModel* NcclWorkersTest::tiny_ = nullptr;

// Every combination of the two sides' paths gives the colocated tokens:
//   cpu -> cpu: the GPU-resident form end to end: the prefill side sends the
//     engine's chunks where they are (no staging: its ops never allocate),
//     the decode side receives into new ops memory that the lease holds
//     until Decode writes it into the cache (then it is freed);
//   staged -> cpu: host pieces uploaded through the prefill side's staging
//     buffers, the decode side receives into host bytes;
//   cpu -> staged: the prefill chunks sent where they are, downloaded
//     token-major through the decode side's staging buffers.
// Each case once with whole prompts per step and once with chunked prefill
// (16 tokens a step): then every chunk is its own round, sent while the
// next chunk computes.
TEST_F(NcclWorkersTest, PrefillToDecodeOverNcclMatchesColocated) {
  struct Case {
    std::string prefill_domain, decode_domain;
  };
  for (const Case& c :
       {Case{"cpu", "cpu"}, Case{"fake-device", "cpu"}, Case{"cpu", "fake-device"}}) {
    for (const int64_t chunk : {0, 16}) {
      SCOPED_TRACE(absl::StrCat(c.prefill_domain, " -> ", c.decode_domain, ", chunk ", chunk));
      ASSERT_NO_FATAL_FAILURE(RunHandoffs(c.prefill_domain, c.decode_domain, chunk));
    }
  }
}

std::vector<int32_t> NcclWorkersTest::Decode(Workers& w, const v1::PrefillRequest& pr,
                                             int32_t first) {
  auto ds = v1::DecodeWorker::NewStub(MakeWorkerChannel(w.d->address()));
  std::vector<int32_t> tokens = {first};
  v1::DecodeRequest dr;
  dr.set_request_id(pr.kv_handle());
  dr.set_kv_handle(pr.kv_handle());
  *dr.mutable_prompt_token_ids() = pr.prompt_token_ids();
  dr.set_first_token_id(first);
  *dr.mutable_params() = pr.params();
  grpc::ClientContext dctx;
  auto reader = ds->Decode(&dctx, dr);
  v1::DecodeResponse resp;
  while (reader->Read(&resp)) {
    for (int32_t t : resp.token_ids()) tokens.push_back(t);
  }
  const grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  return tokens;
}

void NcclWorkersTest::RunHandoffs(const std::string& prefill_domain,
                                  const std::string& decode_domain, int64_t prefill_chunk) {
  const bool resident = prefill_domain == "cpu" && decode_domain == "cpu";
  Workers w;
  ASSERT_NO_FATAL_FAILURE(StartWorkers(&w, prefill_domain, decode_domain, prefill_chunk));
  int64_t rounds = 0;  // one per engine chunk
  for (int i = 0; i < 3; ++i) {
    engine::EngineRequest r =
        engine::MakeRequest(engine::RandomPrompt(5 + 21 * i, 256, 70 + i), 6, 0.0, 9 + i);
    const engine::CollectedOutput alone = engine::RunAlone(tiny_->model.get(), r);
    const std::string handle = "n" + std::to_string(i);
    const v1::PrefillRequest pr = MakePrefill(r, handle, w.d->address());
    v1::PrefillResponse presp;
    grpc::ClientContext pctx;
    grpc::Status st = testing::CallPrefill(*w.ps, &pctx, pr, &presp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_GT(presp.kv_bytes(), 0);
    // Held by the lease in new ops memory on the resident path (a
    // block-packed push lands in the kept staging buffers, also counted).
    if (resident) {
      WaitForBackgroundFrees();  // the previous request's buffer
      EXPECT_EQ(w.dops->live_device_bytes(), presp.kv_bytes());
    }
    EXPECT_EQ(Decode(w, pr, presp.first_token_id()), alone.token_ids) << "request " << i;
    const int64_t n = static_cast<int64_t>(r.prompt_token_ids.size());
    rounds += prefill_chunk > 0 ? (n + prefill_chunk - 1) / prefill_chunk : 1;
  }
  EXPECT_EQ(w.pops->num_inits(), 1);
  EXPECT_EQ(w.pops->num_sends(), rounds);
  EXPECT_EQ(w.dops->num_recvs(), rounds);
  EXPECT_EQ(w.d->service().leases().Stats().num_leases, 0);
  // No staging buffer on a resident side; the leases' memory went back.
  EXPECT_EQ(w.pops->live_device_bytes() == 0, prefill_domain == "cpu");
  if (resident) {
    WaitForBackgroundFrees();
    EXPECT_EQ(w.dops->live_device_bytes(), 0);
  }
}

// The router cancels a Prefill call while its KV is in flight over NCCL
// (the send hangs, or the peer never joins the communicator): the call ends
// at once instead of after the 60 s transfer / connect timeout, both ranks
// abort their communicator, the receiver drops its reservation, and the
// next transfer makes a new communicator.
TEST_F(NcclWorkersTest, CancellingPrefillAbortsTheNcclTransfer) {
  Workers w;
  ASSERT_NO_FATAL_FAILURE(StartWorkers(&w));
  const KvLeaseTable& leases = w.d->service().leases();
  const engine::EngineRequest r = engine::MakeRequest(engine::RandomPrompt(37, 256, 5), 6, 0.0, 3);
  struct Case {
    const char* name;
    std::atomic<bool>* fault;
  };
  const Case cases[] = {{"hung ncclSend", &w.pops->faults().hang_send},
                        {"peer never joins the communicator", &w.pops->faults().hang_init}};
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    c.fault->store(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(50)));
    std::thread canceller([&] {
      absl::SleepFor(absl::Milliseconds(500));
      ctx.TryCancel();
    });
    const absl::Time start = absl::Now();
    v1::PrefillResponse resp;
    const grpc::Status st = testing::CallPrefill(
        *w.ps, &ctx, MakePrefill(r, absl::StrCat("c", n++), w.d->address()), &resp);
    canceller.join();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
    // The worker's handler ends well before any transport timeout.
    EXPECT_TRUE(WaitFor([&] { return w.pops->num_live_comms() == 0; }, absl::Seconds(5)))
        << "prefill side still holds a communicator";
    EXPECT_LT(absl::Now() - start, absl::Seconds(8));
    EXPECT_TRUE(WaitFor([&] { return w.dops->num_live_comms() == 0; }, absl::Seconds(5)))
        << "decode side still holds a communicator";
    EXPECT_TRUE(
        WaitFor([&] { return leases.Stats().num_leases == 0 && leases.Stats().num_bytes == 0; }));
    // The GPU-resident receive buffer went with the reservation.
    EXPECT_TRUE(WaitFor([&] { return w.dops->live_device_bytes() == 0; }))
        << w.dops->live_device_bytes() << " bytes of receive buffer left";
    c.fault->store(false);
  }
  EXPECT_EQ(w.pops->num_inits(), 1);  // the hung init never made one
  // Nothing is left behind: the next request transfers on a new communicator.
  v1::PrefillResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status st =
      testing::CallPrefill(*w.ps, &ctx, MakePrefill(r, "after", w.d->address()), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_GT(resp.kv_bytes(), 0);
  EXPECT_EQ(w.pops->num_inits(), 2);
  EXPECT_EQ(leases.Stats().num_leases, 1);
}

TEST_F(NcclWorkersTest, HostDecodeWorkerRefusesNccl) {
  auto fabric = std::make_shared<FakeNcclFabric>();
  services::WorkerServerConfig dc = Config(nullptr);
  dc.kv_transport = "host";
  auto d = decode::DecodeServer::Start(dc);
  ASSERT_TRUE(d.ok()) << d.status();
  NcclKvTransport t(std::make_shared<FakeNcclOps>(fabric), FastOptions());
  engine::KvExport kv;
  kv.token_ids = {1, 2};
  kv.num_layers = 1;
  kv.num_kv_heads = 1;
  kv.head_dim = 1;
  kv.bytes_per_token = 8;
  kv.bytes.assign(16, 'x');
  EXPECT_EQ((*d)->service().nccl_receiver(), nullptr);
  absl::StatusOr<KvSendResult> r = t.Send({(*d)->address(), "h", "r"}, v1::KvCompatibility(), kv,
                                          absl::Now() + absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
}

TEST_F(NcclWorkersTest, NcclWithoutAGpuFailsAtStart) {
  if (MakeCudaNcclOps(0).ok()) GTEST_SKIP() << "a CUDA device is present";
  services::WorkerServerConfig c = Config(nullptr);  // the CUDA ops
  auto p = prefill::PrefillServer::Start(c);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  auto d = decode::DecodeServer::Start(c);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable) << d.status();
}

}  // namespace
}  // namespace tandem::transfer
