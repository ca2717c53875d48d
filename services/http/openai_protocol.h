// The OpenAI wire format at the router's HTTP edge: a JSON body of
// POST /v1/completions or /v1/chat/completions becomes a
// tandem.v1.GenerateRequest (the same proto the gRPC API takes, so both go
// through PrepareRequest, admission and the backend in GenerationServiceImpl),
// and GenerateResponse messages become OpenAI's JSON objects / SSE chunks.
//
// Only JSON shape and types are checked here (with the OpenAI field name in
// the error); every range and limit is checked once, by PrepareRequest.
//
// Untrusted input: the body is bounded by the server (size); nesting depth is
// bounded here before parsing; numbers are range-checked before narrowing.
//
// Thread safety: pure functions over const inputs.
#ifndef TANDEM_SERVICES_HTTP_OPENAI_PROTOCOL_H_
#define TANDEM_SERVICES_HTTP_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::http {

inline constexpr int kMaxJsonDepth = 32;
inline constexpr size_t kMaxUserBytes = 256;

enum class Endpoint { kCompletions, kChat };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  tandem::v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// An error as OpenAI shapes it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;
  std::string param;  // empty = null
  std::string code;   // empty = null
};

// Body -> request. InvalidArgument naming the field (param in ApiErrorFrom);
// NotFound when `model` is not `model_name`.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, std::string_view body,
                                                 const std::string& model_name);

// An INVALID_ARGUMENT from the router's validation names the gRPC field
// ("sampling.top_p must be in ..."): this names the OpenAI parameter instead
// ("top_p must be in ...", param "top_p"). Other statuses are returned as
// they are.
absl::Status WithOpenAiParam(Endpoint endpoint, const absl::Status& status);

// absl::Status (from parsing, validation, admission or the backend) -> the
// HTTP status and OpenAI error fields.
ApiError ApiErrorFrom(const absl::Status& status);
std::string ApiErrorJson(const ApiError& error);

// Accumulates a call's messages into OpenAI's objects.
class ResponseBuilder {
 public:
  ResponseBuilder(const OpenAiRequest& request, std::string model_name,
                  const tokenizer::Tokenizer* tokenizer, int64_t created);
  // Non-streaming: add every message, then Body().
  void Add(const tandem::v1::GenerateResponse& response);
  std::string Body() const;
  // Streaming: the SSE events ("data: {...}\n\n") for one message; the final
  // message also yields the usage chunk (include_usage) and "data: [DONE]".
  std::string Chunk(const tandem::v1::GenerateResponse& response, bool last);
  // An SSE error event for a failure after the stream started, then [DONE].
  static std::string ErrorEvent(const ApiError& error);

 private:
  const OpenAiRequest& request_;
  std::string model_name_;
  const tokenizer::Tokenizer* tokenizer_;
  int64_t created_;
  std::string id_;
  std::string text_;
  std::string finish_reason_;
  tandem::v1::Usage usage_;
  std::vector<tandem::v1::PositionLogprobs> logprobs_;
  bool sent_role_ = false;
};

}  // namespace tandem::http

#endif  // TANDEM_SERVICES_HTTP_OPENAI_PROTOCOL_H_
