// The HTTP endpoint Prometheus scrapes and probes hit, on civetweb (the
// embedded server prometheus-cpp's pull Exposer runs on; used directly because
// the Exposer serves only collectables: no /healthz, no 503):
//   GET /metrics  -> 200, text/plain; version=0.0.4, body = registry Serialize()
//   GET /healthz  -> 200 "ok" (or 503 "unhealthy" while Options::healthy says so)
//   other paths   -> 404; methods other than GET/HEAD on those two -> 405
// No keep-alive: every response closes its connection.
//
// Bounded for hostile clients by civetweb: a request line + headers larger
// than max_request_bytes is refused (413) and garbage gets 400; a client has
// request_timeout to send its request and to take the answer (slowloris);
// num_threads connections are served at once, further ones wait in
// civetweb's queue and the listen backlog (they are not refused). No input
// crashes the process.
//
// Thread safety: Start/Stop/port may be called from any thread; Stop() is
// idempotent and joins civetweb's threads before it returns. The registry must
// outlive the server.
#ifndef TANDEM_COMMON_METRICS_HTTP_SERVER_H_
#define TANDEM_COMMON_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"

struct mg_context;
struct mg_connection;

namespace tandem::metrics {

class MetricsHttpServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";  // "::" for IPv6, "127.0.0.1" for loopback only
    int port = 0;                  // 0: an ephemeral port; see port()
    absl::Duration request_timeout = absl::Seconds(5);  // civetweb request_timeout_ms
    size_t max_request_bytes = 8192;                    // civetweb max_request_size
    int num_threads = 16;                               // connections served at once
    // Optional: /healthz answers 503 while this returns false. Called on a
    // civetweb thread; must be thread-safe.
    std::function<bool()> healthy;
  };

  MetricsHttpServer(const MetricsRegistry* registry, Options options);
  ~MetricsHttpServer();  // Stop()
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Resolves host, binds, listens and starts civetweb. Errors:
  // InvalidArgument (bad host/port/options), Unavailable (address in use,
  // cannot bind), FailedPrecondition (already started).
  absl::Status Start();
  // Stops accepting, lets civetweb finish the requests in progress and joins
  // its threads.
  void Stop();
  // The bound port (useful with port 0); 0 before Start().
  int port() const { return port_.load(std::memory_order_acquire); }

 private:
  static int HandleRequest(mg_connection* conn, void* self);

  const MetricsRegistry* registry_;
  const Options options_;
  std::atomic<int> port_{0};
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  mg_context* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string wake_address_ ABSL_GUARDED_BY(mu_);  // numeric host Stop() connects to
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_HTTP_SERVER_H_
