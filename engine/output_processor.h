// Per-request output processing on the engine thread: each sampled token goes
// through the StreamingDetokenizer and the StopChecker, giving the text delta
// to emit and whether the request is done (EOS, stop token / string,
// max_tokens, or the model's context length).
//
// stop_checker.h is included only by the .cc (it and sequence.h both declare
// an engine::FinishReason), so the engine sees FinishReason only.
//
// Thread safety: none (one per request, engine thread). The tokenizer, when
// given, must outlive the processor.
#ifndef TANDEM_ENGINE_OUTPUT_PROCESSOR_H_
#define TANDEM_ENGINE_OUTPUT_PROCESSOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "engine/request_stream.h"
#include "engine/sampling_params.h"

namespace tandem::engine {

class StopChecker;

struct TokenOutcome {
  std::string text;                    // to emit with this token
  std::optional<FinishReason> finish;  // set when the request ends here
};

class OutputProcessor {
 public:
  // tokenizer: null = no text (ids only). max_output_tokens: the context
  // limit (context_length - prompt length), applied besides stop.max_tokens.
  // REQUIRES: stop.Validate().ok(), max_output_tokens >= 1.
  OutputProcessor(const tokenizer::Tokenizer* tokenizer, const StopParams& stop,
                  absl::Span<const int32_t> eos_token_ids, int64_t max_output_tokens);
  ~OutputProcessor();

  OutputProcessor(const OutputProcessor&) = delete;
  OutputProcessor& operator=(const OutputProcessor&) = delete;

  TokenOutcome Process(int32_t token_id);

  // Held-back text when the engine ends the request itself (cancel).
  std::string Flush();

  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::optional<tokenizer::StreamingDetokenizer> detokenizer_;
  std::unique_ptr<StopChecker> checker_;
  int64_t max_output_tokens_;
  int64_t num_tokens_ = 0;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_OUTPUT_PROCESSOR_H_
