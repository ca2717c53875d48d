// The NCCL KV transport on real CUDA + NCCL (tests/gpu/run.sh). Every test
// skips without a device. NCCL refuses two ranks on one GPU ("Duplicate GPU
// detected"), so on one GPU the data path runs as a one-rank communicator
// sending to itself (grouped ncclSend / ncclRecv to the own rank) through the
// transport's own functions (nccl_kv_path.h: packing, upload, grouped sends
// and receives, download, unpacking); the two-rank path is the same code
// split over two ranks, and runs end to end (sender + receiver over gRPC)
// when two GPUs are visible.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "services/common/compat.h"
#include "services/transfer/kv_block_packing.h"
#include "services/transfer/kv_lease_table.h"
#include "services/transfer/nccl_kv_path.h"
#include "services/transfer/nccl_kv_transport.h"
#include "services/transfer/nccl_ops.h"
#include "services/transfer/nccl_receiver.h"

namespace tandem::transfer {
namespace {

std::shared_ptr<NcclOps> OpsOrNull(int device) {
  absl::StatusOr<std::shared_ptr<NcclOps>> ops = MakeCudaNcclOps(device);
  return ops.ok() ? *ops : nullptr;
}

#define REQUIRE_DEVICE(ops, device)                                                          \
  std::shared_ptr<NcclOps> ops = OpsOrNull(device);                                          \
  if (ops == nullptr) {                                                                      \
    GTEST_SKIP() << "no CUDA device " << device << ": " << MakeCudaNcclOps(device).status(); \
  }

std::string RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(s.data() + i, &v, 8);
  }
  for (int64_t i = n / 8 * 8; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// A one-rank communicator and a stream on `ops` (the single-GPU loopbacks),
// released at the end of the scope; ok() false with the reason in status.
struct SelfComm {
  explicit SelfComm(NcclOps& o) : ops(o) {
    absl::StatusOr<NcclUniqueId> id = ops.GetUniqueId();
    if (!id.ok()) {
      status = id.status();
      return;
    }
    absl::StatusOr<NcclOps::Comm> c = ops.CommInitRank(*id, 1, 0, In(absl::Seconds(60)), {});
    absl::StatusOr<NcclOps::Stream> s = ops.StreamCreate();
    if (c.ok()) comm = *c;
    if (s.ok()) stream = *s;
    status = !c.ok() ? c.status() : s.status();
  }
  ~SelfComm() {
    ops.StreamDestroy(stream);
    ops.CommAbort(comm);
  }
  bool ok() const { return status.ok(); }
  NcclOps& ops;
  NcclOps::Comm comm = nullptr;
  NcclOps::Stream stream = nullptr;
  absl::Status status;
};

TEST(NcclGpuTest, CopiesThroughDeviceMemory) {
  REQUIRE_DEVICE(ops, 0);
  absl::StatusOr<NcclOps::Stream> stream = ops->StreamCreate();
  ASSERT_TRUE(stream.ok()) << stream.status();
  {
    NcclStaging a(ops.get()), b(ops.get());
    const int64_t n = (int64_t{3} << 20) + 7;
    ASSERT_TRUE(a.Reserve(n).ok());
    ASSERT_TRUE(b.Reserve(n).ok());
    const std::string src = RandomBytes(n, 1);
    std::memcpy(a.host(), src.data(), n);
    ASSERT_TRUE(ops->CopyToDevice(a.device(), a.host(), n, *stream).ok());
    // device a -> host b through a second upload/download pair.
    ASSERT_TRUE(ops->CopyToHost(b.host(), a.device(), n, *stream).ok());
    ASSERT_TRUE(ops->WaitStream(nullptr, *stream, In(absl::Seconds(30))).ok());
    EXPECT_EQ(std::string(b.host(), n), src);
  }
  ops->StreamDestroy(*stream);
}

struct Geometry {
  int64_t tokens, block_size, layers, row_floats;
};

// One rank sending to itself through the transport's data path.
TEST(NcclGpuTest, OneRankLoopbackThroughTheTransportPath) {
  REQUIRE_DEVICE(ops, 0);
  SelfComm self(*ops);
  ASSERT_TRUE(self.ok()) << self.status;
  NcclOps::Comm* comm = &self.comm;
  NcclOps::Stream* stream = &self.stream;
  {
    NcclStaging send(ops.get()), recv(ops.get());
    // Awkward sizes (1 token, partial last blocks, many layers), then
    // SmolLM2-135M's geometry (30 layers, 3 KV heads x 64, f32) at 2048 tokens.
    const std::vector<Geometry> cases = {{1, 16, 1, 1}, {17, 16, 2, 3},    {100, 16, 30, 8},
                                         {5, 1, 4, 2},  {257, 256, 2, 64}, {2048, 16, 30, 192}};
    for (const Geometry& g : cases) {
      const int64_t bpt = 2 * g.layers * g.row_floats * 4;
      absl::StatusOr<KvBlockLayout> l = MakeKvBlockLayout(g.tokens, bpt, g.block_size, g.layers);
      ASSERT_TRUE(l.ok()) << l.status();
      const std::string payload = RandomBytes(l->payload_bytes(), static_cast<uint32_t>(g.tokens));
      for (int64_t bps : {int64_t{1}, std::min<int64_t>(3, l->num_blocks),
                          static_cast<int64_t>(BlocksPerSegment(*l, int64_t{64} << 20))}) {
        const absl::Time start = absl::Now();
        absl::StatusOr<std::string> got = LoopbackKvBlocks(
            *ops, *comm, *stream, 0, *l, bps, payload.data(), send, recv, In(absl::Seconds(60)));
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(*got == payload) << g.tokens << " tokens, " << bps << " blocks per segment";
        const double s = absl::ToDoubleSeconds(absl::Now() - start);
        std::printf(
            "loopback %5lld tokens x %6lld B, %4lld blocks/segment: %8.3f ms (%.2f GB/s incl. "
            "packing)\n",
            static_cast<long long>(g.tokens), static_cast<long long>(bpt),
            static_cast<long long>(bps), s * 1e3, l->payload_bytes() / s / 1e9);
      }
    }
  }
}

// The GPU-resident form's data path on a real device: a token-major payload
// in device memory, split into token segments (a piece larger than a
// segment is split), sent and received by one rank to itself in one group
// straight between device buffers, then compared on the host.
TEST(NcclGpuTest, OneRankLoopbackOfTokenSegments) {
  REQUIRE_DEVICE(ops, 0);
  SelfComm self(*ops);
  ASSERT_TRUE(self.ok()) << self.status;
  NcclOps::Comm* comm = &self.comm;
  NcclOps::Stream* stream = &self.stream;
  const int64_t bpt = 30 * 2 * 192 * 4;  // SmolLM2-135M, f32
  for (const std::vector<int64_t>& piece_tokens :
       std::vector<std::vector<int64_t>>{{1}, {16, 16, 5}, {300}, {64, 2000}}) {
    int64_t tokens = 0;
    for (int64_t n : piece_tokens) tokens += n;
    const std::string payload = RandomBytes(tokens * bpt, static_cast<uint32_t>(tokens));
    NcclStaging host(ops.get());
    ASSERT_TRUE(host.Reserve(tokens * bpt).ok());
    absl::StatusOr<void*> src = ops->DeviceAlloc(tokens * bpt);
    absl::StatusOr<void*> dst = ops->DeviceAlloc(tokens * bpt);
    ASSERT_TRUE(src.ok() && dst.ok());
    std::memcpy(host.host(), payload.data(), payload.size());
    ASSERT_TRUE(ops->CopyToDevice(*src, host.host(), tokens * bpt, *stream).ok());
    std::vector<std::pair<const char*, int64_t>> pieces;
    int64_t off = 0;
    for (int64_t n : piece_tokens) {
      pieces.emplace_back(static_cast<const char*>(*src) + off, n * bpt);
      off += n * bpt;
    }
    // Segments of at most 40 tokens: the 300- and 2000-token pieces split.
    const std::vector<TokenSegment> segs = SplitTokenSegments(pieces, bpt, 40 * bpt);
    std::vector<int64_t> counts;
    for (const TokenSegment& t : segs) counts.push_back(t.tokens);
    absl::StatusOr<std::vector<TokenSegment>> recv = CheckTokenSegments(counts, tokens, bpt);
    ASSERT_TRUE(recv.ok()) << recv.status();
    ASSERT_TRUE(ops->GroupStart().ok());
    for (size_t i = 0; i < segs.size(); ++i) {
      ASSERT_TRUE(ops->Send(*comm, segs[i].data, segs[i].bytes, 0, *stream).ok());
      ASSERT_TRUE(ops->Recv(*comm, static_cast<char*>(*dst) + (*recv)[i].offset, (*recv)[i].bytes,
                            0, *stream)
                      .ok());
    }
    ASSERT_TRUE(ops->GroupEnd(*comm, In(absl::Seconds(60))).ok());
    std::memset(host.host(), 0, tokens * bpt);
    ASSERT_TRUE(ops->CopyToHost(host.host(), *dst, tokens * bpt, *stream).ok());
    ASSERT_TRUE(ops->WaitStream(*comm, *stream, In(absl::Seconds(60))).ok());
    EXPECT_EQ(std::memcmp(host.host(), payload.data(), payload.size()), 0) << tokens << " tokens";
    ops->DeviceFree(*src);
    ops->DeviceFree(*dst);
  }
}

// The peer never joins: init is bounded and the half-made communicator
// aborted (no hang).
TEST(NcclGpuTest, InitWithoutThePeerTimesOut) {
  REQUIRE_DEVICE(ops, 0);
  absl::StatusOr<NcclUniqueId> id = ops->GetUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<NcclOps::Comm> comm = ops->CommInitRank(*id, 2, 0, In(absl::Seconds(3)), {});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // And cancellation stops it early.
  id = ops->GetUniqueId();
  ASSERT_TRUE(id.ok());
  const absl::Time cstart = absl::Now();
  comm = ops->CommInitRank(*id, 2, 0, In(absl::Seconds(60)),
                           [cstart] { return absl::Now() - cstart > absl::Milliseconds(500); });
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kCancelled) << comm.status();
  EXPECT_LT(absl::Now() - cstart, absl::Seconds(20));
}

// A receive nobody sends: the wait times out, ncclCommAbort returns, and a
// new communicator works (what the transport does after a failure).
TEST(NcclGpuTest, UnmatchedReceiveTimesOutAndAbortRecovers) {
  REQUIRE_DEVICE(ops, 0);
  absl::StatusOr<NcclUniqueId> id = ops->GetUniqueId();
  ASSERT_TRUE(id.ok());
  absl::StatusOr<NcclOps::Comm> comm = ops->CommInitRank(*id, 1, 0, In(absl::Seconds(60)), {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::StatusOr<NcclOps::Stream> stream = ops->StreamCreate();
  ASSERT_TRUE(stream.ok());
  {
    NcclStaging buf(ops.get());
    ASSERT_TRUE(buf.Reserve(1 << 20).ok());
    absl::Status st = ops->GroupStart();
    ASSERT_TRUE(st.ok()) << st;
    absl::Status recv = ops->Recv(*comm, buf.device(), 1 << 20, 0, *stream);
    absl::Status end = ops->GroupEnd(*comm, In(absl::Seconds(5)));
    if (recv.ok() && end.ok()) {
      st = ops->WaitStream(*comm, *stream, In(absl::Seconds(2)));
      EXPECT_FALSE(st.ok()) << "a receive without a send completed";
    }
    const absl::Time start = absl::Now();
    ops->CommAbort(*comm);
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "ncclCommAbort took too long";
    ops->StreamDestroy(*stream);
  }
  // Re-created: a fresh communicator and stream carry a transfer.
  id = ops->GetUniqueId();
  ASSERT_TRUE(id.ok());
  comm = ops->CommInitRank(*id, 1, 0, In(absl::Seconds(60)), {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  stream = ops->StreamCreate();
  ASSERT_TRUE(stream.ok());
  {
    NcclStaging send(ops.get()), recv(ops.get());
    absl::StatusOr<KvBlockLayout> l = MakeKvBlockLayout(33, 2 * 2 * 8 * 4, 16, 2);
    ASSERT_TRUE(l.ok());
    const std::string payload = RandomBytes(l->payload_bytes(), 5);
    absl::StatusOr<std::string> got = LoopbackKvBlocks(
        *ops, *comm, *stream, 0, *l, 1, payload.data(), send, recv, In(absl::Seconds(60)));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == payload);
  }
  ops->StreamDestroy(*stream);
  ops->CommAbort(*comm);
}

// ---- two GPUs: sender (device 0) -> receiver (device 1) over gRPC -------------

constexpr int kBlock = 16, kLayers = 30, kHeads = 3, kDim = 64, kVocab = 49152;

v1::KvCompatibility Compat() {
  v1::KvCompatibility c;
  c.set_model_name("gpu-test");
  c.set_model_fingerprint(7);
  c.set_kv_dtype("f32");
  c.set_block_size(kBlock);
  c.set_num_layers(kLayers);
  c.set_num_kv_heads(kHeads);
  c.set_head_dim(kDim);
  c.set_hash(services::CompatHash(c));
  return c;
}

class NcclOnlyDecode final : public v1::DecodeWorker::Service {
 public:
  explicit NcclOnlyDecode(std::shared_ptr<NcclOps> ops) : leases_(absl::Seconds(60), kBlock) {
    NcclReceiverConfig rc;
    rc.compat = Compat();
    rc.bytes_per_token = engine::KvExport::BytesPerToken(kLayers, kHeads, kDim);
    rc.max_tokens = 1 << 16;
    rc.vocab_size = kVocab;
    rc.free_bytes = [] { return int64_t{16} << 30; };
    rc.kv_memory_domain = ops->memory_domain();  // GPU-resident pushes stay on the device
    receiver_ = std::make_unique<NcclKvReceiver>(std::move(ops), std::move(rc), &leases_);
  }
  grpc::Status NcclConnect(grpc::ServerContext* c, const v1::NcclConnectRequest* r,
                           v1::NcclConnectResponse* o) override {
    return receiver_->Connect(c, r, o);
  }
  grpc::Status NcclPushKv(
      grpc::ServerContext* c,
      grpc::ServerReaderWriter<v1::NcclPushKvResponse, v1::NcclPushKvRequest>* s) override {
    return receiver_->PushKv(c, s);
  }
  KvLeaseTable& leases() { return leases_; }

 private:
  KvLeaseTable leases_;
  std::unique_ptr<NcclKvReceiver> receiver_;
};

TEST(NcclGpuTest, TwoGpusEndToEnd) {
  REQUIRE_DEVICE(send_ops, 0);
  std::shared_ptr<NcclOps> recv_ops = OpsOrNull(1);
  if (recv_ops == nullptr) GTEST_SKIP() << "needs two GPUs (NCCL refuses two ranks on one)";
  NcclOnlyDecode service(recv_ops);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrFormat("127.0.0.1:%d", port);
  NcclKvTransport transport(send_ops);
  for (int tokens : {1, 17, 500, 4096}) {
    engine::KvExport kv;
    for (int i = 0; i < tokens; ++i) kv.token_ids.push_back(i % kVocab);
    kv.num_layers = kLayers;
    kv.num_kv_heads = kHeads;
    kv.head_dim = kDim;
    kv.bytes_per_token = engine::KvExport::BytesPerToken(kLayers, kHeads, kDim);
    kv.bytes = RandomBytes(tokens * kv.bytes_per_token, tokens);
    const std::string handle = absl::StrFormat("h%d", tokens);
    absl::StatusOr<KvSendResult> r =
        transport.Send({address, handle, handle}, Compat(), kv, In(absl::Seconds(120)));
    ASSERT_TRUE(r.ok()) << r.status();
    std::printf("2 GPUs: %5d tokens, %.1f MiB in %.3f ms\n", tokens, r->num_bytes / 1048576.0,
                r->seconds * 1e3);
    absl::StatusOr<std::shared_ptr<const engine::KvExport>> got = service.leases().Claim(handle);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE((*got)->bytes == kv.bytes);
    EXPECT_EQ((*got)->token_ids, kv.token_ids);
    // The GPU-resident form: the same payload from GPU 0's memory lands in
    // GPU 1's, held there by the lease.
    absl::StatusOr<void*> d = send_ops->DeviceAlloc(kv.bytes.size());
    ASSERT_TRUE(d.ok()) << d.status();
    NcclStaging up(send_ops.get());
    ASSERT_TRUE(up.Reserve(kv.bytes.size()).ok());
    std::memcpy(up.host(), kv.bytes.data(), kv.bytes.size());
    absl::StatusOr<NcclOps::Stream> st = send_ops->StreamCreate();
    ASSERT_TRUE(st.ok());
    ASSERT_TRUE(send_ops->CopyToDevice(*d, up.host(), kv.bytes.size(), *st).ok());
    ASSERT_TRUE(send_ops->WaitStream(nullptr, *st, In(absl::Seconds(30))).ok());
    send_ops->StreamDestroy(*st);
    engine::KvExport dev = kv;
    dev.bytes.clear();
    std::shared_ptr<NcclOps> keep = send_ops;
    dev.device = std::make_shared<engine::KvDeviceBytes>(*d, static_cast<int64_t>(kv.bytes.size()),
                                                         send_ops->memory_domain(),
                                                         [keep](void* p) { keep->DeviceFree(p); });
    const std::string dh = handle + "d";
    r = transport.Send({address, dh, dh}, Compat(), dev, In(absl::Seconds(120)));
    ASSERT_TRUE(r.ok()) << r.status();
    // The lease of `h` holds kv's payload in GPU 1's memory.
    auto expect_on_gpu1 = [&](const std::string& h) {
      absl::StatusOr<std::shared_ptr<const engine::KvExport>> g = service.leases().Claim(h);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_NE((*g)->device, nullptr);
      EXPECT_EQ((*g)->device->domain(), "cuda:1");
      NcclStaging down(recv_ops.get());
      ASSERT_TRUE(down.Reserve(kv.bytes.size()).ok());
      absl::StatusOr<NcclOps::Stream> rs = recv_ops->StreamCreate();
      ASSERT_TRUE(rs.ok());
      ASSERT_TRUE(
          recv_ops->CopyToHost(down.host(), (*g)->device->data(), kv.bytes.size(), *rs).ok());
      ASSERT_TRUE(recv_ops->WaitStream(nullptr, *rs, In(absl::Seconds(30))).ok());
      recv_ops->StreamDestroy(*rs);
      EXPECT_EQ(std::memcmp(down.host(), kv.bytes.data(), kv.bytes.size()), 0);
    };
    ASSERT_NO_FATAL_FAILURE(expect_on_gpu1(dh));
    // Streamed, as a prefill worker sends it: pieces of at most 512 tokens
    // (host bytes here, uploaded through the pair's staging), one round each.
    const std::string sh = handle + "s";
    absl::StatusOr<std::unique_ptr<KvSendStream>> s =
        transport.Open({address, sh, sh}, Compat(), KvSendPlan{kv.token_ids, kv.bytes_per_token},
                       In(absl::Seconds(120)));
    ASSERT_TRUE(s.ok()) << s.status();
    for (int from = 0; from < tokens; from += 512) {
      const int n = std::min(512, tokens - from);
      ASSERT_TRUE((*s)->Write(std::string_view(kv.bytes).substr(from * kv.bytes_per_token,
                                                                n * kv.bytes_per_token))
                      .ok());
    }
    r = (*s)->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    std::printf("2 GPUs, streamed: %5d tokens in %.3f ms\n", tokens, r->seconds * 1e3);
    ASSERT_NO_FATAL_FAILURE(expect_on_gpu1(sh));
  }
  EXPECT_EQ(transport.num_connects(), 1);
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace tandem::transfer
