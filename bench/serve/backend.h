// `tandem bench` backends: the public tandem.v1.Generation gRPC API, and any
// OpenAI-compatible completions server (POST /v1/completions, stream=true,
// server-sent events) over a minimal HTTP/1.1 client.
#ifndef TANDEM_BENCH_SERVE_BACKEND_H_
#define TANDEM_BENCH_SERVE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/serve/stats.h"
#include "bench/serve/workload.h"
#include "services/common/tls.h"

namespace tandem::bench {

struct ServerInfo {
  std::string model;
  int64_t vocab_size = 0;      // 0: prompts are text (words)
  int64_t context_length = 0;  // 0: unknown
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Model name and limits (GetModelInfo); fails when the server is down.
  virtual absl::StatusOr<ServerInfo> Probe(absl::Time deadline) = 0;
  // Sends one streaming request and times it. Never throws; a failure is a
  // record with ok = false and the status code name. Thread-safe.
  virtual RequestRecord Send(const BenchRequest& request, absl::Time deadline) = 0;
};

// security: TLS of the channel (default plaintext); api_key: sent as
// `authorization: Bearer <key>` when non-empty.
std::unique_ptr<Backend> MakeGrpcBackend(const std::string& address,
                                         const services::ChannelSecurity& security = {},
                                         const std::string& api_key = "");
// `url`: http://host[:port][/prefix]; requests go to prefix + /v1/completions
// (or to the URL itself when it ends in /completions). `model` is sent as the
// "model" field.
absl::StatusOr<std::unique_ptr<Backend>> MakeOpenAiHttpBackend(const std::string& url,
                                                               const std::string& model);

// Splits a server-sent-events byte stream into the payloads of its
// `data:` lines; exposed for tests.
class SseParser {
 public:
  // Appends bytes; returns the complete data payloads they finish.
  std::vector<std::string> Feed(std::string_view bytes);

 private:
  std::string pending_;
};

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_SERVE_BACKEND_H_
