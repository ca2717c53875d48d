// Many concurrent Generate streams against a real `tandem serve`, colocated
// and disaggregated (issue 16: the asynchronous gRPC edge). Every stream is admitted (the
// router's and the engine's bounds are set above the stream count), so none
// may end RESOURCE_EXHAUSTED; all complete with max_tokens tokens; and the
// router's thread count stays bounded while they are open: Generate is a
// callback reactor, not a thread per call (a thread-per-stream router would
// grow by about the stream count). Disaggregated, the decode worker's
// thread count stays bounded too (PushKv and Decode are reactors).
//
// The client is one process with gRPC callback readers (no thread per
// stream either). TANDEM_TEST_STREAMS sets the stream count (default 400;
// docs/operations.md has a 1,000-stream run).
//
// The same over the OpenAI HTTP API (SSE streams, the client one poll loop
// over raw sockets): the Beast server's few io threads carry every stream,
// so the router's thread count stays bounded there too.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_callback.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_util.h"
#include "tests/util/http_get.h"
#include "tests/util/raw_http.h"
#include "tests/util/wait.h"

namespace tandem::testing {
namespace {

using Clock = std::chrono::steady_clock;

int NumStreams() {
  const char* v = std::getenv("TANDEM_TEST_STREAMS");
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n >= 1 && n <= 100000 ? n : 400;
}

// Threads: of `pid` (0 when unreadable).
int NumThreads(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return 0;
}

// One Generate stream as a callback reader: counts tokens, keeps the status.
class StreamReader final : public grpc::ClientReadReactor<tandem::v1::GenerateResponse> {
 public:
  StreamReader(tandem::v1::Generation::Stub* stub, const tandem::v1::GenerateRequest& request,
               std::atomic<int>* num_done)
      : num_done_(num_done) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    stub->async()->Generate(&ctx_, &request, this);
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    num_tokens_ += response_.token_ids_size();
    if (response_.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      reason_ = response_.finish_reason();
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    num_done_->fetch_add(1);
  }
  // Valid once OnDone ran.
  const grpc::Status& status() const { return status_; }
  int num_tokens() const { return num_tokens_; }
  tandem::v1::FinishReason reason() const { return reason_; }

