// Request validation and preparation at the router's edge: a
// tandem.v1.GenerateRequest from an untrusted client becomes a
// PreparedRequest (token ids + engine::SamplingParams) or an INVALID_ARGUMENT
// status whose message names the offending field.
//
// Defaults applied (docs/api.md): temperature 1.0, top_p 1.0, top_k 0, min_p 0,
// repetition_penalty 1.0, max_tokens 256 (capped to what fits in the context
// only when max_tokens was not given), seed = FNV-1a 64 of request_id when
// unset (so a retried request with the same id draws the same numbers), an
// assigned request_id "req-<16 hex>" when empty.
//
// Thread safety: pure functions over const inputs.
#ifndef TANDEM_SERVICES_ROUTER_VALIDATE_H_
#define TANDEM_SERVICES_ROUTER_VALIDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/sampling_params.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

inline constexpr int32_t kDefaultMaxTokens = 256;
inline constexpr double kDefaultTemperature = 1.0;
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr size_t kMaxCacheSaltBytes = 64;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 128;  // engine::kMaxStopStringBytes
inline constexpr size_t kMaxStopTokenIds = 64;
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxChatMessages = 256;
inline constexpr size_t kMaxPromptBytes = 1 << 20;  // text / chat content, total
inline constexpr size_t kMaxLogitBias = 1024;

// What the router knows about the model it serves.
struct ModelLimits {
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  int32_t max_tokens_limit = 0;  // largest max_tokens; <= context_length - 1
};

// A validated request, ready for a backend.
struct PreparedRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  engine::SamplingParams params;  // params.stop.max_tokens always set
  uint64_t cache_key = 0;         // prefix-cache namespace: hash of cache_salt (0 = none)
  bool logprobs = false;          // return the sampled tokens' logprobs
  int32_t top_logprobs = 0;       // alternatives per position (when logprobs)
};

// The request's seed when sampling.seed is unset: FNV-1a 64 of request_id.
uint64_t DefaultSeed(const std::string& request_id);

// A fresh request id ("req-" + 16 hex digits from a process-wide counter
// mixed with the clock).
std::string NewRequestId();

// Checks every field, tokenizes (text with special-token parsing, or the chat
// messages through the model's chat template) and applies the defaults.
// `tokenizer` may be null only for token_ids prompts.
absl::StatusOr<PreparedRequest> PrepareRequest(const tandem::v1::GenerateRequest& request,
                                               const ModelLimits& limits,
                                               const tokenizer::Tokenizer* tokenizer);

// Chat messages -> token ids with the model's template (shared with Tokenize).
absl::StatusOr<std::vector<int32_t>> EncodeChat(const tandem::v1::ChatMessages& messages,
                                                const tokenizer::Tokenizer& tokenizer);

// InvalidArgument when `message` (or a message field of it, recursively)
// carries fields this server does not know.
absl::Status CheckNoUnknownFields(const google::protobuf::Message& message,
                                  const std::string& path);

}  // namespace tandem::router

#endif  // TANDEM_SERVICES_ROUTER_VALIDATE_H_
