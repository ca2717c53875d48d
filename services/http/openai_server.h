// OpenAiServer: the router's OpenAI-compatible HTTP/SSE front door
// (docs/api.md, "HTTP API"). POST /v1/completions, POST /v1/chat/completions
// (streaming with `stream: true`), GET /v1/models, GET /health.
//
// One path, two encodings: a JSON body becomes a tandem.v1.GenerateRequest
// (openai_protocol.h) and goes through GenerationServiceImpl::Admit, then
// CallStream, exactly like a gRPC Generate call: the same validation, API
// keys, admission bounds, backend, metrics and drain.
//
// Asynchronous (Boost.Beast on Asio, all of it in openai_server.cc): a fixed
// few io threads (`io_threads`) run every connection; nothing blocks on a
// client or on the engine. An admitted call registers a notifier on its
// CallQueue that posts to the connection's strand, as the gRPC
// GenerateReactor is woken, so an idle or slow stream costs a connection's
// memory, not a thread.
//
// Bounds: open connections (`max_connections`; the one beyond gets a 503
// JSON error with Retry-After and is closed), request header size in total
// (`max_header_bytes`: 431), body size (`max_body_bytes`: 413), JSON nesting
// depth, a request must arrive within `read_timeout` of its first byte (and
// a fresh connection's first byte within `read_timeout` too), each write
// completes within `write_timeout`, a keep-alive connection idles at most
// `idle_timeout`. A streaming client that goes away is noticed on the next
// write (tokens, or an SSE comment after `ping_interval` without one); the
// call is then cancelled and its KV freed.
//
// Thread safety: Start / port / Stop from any thread; Stop is idempotent.
// `generation` must outlive the server. Start ignores SIGPIPE process-wide
// (a write to a closed socket must fail, not kill the process).
#ifndef TANDEM_SERVICES_HTTP_OPENAI_SERVER_H_
#define TANDEM_SERVICES_HTTP_OPENAI_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/router/generation_service.h"

namespace tandem::http {

class OpenAiServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    int port = 8000;                                      // 0 = any free port (see port())
    router::GenerationServiceImpl* generation = nullptr;  // required
    std::function<bool()> ready;                          // /health; null = always
    size_t max_body_bytes = 4 << 20;
    size_t max_header_bytes = 16 << 10;                // the whole header: request line and fields
    int io_threads = 2;                                // run every connection
    int max_connections = 4096;                        // open at once; beyond: 503 and close
    absl::Duration read_timeout = absl::Seconds(30);   // one request, from its first byte
    absl::Duration write_timeout = absl::Seconds(30);  // one write
    absl::Duration idle_timeout = absl::Seconds(60);   // keep-alive between requests
    absl::Duration ping_interval = absl::Seconds(1);   // SSE comment when idle
  };

  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(Options options);
  ~OpenAiServer();  // Stop()

  int port() const;
  // Closes the listener and every connection (their calls are cancelled),
  // then joins the io threads.
  void Stop();

  struct Impl;  // openai_server.cc: Asio / Beast types stay there

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http

#endif  // TANDEM_SERVICES_HTTP_OPENAI_SERVER_H_
