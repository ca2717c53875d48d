// OpenAiServer: the router's OpenAI-compatible HTTP/SSE front door
// (docs/api.md, "HTTP API"). POST /v1/completions, POST /v1/chat/completions
// (streaming with `stream: true`), GET /v1/models, GET /health.
//
// One path, two encodings: a JSON body becomes a tandem.v1.GenerateRequest
// (openai_protocol.h) and goes through GenerationServiceImpl::Admit / Stream,
// exactly like a gRPC Generate call: the same validation, API keys, admission
// bounds, backend, metrics and drain.
//
// Bounds: body size (413), JSON nesting depth, header size (cpp-httplib's
// 8 KiB), a fixed pool of connection threads (each streaming call holds one),
// read / write timeouts. A streaming client that goes away is noticed on the
// next write (tokens, or an SSE comment after a second without one); the call
// is then cancelled and its KV freed.
//
// Thread safety: Start / port / Stop from any thread; Stop is idempotent.
// `generation` must outlive the server. Start ignores SIGPIPE process-wide
// (a write to a closed socket must fail, not kill the process).
#ifndef TANDEM_SERVICES_HTTP_OPENAI_SERVER_H_
#define TANDEM_SERVICES_HTTP_OPENAI_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/http/openai_protocol.h"
#include "services/router/generation_service.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tandem::http {

class OpenAiServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    int port = 8000;                                      // 0 = any free port (see port())
    router::GenerationServiceImpl* generation = nullptr;  // required
    std::function<bool()> ready;                          // /health; null = always
    size_t max_body_bytes = 4 << 20;
    int num_threads = 64;  // connections served at once
    absl::Duration read_timeout = absl::Seconds(30);
    absl::Duration write_timeout = absl::Seconds(30);
    absl::Duration ping_interval = absl::Seconds(1);  // SSE comment when idle
  };

  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(Options options);
  ~OpenAiServer();  // Stop()

  int port() const { return port_; }
  void Stop();

 private:
  OpenAiServer() = default;
  // Limits, the error shape and the routes below (run on cpp-httplib's
  // connection threads; the server outlives them: Stop joins).
  void Install();
  // OK, or the 401 sent (a missing or wrong API key, counted).
  bool Authenticate(const httplib::Request& req, httplib::Response& res) const;
  // POST /v1/completions and /v1/chat/completions: parse, admit, then the
  // whole response or an SSE stream (a broken connection cancels the call).
  void Generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) const;
  void Models(const httplib::Request& req, httplib::Response& res) const;  // GET /v1/models
  void Health(httplib::Response& res) const;                               // GET /health

  Options options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  int64_t created_ = 0;
};

}  // namespace tandem::http

#endif  // TANDEM_SERVICES_HTTP_OPENAI_SERVER_H_
