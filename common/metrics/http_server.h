// The HTTP endpoint Prometheus scrapes and probes hit, on cpp-httplib
// (internal and GET-only; the OpenAI API's front door, services/http/, is on
// Boost.Beast):
//   GET /metrics  -> 200, text/plain; version=0.0.4, body = registry Serialize()
//   GET /healthz  -> 200 "ok" (or 503 "unhealthy" while Options::healthy says so)
//   other paths   -> 404; methods other than GET/HEAD on those two -> 405
// One request per connection (Connection: close).
//
// Not prometheus-cpp's pull Exposer nor civetweb underneath it: Debian's
// civetweb starts its worker threads with a fixed 100 KiB stack, which glibc
// refuses (EINVAL) once the process's static TLS is larger, as it is whenever
// the CUDA libraries are linked (docs/architecture.md); and the Exposer has no
// /healthz with a 503.
//
// Bounded as far as cpp-httplib 0.11 allows: a request line or header line
// over 8 KiB gets 400 (CPPHTTPLIB_HEADER_MAX_LENGTH), the request body
// max_body_bytes (413), each read and write request_timeout (a client that
// sends nothing is dropped after it); num_threads connections are served at
// once, max_queued more wait, and past that the accepting thread serves one
// itself (so accepting pauses and further clients wait in the kernel's
// backlog). Malformed requests get 400; no input crashes the process.
// Not bounded by this cpp-httplib: the number of header lines of one request.
//
// Thread safety: Start/Stop/port may be called from any thread; Stop() is
// idempotent and joins every thread before it returns (a request in progress
// may take up to request_timeout to finish). The registry must outlive the
// server.
#ifndef TANDEM_COMMON_METRICS_HTTP_SERVER_H_
#define TANDEM_COMMON_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tandem::metrics {

// Runs server->listen_after_bind() (bound already) on a new thread and
// returns that thread once the listen loop runs, or has already returned.
// cpp-httplib's stop() does nothing before the loop starts, so a stop()
// right after a plain thread start could be lost and the join hang forever.
std::thread StartListening(httplib::Server* server);

class MetricsHttpServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";  // "::" for IPv6, "127.0.0.1" for loopback only
    int port = 0;                  // 0: an ephemeral port; see port()
    absl::Duration request_timeout = absl::Seconds(5);  // per read / write
    size_t max_body_bytes = 4096;
    int num_threads = 4;  // connections served at once
    int max_queued = 64;  // accepted connections waiting for a thread
    // Optional: /healthz answers 503 while this returns false. Called on a
    // server thread; must be thread-safe.
    std::function<bool()> healthy;
    // Optional: called before each /metrics response is rendered (refresh
    // values computed from another component). Called on a server thread,
    // possibly on several at once; must be thread-safe.
    std::function<void()> before_scrape;
  };

  MetricsHttpServer(const MetricsRegistry* registry, Options options);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds, listens and starts serving. Errors:
  // InvalidArgument (bad host/port/options), Unavailable (address in use,
  // cannot bind), FailedPrecondition (already started).
  absl::Status Start();
  // Stops accepting, lets the requests in progress finish and joins the
  // threads.
  void Stop();
  // The bound port (useful with port 0); 0 before Start().
  int port() const { return port_.load(std::memory_order_acquire); }

 private:
  void Install() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // handlers and limits on server_

  const MetricsRegistry* registry_;
  const Options options_;
  std::atomic<int> port_{0};
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<httplib::Server> server_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // runs listen_after_bind()
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_HTTP_SERVER_H_