 private:
  grpc::ClientContext ctx_;
  tandem::v1::GenerateResponse response_;
  std::atomic<int>* num_done_;
  grpc::Status status_;
  int num_tokens_ = 0;
  tandem::v1::FinishReason reason_ = tandem::v1::FINISH_REASON_UNSPECIFIED;
};

// Runs NumStreams() streams against `tandem serve` started with `args`
// (plus the bounds above the stream count) and checks the above.
void RunManyStreams(const char* mode, std::vector<std::string> args) {
  const int n = NumStreams();
  constexpr int kMaxTokens = 4;
  // A thread-per-stream router would add about n threads; gRPC's callback
  // executor and pollers are a fixed few.
  constexpr int kMaxExtraThreads = 64;
  ServeProcess cluster;
  const std::string limit = std::to_string(n + 16);
  // No HTTP API: the gRPC edge's count alone (the HTTP variant is below).
  for (const std::string& a :
       {std::string("--max-inflight"), limit, std::string("--max-waiting-requests"), limit,
        std::string("--threads"), std::string("2"), std::string("--http-port"),
        std::string("-1")}) {
    args.push_back(a);
  }
  const std::string err = cluster.Start(args);
  ASSERT_EQ(err, "") << err;
  const Endpoint router = cluster.endpoints()[0];
  ASSERT_EQ(router.role, "router");

  tandem::v1::GenerateRequest req;
  req.set_text("Once upon a time, in a small village by the sea,");
  req.mutable_sampling()->set_temperature(0.8);
  req.mutable_stop()->set_max_tokens(kMaxTokens);
  req.mutable_stop()->set_ignore_eos(true);  // every stream is max_tokens long

  // Several connections, as many clients would open.
  std::vector<std::unique_ptr<tandem::v1::Generation::Stub>> stubs;
  for (int c = 0; c < 8; ++c) {
    grpc::ChannelArguments channel_args;
    channel_args.SetInt("tandem.test.channel", c);  // distinct args: a connection each
    stubs.push_back(tandem::v1::Generation::NewStub(grpc::CreateCustomChannel(
        router.grpc_address, grpc::InsecureChannelCredentials(), channel_args)));
  }
  {  // warm: connections, the router's first call
    std::atomic<int> done{0};
    std::vector<std::unique_ptr<StreamReader>> warm;
    for (auto& stub : stubs) warm.push_back(std::make_unique<StreamReader>(stub.get(), req, &done));
    ASSERT_TRUE(
        WaitFor([&] { return done.load() == static_cast<int>(warm.size()); }, absl::Seconds(60)));
    for (auto& w : warm) ASSERT_TRUE(w->status().ok()) << w->status().error_message();
  }
  ASSERT_TRUE(WaitFor([&] { return RouterMetric(router, "tandem_num_requests_running") == 0; }));
  const int threads_before = NumThreads(router.pid);
  ASSERT_GT(threads_before, 0);
  // The decode worker (disaggregated): its PushKv and Decode are reactors too.
  // The prefill worker: its KV pushes to the decode worker are PushKv calls
  // on the callback API (KvPushPipe over HostKvTransport::OpenAsync).
  int decode_pid = 0, prefill_pid = 0;
  for (const Endpoint& e : cluster.endpoints()) {
    if (e.role == "decode") decode_pid = e.pid;
    if (e.role == "prefill") prefill_pid = e.pid;
  }
  const int decode_threads_before = decode_pid != 0 ? NumThreads(decode_pid) : 0;
  const int prefill_threads_before = prefill_pid != 0 ? NumThreads(prefill_pid) : 0;

  std::atomic<bool> sampling{true};
  std::atomic<int> threads_peak{threads_before};
  std::atomic<int> decode_threads_peak{decode_threads_before};
  std::atomic<int> prefill_threads_peak{prefill_threads_before};
  std::atomic<double> running_peak{0};
  std::thread sampler([&] {
    while (sampling.load()) {
      threads_peak.store(std::max(threads_peak.load(), NumThreads(router.pid)));
      if (decode_pid != 0) {
        decode_threads_peak.store(std::max(decode_threads_peak.load(), NumThreads(decode_pid)));
      }
      if (prefill_pid != 0) {
        prefill_threads_peak.store(std::max(prefill_threads_peak.load(), NumThreads(prefill_pid)));
      }
      running_peak.store(
          std::max(running_peak.load(), RouterMetric(router, "tandem_num_requests_running")));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::atomic<int> num_done{0};
  const auto start = Clock::now();
  std::vector<std::unique_ptr<StreamReader>> streams;
  streams.reserve(n);
  for (int i = 0; i < n; ++i) {
    req.mutable_sampling()->set_seed(static_cast<uint64_t>(i + 1));
    streams.push_back(
        std::make_unique<StreamReader>(stubs[i % stubs.size()].get(), req, &num_done));
  }
  const bool all_done = WaitFor([&] { return num_done.load() == n; }, absl::Seconds(240));
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  sampling.store(false);
  sampler.join();
  ASSERT_TRUE(all_done) << num_done.load() << " of " << n << " streams done";

  int ok = 0, exhausted = 0, other = 0;
  for (int i = 0; i < n; ++i) {
    const StreamReader& s = *streams[i];
    if (s.status().ok()) {
      ++ok;
      EXPECT_EQ(s.num_tokens(), kMaxTokens) << i;
      EXPECT_EQ(s.reason(), tandem::v1::FINISH_REASON_LENGTH) << i;
    } else if (s.status().error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
    } else {
      ++other;
      ADD_FAILURE() << i << ": " << s.status().error_code() << " " << s.status().error_message();
    }
  }
  std::printf(
      "[many_streams %s] %d streams: %d ok, %d RESOURCE_EXHAUSTED, %d other errors in %.2f s; "
      "router threads %d before, peak %d while open; peak %g router requests in flight; "
      "decode worker threads %d before, peak %d; prefill worker threads %d before, peak %d\n",
      mode, n, ok, exhausted, other, wall_s, threads_before, threads_peak.load(),
      running_peak.load(), decode_threads_before, decode_threads_peak.load(),
      prefill_threads_before, prefill_threads_peak.load());
  EXPECT_EQ(ok, n);
  EXPECT_EQ(exhausted, 0);  // below every configured limit
  // The streams were open together (admission is immediate; the engine
  // works through them for a while), so the thread bound below means
  // something.
  EXPECT_GE(running_peak.load(), n / 2);
  EXPECT_LE(threads_peak.load(), threads_before + kMaxExtraThreads);
  // Nor the decode worker's: a sync PushKv held one of its handler threads
  // per push in flight (measured +40 at 400 streams), the reactor none (+3).
  constexpr int kMaxExtraDecodeThreads = 24;
  if (decode_pid != 0) {
    EXPECT_LE(decode_threads_peak.load(), decode_threads_before + kMaxExtraDecodeThreads);
  }
  // The prefill worker: a thread per KV push in flight reached +44 at 1,000
  // streams; the callback-API push adds none (+2 measured).
  if (prefill_pid != 0) {
    EXPECT_LE(prefill_threads_peak.load(), prefill_threads_before + kMaxExtraDecodeThreads);
  }
  // Every admitted call gave its slot back.
  EXPECT_TRUE(WaitFor([&] { return RouterMetric(router, "tandem_num_requests_running") == 0; }));
  EXPECT_EQ(cluster.Stop(), 0) << cluster.Log();
}

TEST(ManyStreamsTest, ConcurrentStreamsCompleteWithBoundedRouterThreads) {
  RunManyStreams("colocated", {"--colocated"});
}

// The same through prefill and decode workers: every prompt goes to the
// prefill worker (ServeProcess sets --remote-prefill-min-tokens 0), so each
// call holds a Prefill stream, then a Decode stream, from the router. The
// disaggregated backend's calls are callback state machines, not a thread
// each, so the router's thread count stays bounded here too. The KV cache is
// sized so the decode worker can lease every stream's prompt at once (no
// RESOURCE_EXHAUSTED from the handoff).
TEST(ManyStreamsTest, DisaggregatedStreamsCompleteWithBoundedRouterThreads) {
  RunManyStreams("disaggregated",
                 {"--prefill-workers", "1", "--decode-workers", "1", "--kv-cache-memory", "1GiB"});
}

// One SSE stream per socket; the requests ask Connection: close, so each
// stream ends with the server's close.
struct HttpStream {
  int fd = -1;
  std::string got;
  bool closed = false;
};

// Reads every stream until all are closed or `timeout` passes, on this
// thread; the number closed.
int PollStreams(std::vector<HttpStream>& streams, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  int closed = 0;
  std::vector<pollfd> fds;
  std::vector<HttpStream*> of;
  char buf[16384];
  while (closed < static_cast<int>(streams.size()) && absl::Now() < end) {
    fds.clear();
    of.clear();
    for (HttpStream& s : streams) {
      if (s.closed) continue;
      fds.push_back({s.fd, POLLIN, 0});
      of.push_back(&s);
    }
    if (poll(fds.data(), fds.size(), 100) < 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        of[i]->got.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        of[i]->closed = true;
        ++closed;
      }
    }
  }
  return closed;
}

// The HTTP variant of RunManyStreams: NumStreams() SSE streams through the
// router's OpenAI API against `tandem serve --colocated`.
void RunManyHttpStreams() {
  const int n = NumStreams();
  constexpr int kMaxTokens = 4;
  constexpr int kMaxExtraThreads = 64;
  ServeProcess cluster;
  const std::string limit = std::to_string(n + 16);
  ASSERT_EQ(cluster.Start({"--colocated", "--max-inflight", limit, "--max-waiting-requests", limit,
                           "--threads", "2"}),
            "");
  const Endpoint router = cluster.endpoints()[0];
  ASSERT_FALSE(router.http_address.empty());
  const int port = std::stoi(router.http_address.substr(router.http_address.rfind(':') + 1));
  const std::string body = absl::StrFormat(
      R"({"prompt": "Once upon a time, in a small village by the sea,", "max_tokens": %d,)"
      R"( "ignore_eos": true, "temperature": 0.8, "stream": true})",
      kMaxTokens);
  const std::string request =
      testing::RawRequest("POST", "/v1/completions", body, "Connection: close\r\n");
  {  // warm: the router's first call
    std::vector<HttpStream> warm(1);
    warm[0].fd = testing::ConnectLocal(port);
    ASSERT_TRUE(testing::SendAll(warm[0].fd, request));
    ASSERT_EQ(PollStreams(warm, absl::Seconds(60)), 1);
    close(warm[0].fd);
    ASSERT_NE(warm[0].got.find("data: [DONE]"), std::string::npos) << warm[0].got;
  }
  ASSERT_TRUE(WaitFor([&] { return RouterMetric(router, "tandem_num_requests_running") == 0; }));
  const int threads_before = NumThreads(router.pid);
  std::atomic<bool> sampling{true};
  std::atomic<int> threads_peak{threads_before};
  std::atomic<double> running_peak{0};
  std::thread sampler([&] {
    while (sampling.load()) {
      threads_peak.store(std::max(threads_peak.load(), NumThreads(router.pid)));
      running_peak.store(
          std::max(running_peak.load(), RouterMetric(router, "tandem_num_requests_running")));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const auto start = Clock::now();
  std::vector<HttpStream> streams(n);
  for (HttpStream& s : streams) {
    s.fd = testing::ConnectLocal(port);
    if (s.fd < 0 || !testing::SendAll(s.fd, request)) s.closed = true;
  }
  const int closed = PollStreams(streams, absl::Seconds(240));
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  sampling.store(false);
  sampler.join();
  EXPECT_EQ(closed, n);
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    HttpStream& s = streams[i];
    if (s.fd >= 0) close(s.fd);
    const bool good = s.got.rfind("HTTP/1.1 200", 0) == 0 &&
                      s.got.find("\"finish_reason\":\"length\"") != std::string::npos &&
                      s.got.find("data: [DONE]") != std::string::npos;
    if (good) {
      ++ok;
    } else if (ok + 3 > i) {  // the first few failures only
      ADD_FAILURE() << i << ": " << s.got.substr(0, 300);
    }
  }
  std::printf(
      "[many_streams http] %d SSE streams: %d ok, %d not in %.2f s; router threads %d before, "
      "peak %d while open; peak %g router requests in flight\n",
      n, ok, n - ok, wall_s, threads_before, threads_peak.load(), running_peak.load());
  EXPECT_EQ(ok, n);
  EXPECT_GE(running_peak.load(), n / 2);
  EXPECT_LE(threads_peak.load(), threads_before + kMaxExtraThreads);
  // Nor a pool sized for the connections, started up front.
  EXPECT_LE(threads_before, 128);
  EXPECT_TRUE(WaitFor([&] { return RouterMetric(router, "tandem_num_requests_running") == 0; }));
  EXPECT_EQ(cluster.Stop(), 0) << cluster.Log();
}

TEST(ManyStreamsTest, HttpStreamsCompleteWithBoundedRouterThreads) { RunManyHttpStreams(); }

}  // namespace
}  // namespace tandem::testing
