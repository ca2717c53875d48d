// The /metrics + /healthz server (cpp-httplib), over real loopback sockets:
// what it answers, and that hostile requests are answered or dropped while
// the server keeps serving.
#include "common/metrics/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metrics.h"

namespace tandem::metrics {
namespace {

using Clock = std::chrono::steady_clock;

// A loopback client socket; -1 on failure.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};  // a hung server fails the test instead of hanging it
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(n);
  }
}

// Everything the server sends until it closes (or 5 s pass).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

std::string Request(int port, std::string_view raw, bool half_close = false) {
  int fd = Connect(port);
  if (fd < 0) return "connect failed";
  SendAll(fd, raw);
  if (half_close) shutdown(fd, SHUT_WR);
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

std::string Get(int port, std::string_view path) {
  return Request(port, std::string("GET ") + std::string(path) +
                           " HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n");
}

int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

std::string BodyOf(const std::string& response) {
  size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

class HttpServerTest : public testing::Test {
 protected:
  void SetUp() override {
    Counter* c =
        *(*registry_.AddCounter("hits_total", "Hits.", {"path"}))->WithLabelValues({"a\"b"});
    c->Inc(3);
    const double bounds[] = {0.5, 1};
    Histogram* h = *(*registry_.AddHistogram("wait_seconds", "Wait.", {"phase"}, bounds))
                        ->WithLabelValues({"router"});
    h->Observe(0.75);
  }
  std::unique_ptr<MetricsHttpServer> StartServer(MetricsHttpServer::Options options = {}) {
    options.host = "127.0.0.1";
    auto server = std::make_unique<MetricsHttpServer>(&registry_, std::move(options));
    absl::Status s = server->Start();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_GT(server->port(), 0);
    return server;
  }
  MetricsRegistry registry_;
};

TEST_F(HttpServerTest, MetricsBodyIsSerialize) {
  auto server = StartServer();
  std::string r = Get(server->port(), "/metrics");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_NE(r.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("\r\nConnection: close\r\n"), std::string::npos) << r;
  const std::string body = BodyOf(r);
  EXPECT_EQ(body, registry_.Serialize());
  EXPECT_NE(r.find("Content-Length: " + std::to_string(body.size()) + "\r\n"), std::string::npos);
  // Names, labels and histogram buckets as Prometheus reads them.
  for (const char* want :
       {"# TYPE hits_total counter\n", "hits_total{path=\"a\\\"b\"} 3\n",
        "# TYPE wait_seconds histogram\n", "wait_seconds_bucket{phase=\"router\",le=\"0.5\"} 0\n",
        "wait_seconds_bucket{phase=\"router\",le=\"1\"} 1\n",
        "wait_seconds_bucket{phase=\"router\",le=\"+Inf\"} 1\n",
        "wait_seconds_count{phase=\"router\"} 1\n"}) {
    EXPECT_NE(body.find(want), std::string::npos) << want << body;
  }
  EXPECT_EQ(BodyOf(Get(server->port(), "/metrics?name[]=x")), registry_.Serialize());
  // HTTP/1.0 (tests/util/http_get.h, simple scrapers) works too.
  EXPECT_EQ(BodyOf(Request(server->port(), "GET /metrics HTTP/1.0\r\n\r\n")), body);
}

TEST_F(HttpServerTest, HealthzNotFoundMethodNotAllowedHead) {
  std::atomic<bool> healthy{true};
  MetricsHttpServer::Options options;
  options.healthy = [&healthy] { return healthy.load(); };
  auto server = StartServer(options);
  std::string r = Get(server->port(), "/healthz");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_EQ(BodyOf(r), "ok");
  healthy = false;
  r = Get(server->port(), "/healthz");
  EXPECT_EQ(StatusOf(r), 503) << r;
  EXPECT_EQ(BodyOf(r), "unhealthy");
  healthy = true;
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 200);
  EXPECT_EQ(StatusOf(Get(server->port(), "/nope")), 404);
  EXPECT_EQ(StatusOf(Get(server->port(), "/")), 404);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics/extra")), 404);
  EXPECT_EQ(StatusOf(Get(server->port(), "/../metrics/..")), 404);
  r = Request(server->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 405) << r;
  EXPECT_NE(r.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << r;
  r = Request(server->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 200) << r;
  EXPECT_EQ(BodyOf(r), "");
}

TEST_F(HttpServerTest, OversizedRequestIsRefusedAndServerKeepsServing) {
  auto server = StartServer();  // header lines: at most 8 KiB
  std::string big = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(16384, 'a') + "\r\n\r\n";
  const std::string r = Request(server->port(), big);
  EXPECT_TRUE(r.empty() || (StatusOf(r) >= 400 && StatusOf(r) < 500)) << r.substr(0, 200);
  EXPECT_EQ(r.find("hits_total"), std::string::npos);  // never the metrics
  // A request target over 8 KiB; a body over max_body_bytes.
  const std::string uri =
      Request(server->port(), "GET /metrics?" + std::string(20000, 'q') + " HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(uri.empty() || (StatusOf(uri) >= 400 && StatusOf(uri) < 500)) << uri.substr(0, 200);
  const std::string body =
      Request(server->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" +
                                  std::string(100000, 'b'));
  EXPECT_TRUE(body.empty() || (StatusOf(body) >= 400 && StatusOf(body) < 500))
      << body.substr(0, 200);
  // Many small headers: answered.
  std::string many = "GET /healthz HTTP/1.1\r\n";
  for (int i = 0; i < 200; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
  EXPECT_GT(StatusOf(Request(server->port(), many + "\r\n")), 0);
  // Just under the limit is fine.
  std::string ok = "GET /healthz HTTP/1.1\r\nX-Big: " + std::string(7000, 'a') + "\r\n\r\n";
  EXPECT_EQ(StatusOf(Request(server->port(), ok)), 200);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
}

TEST_F(HttpServerTest, GarbageIsAnsweredOrDroppedAndServerKeepsServing) {
  auto server = StartServer();
  const int port = server->port();
  auto refused = [](const std::string& r) { return r.empty() || StatusOf(r) >= 400; };
  EXPECT_TRUE(refused(Request(port, std::string("\x00\x01\xff\xfe garbage\r\n\r\n", 16))));
  EXPECT_TRUE(refused(Request(port, "GET metrics HTTP/1.1\r\n\r\n")));
  // cpp-httplib skips malformed header lines: answered either way.
  EXPECT_GT(StatusOf(Request(port, "GET /healthz HTTP/1.1\r\nno colon\r\n\r\n")), 0);
  EXPECT_GT(StatusOf(Request(port, "GET /healthz HTTP/1.1\r\nContent-Length: -5\r\n\r\n")), 0);
  EXPECT_TRUE(refused(Request(port, "FOO /metrics HTTP/1.1\r\n\r\n")));
  EXPECT_TRUE(refused(Request(port, "GET /metrics\r\n\r\n")));
  EXPECT_TRUE(refused(Request(port, "\r\n\r\n")));
  // Half a request, then the client closes its side.
  EXPECT_TRUE(refused(Request(port, "GET /metr", /*half_close=*/true)));
  std::string random;
  for (int i = 0; i < 5000; ++i) random.push_back(static_cast<char>((i * 7919) % 251));
  EXPECT_TRUE(refused(Request(port, random, /*half_close=*/true)));
  // Connect and close at once.
  close(Connect(port));
  EXPECT_EQ(StatusOf(Get(port, "/healthz")), 200);  // still serving
  EXPECT_EQ(BodyOf(Get(port, "/metrics")), registry_.Serialize());
}

TEST_F(HttpServerTest, SilentClientDoesNotBlockOthersOrStop) {
  MetricsHttpServer::Options options;
  options.request_timeout = absl::Seconds(1);
  auto server = StartServer(options);
  int silent = Connect(server->port());
  ASSERT_GE(silent, 0);
  auto t0 = Clock::now();
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 200);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(900));
  // Dropped after request_timeout without an answer; Stop waits at most that.
  EXPECT_EQ(StatusOf(ReadAll(silent)), -1);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(4));
  t0 = Clock::now();
  server->Stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  close(silent);
}

TEST_F(HttpServerTest, SlowClientTimesOut) {
  MetricsHttpServer::Options options;
  options.request_timeout = absl::Milliseconds(200);
  auto server = StartServer(options);
  int fd = Connect(server->port());
  SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n");  // never finishes the headers
  auto t0 = Clock::now();
  const std::string r = ReadAll(fd);  // closed (maybe with an error), never the metrics
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(r.find("hits_total"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 200);
}

TEST_F(HttpServerTest, ConnectionsPastNumThreadsWaitTheirTurn) {
  MetricsHttpServer::Options options;
  options.num_threads = 1;
  options.request_timeout = absl::Seconds(30);
  auto server = StartServer(options);
  int silent = Connect(server->port());  // holds the only worker
  ASSERT_GE(silent, 0);
  std::string r;
  std::thread waiter([&] { r = Get(server->port(), "/healthz"); });
  close(silent);  // frees the worker: the queued request is answered
  waiter.join();
  EXPECT_EQ(StatusOf(r), 200) << r;
}

TEST_F(HttpServerTest, PastTheQueueTheAcceptorServesItself) {
  MetricsHttpServer::Options options;
  options.num_threads = 1;
  options.max_queued = 0;
  options.request_timeout = absl::Seconds(30);
  auto server = StartServer(options);
  int silent = Connect(server->port());  // holds the only worker for up to 30 s
  ASSERT_GE(silent, 0);
  const auto t0 = Clock::now();
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 200);  // served on the accepting thread
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  close(silent);
}

TEST_F(HttpServerTest, ManyConcurrentClients) {
  MetricsHttpServer::Options options;
  options.num_threads = 4;
  auto server = StartServer(options);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&] {
      for (int i = 0; i < 25; ++i) ok += StatusOf(Get(server->port(), "/metrics")) == 200;
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(HttpServerTest, LifecycleErrors) {
  MetricsHttpServer idle(&registry_, {});
  idle.Stop();  // never started
  EXPECT_EQ(idle.port(), 0);
  auto server = StartServer();
  EXPECT_EQ(server->Start().code(), absl::StatusCode::kFailedPrecondition);
  MetricsHttpServer::Options taken;
  taken.host = "127.0.0.1";
  taken.port = server->port();
  MetricsHttpServer clash(&registry_, taken);
  EXPECT_EQ(clash.Start().code(), absl::StatusCode::kUnavailable);
  MetricsHttpServer::Options bad_port;
  bad_port.port = 70000;
  MetricsHttpServer bad(&registry_, bad_port);
  EXPECT_EQ(bad.Start().code(), absl::StatusCode::kInvalidArgument);
  MetricsHttpServer::Options bad_threads;
  bad_threads.num_threads = 0;
  EXPECT_EQ(MetricsHttpServer(&registry_, bad_threads).Start().code(),
            absl::StatusCode::kInvalidArgument);
  MetricsHttpServer::Options bad_host;
  bad_host.host = "not a host name";
  EXPECT_FALSE(MetricsHttpServer(&registry_, bad_host).Start().ok());
  MetricsHttpServer::Options localhost;
  localhost.host = "localhost";  // names are resolved
  MetricsHttpServer named(&registry_, localhost);
  ASSERT_TRUE(named.Start().ok());
  EXPECT_GT(named.port(), 0);
  server->Stop();
  server->Stop();  // idempotent
  EXPECT_EQ(server->Start().code(), absl::StatusCode::kFailedPrecondition);
}

// A stop() right after StartListening returns is never lost (cpp-httplib
// ignores stop() until its listen loop runs): 50 start/stop cycles end.
TEST(StartListeningTest, StopRightAfterStartIsNeverLost) {
  auto cycles = std::async(std::launch::async, [] {
    for (int i = 0; i < 50; ++i) {
      httplib::Server server;
      if (server.bind_to_any_port("127.0.0.1") <= 0) return false;
      std::thread t = StartListening(&server);
      server.stop();
      t.join();
    }
    return true;
  });
  if (cycles.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "a listen loop missed its stop()";
    std::_Exit(1);  // the stuck thread would hang the test's exit
  }
  EXPECT_TRUE(cycles.get());
}

}  // namespace
}  // namespace tandem::metrics
