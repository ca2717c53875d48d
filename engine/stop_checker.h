// Per-sequence stop detection on the token stream and the decoded text.
//
// Contract for the engine, once per generated token, in order:
//   std::string delta = detokenizer.Push(id);   // whole code points only
//   StopUpdate u = checker.Update(id, delta);
//   emit(u.text);                               // may be empty
//   if (u.finish.has_value()) finish the sequence with *u.finish.
// The concatenation of every u.text is the request's output text. Text that
// could be the start of a stop string is held back until a later token
// resolves it; it is released when the match fails or the sequence finishes
// for another reason (EOS, stop token, length). If the engine ends the
// sequence itself (context length, deadline, cancel), call Flush() for the
// held-back text. After a finish, Update() returns the same reason (and stop
// token / string) with no text and ignores its input.
//
// Rules, checked in this order for output token number n (1-based):
//   - EOS (unless ignore_eos) or a stop_token_id, when n > min_tokens: finish
//     kEos / kStop (stop_token_id says which token); the token's own text is not emitted. Before
//     that (the sampler masks them, so only with a foreign sampler) it is an ordinary token.
//   - A stop string completed in the text, when n >= min_tokens: finish
//     kStop (stop_string says which); the text from the earliest match on is not emitted.
//   - n == max_tokens: finish kLength, all held text released.
// Stop strings are valid UTF-8 (StopParams::Validate), the input is whole
// code points, so a held-back or dropped suffix never splits a code point.
//
// Cost per Update: O(num_stop_strings * max_stop_len * held_len).
// Thread safety: not thread-safe (one per sequence).
#ifndef TANDEM_ENGINE_STOP_CHECKER_H_
#define TANDEM_ENGINE_STOP_CHECKER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/finish_reason.h"
#include "engine/sampling_params.h"

namespace tandem::engine {

struct StopUpdate {
  // kEos, kStop or kLength once the sequence ends; none while it goes on.
  std::optional<FinishReason> finish;
  std::string text;            // text to emit now
  int32_t stop_token_id = -1;  // kEos, or kStop by a stop token: the token
  std::string stop_string;     // kStop by a stop string: the one that matched
};

class StopChecker {
 public:
  // Copies what it needs. REQUIRES: params.Validate().ok().
  StopChecker(const StopParams& params, absl::Span<const int32_t> eos_token_ids);

  StopUpdate Update(int32_t token_id, std::string_view text_delta);

  // Releases the held-back text (the engine ended the sequence itself).
  std::string Flush();

  int64_t num_tokens() const { return num_tokens_; }
  std::optional<FinishReason> finish() const { return finish_; }
  bool finished() const { return finish_.has_value(); }
  size_t num_held_bytes() const { return held_.size(); }

 private:
  // Length of the longest suffix of held_ that is a proper prefix of a stop
  // string.
  size_t HoldBackLength() const;
  // Ends the sequence: every later Update repeats reason, token and string.
  StopUpdate Finish(FinishReason reason, std::string text, int32_t stop_token_id = -1,
                    std::string stop_string = "");

  StopParams params_;
  std::vector<int32_t> eos_token_ids_;
  int64_t num_tokens_ = 0;
  std::optional<FinishReason> finish_;
  int32_t stop_token_id_ = -1;
  std::string stop_string_;
  std::string held_;  // decoded text not yet emitted
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_STOP_CHECKER_H_
