// A tiny HTTP/1.1 server for Prometheus scrapes and liveness probes:
//   GET /metrics  -> 200, text/plain; version=0.0.4, body = registry Serialize()
//   GET /healthz  -> 200 "ok" (or 503 "unhealthy" when Options::healthy says so)
//   other paths   -> 404; methods other than GET/HEAD -> 405
// Every response carries Connection: close (one request per connection).
//
// Built for hostile clients: request headers are bounded (431 past
// max_header_bytes), a client has read_timeout to send them (slowloris) and
// write_timeout to read the answer, garbage gets 400, at most max_connections
// are handled at once (503 past that), and no input can crash the process.
// One acceptor thread; each connection gets a short-lived handler thread so a
// silent client never delays others.
//
// Thread safety: Start/Stop/port may be called from any thread; Stop() is
// idempotent, wakes every handler at once, and joins all threads before it
// returns. The registry must outlive the server.
#ifndef TANDEM_COMMON_METRICS_HTTP_SERVER_H_
#define TANDEM_COMMON_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"

namespace tandem::metrics {

class MetricsHttpServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";  // "::" for IPv6, "127.0.0.1" for loopback only
    int port = 0;                  // 0: an ephemeral port; see port()
    absl::Duration read_timeout = absl::Seconds(5);
    absl::Duration write_timeout = absl::Seconds(10);
    size_t max_header_bytes = 8192;
    int max_connections = 16;
    // Optional: /healthz answers 503 while this returns false. Called on a
    // handler thread; must be thread-safe.
    std::function<bool()> healthy;
  };

  MetricsHttpServer(const MetricsRegistry* registry, Options options);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds, listens and starts the acceptor. Errors: InvalidArgument (bad
  // host/port/options), Unavailable (address in use, cannot bind),
  // FailedPrecondition (already started).
  absl::Status Start();
  // Stops accepting, closes open connections, joins all threads.
  void Stop();
  // The bound port (useful with port 0); 0 before Start().
  int port() const { return port_.load(std::memory_order_acquire); }

  struct Response {
    int status = 200;
    std::string content_type;
    std::string body;
    bool head = false;  // HEAD: headers only
  };
  // Answers one raw request (everything up to and including the blank line).
  // Exposed for tests; the socket loop adds nothing but I/O.
  Response Handle(std::string_view request) const;

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void AcceptLoop();
  void ServeConnection(Connection* conn) const;
  // Joins finished handler threads (acceptor thread only).
  void ReapConnections(bool all);

  const MetricsRegistry* registry_;
  const Options options_;
  std::atomic<int> port_{0};
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};  // written by Stop(); polled by every thread
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread acceptor_;
  // Owned by the acceptor thread while it runs, then by Stop().
  std::list<std::unique_ptr<Connection>> connections_;
};

// Formats a complete HTTP/1.1 response with Content-Length and
// Connection: close.
std::string FormatHttpResponse(const MetricsHttpServer::Response& response);

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_HTTP_SERVER_H_
