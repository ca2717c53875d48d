// Fuzzes request validation at the public edge: arbitrary bytes parsed as a
// tandem.v1.GenerateRequest (what a gRPC client can send) go through the
// router's PrepareRequest with the real SmolLM2 / tiny SPM tokenizer. It
// returns INVALID_ARGUMENT (FAILED_PRECONDITION for chat without a template)
// or a request the engine can run: a non-empty
// prompt of in-vocabulary ids that, with max_tokens, fits the context, and
// sampling parameters that pass SamplingParams::Validate.
#include <cstdint>

#include "services/router/validate.h"
#include "tests/fuzz/fuzz_models.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const auto& t : tandem::fuzz::FuzzTokenizers()) {
    tandem::router::ModelLimits limits;
    limits.context_length = 512;
    limits.vocab_size = t->tokenizer->vocab().size();
    limits.max_tokens_limit = 511;
    auto prepared = tandem::router::PrepareRequest(request, limits, t->tokenizer.get());
    if (!prepared.ok()) {
      // FailedPrecondition: chat messages for a model without a supported template.
      const absl::StatusCode code = prepared.status().code();
      if (code != absl::StatusCode::kInvalidArgument &&
          code != absl::StatusCode::kFailedPrecondition) {
        __builtin_trap();
      }
      continue;
    }
    const auto& ids = prepared->prompt_token_ids;
    if (ids.empty()) __builtin_trap();
    for (int32_t id : ids) {
      if (id < 0 || id >= limits.vocab_size) __builtin_trap();
    }
    if (!prepared->params.stop.max_tokens.has_value()) __builtin_trap();
    if (static_cast<int64_t>(ids.size()) + *prepared->params.stop.max_tokens >
        limits.context_length) {
      __builtin_trap();
    }
    if (!prepared->params.Validate().ok()) __builtin_trap();
  }
  return 0;
}
