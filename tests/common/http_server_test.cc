#include "common/metrics/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
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
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return -1;
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
            std::string::npos);
  EXPECT_NE(r.find("\r\nConnection: close\r\n"), std::string::npos);
  EXPECT_EQ(BodyOf(r), registry_.Serialize());
  EXPECT_NE(r.find("Content-Length: " + std::to_string(registry_.Serialize().size())),
            std::string::npos);
  EXPECT_EQ(BodyOf(Get(server->port(), "/metrics?name[]=x")), registry_.Serialize());
}

TEST_F(HttpServerTest, HealthzNotFoundMethodNotAllowedHead) {
  bool healthy = true;
  MetricsHttpServer::Options options;
  options.healthy = [&healthy] { return healthy; };
  auto server = StartServer(options);
  std::string r = Get(server->port(), "/healthz");
  EXPECT_EQ(StatusOf(r), 200);
  EXPECT_EQ(BodyOf(r), "ok");
  healthy = false;
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 503);
  EXPECT_EQ(StatusOf(Get(server->port(), "/nope")), 404);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics/extra")), 404);
  r = Request(server->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 405);
  EXPECT_NE(r.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos);
  r = Request(server->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(StatusOf(r), 200);
  EXPECT_EQ(BodyOf(r), "");
}

TEST_F(HttpServerTest, OversizedHeadersGet431) {
  auto server = StartServer();
  std::string big = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(16384, 'a') + "\r\n\r\n";
  EXPECT_EQ(StatusOf(Request(server->port(), big)), 431);
  // Just under the limit is fine.
  std::string ok = "GET /healthz HTTP/1.1\r\nX-Big: " + std::string(8000, 'a') + "\r\n\r\n";
  EXPECT_EQ(StatusOf(Request(server->port(), ok)), 200);
}

TEST_F(HttpServerTest, GarbageGets400OrClose) {
  auto server = StartServer();
  const int port = server->port();
  EXPECT_EQ(StatusOf(Request(port, std::string("\x00\x01\xff\xfe garbage\r\n", 14))), 400);
  EXPECT_EQ(StatusOf(Request(port, "GET metrics HTTP/1.1\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Request(port, "GET /metrics HTTP/9.9\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Request(port, "GET  /metrics HTTP/1.1\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Request(port, "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(Request(port, "GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n")), 400);
  // Half a request, then the client closes its side.
  EXPECT_EQ(StatusOf(Request(port, "GET /metr", /*half_close=*/true)), 400);
  std::string random;
  for (int i = 0; i < 5000; ++i) random.push_back(static_cast<char>((i * 7919) % 251));
  std::string r = Request(port, random, /*half_close=*/true);
  EXPECT_TRUE(r.empty() || StatusOf(r) == 400) << r.substr(0, 100);
  // Connect and close at once.
  close(Connect(port));
  EXPECT_EQ(StatusOf(Get(port, "/healthz")), 200);  // still serving
}

TEST_F(HttpServerTest, SilentClientDoesNotBlockOthersOrStop) {
  MetricsHttpServer::Options options;
  options.read_timeout = absl::Seconds(30);
  auto server = StartServer(options);
  int silent = Connect(server->port());
  ASSERT_GE(silent, 0);
  auto t0 = Clock::now();
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 200);
  EXPECT_EQ(StatusOf(Get(server->port(), "/metrics")), 200);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  t0 = Clock::now();
  server->Stop();  // wakes the handler that waits on the silent client
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(ReadAll(silent), "");  // closed without an answer
  close(silent);
}

TEST_F(HttpServerTest, SlowClientTimesOut) {
  MetricsHttpServer::Options options;
  options.read_timeout = absl::Milliseconds(200);
  auto server = StartServer(options);
  int fd = Connect(server->port());
  SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n");  // never finishes the headers
  auto t0 = Clock::now();
  EXPECT_EQ(ReadAll(fd), "");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  close(fd);
}

TEST_F(HttpServerTest, ConnectionLimitAnswers503) {
  MetricsHttpServer::Options options;
  options.max_connections = 2;
  auto server = StartServer(options);
  int a = Connect(server->port()), b = Connect(server->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the acceptor take both
  EXPECT_EQ(StatusOf(Get(server->port(), "/healthz")), 503);
  close(a);
  close(b);
  std::string r;
  for (int i = 0; i < 50 && StatusOf(r) != 200; ++i) {  // handlers notice the close
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r = Get(server->port(), "/healthz");
  }
  EXPECT_EQ(StatusOf(r), 200);
}

TEST_F(HttpServerTest, ManyConcurrentClients) {
  MetricsHttpServer::Options options;
  options.max_connections = 64;
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
  MetricsHttpServer::Options bad_host;
  bad_host.host = "not a host name";
  EXPECT_FALSE(MetricsHttpServer(&registry_, bad_host).Start().ok());
  server->Stop();
  server->Stop();  // idempotent
  EXPECT_EQ(server->Start().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(HttpServerTest, HandleParsesWithoutSockets) {
  MetricsHttpServer server(&registry_, {});
  EXPECT_EQ(server.Handle("GET /healthz HTTP/1.1\r\n\r\n").status, 200);
  EXPECT_EQ(server.Handle("").status, 400);
  EXPECT_EQ(server.Handle("\r\n\r\n").status, 400);
  EXPECT_EQ(server.Handle("GET /healthz\r\n\r\n").status, 400);
  EXPECT_EQ(server.Handle("G(T /healthz HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(server.Handle("GET /he\x01z HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(server.Handle("DELETE /healthz HTTP/1.1\r\n\r\n").status, 405);
  EXPECT_EQ(server.Handle("GET /healthz HTTP/1.1\r\n: empty\r\n\r\n").status, 400);
}

}  // namespace
}  // namespace tandem::metrics
