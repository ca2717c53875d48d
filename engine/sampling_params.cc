#include "engine/sampling_params.h"

#include <cmath>
#include <string_view>

#include "absl/strings/str_format.h"
#include "common/utf8.h"

namespace tandem::engine {
namespace {

// NaN fails every comparison, so "!(lo <= x && x <= hi)" rejects it too.
bool InRange(double x, double lo, double hi) { return lo <= x && x <= hi; }

absl::Status CheckTokenId(std::string_view field, int64_t id, int64_t vocab_size) {
  if (id < 0 || (vocab_size >= 0 && id >= vocab_size)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: token id %d out of range [0, %d)", field,
                                                      id, vocab_size < 0 ? INT32_MAX : vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StopParams::Validate(int64_t vocab_size) const {
  if (max_tokens.has_value() && !(*max_tokens >= 1 && *max_tokens <= kMaxMaxTokens)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens must be in [1, %d], got %d", kMaxMaxTokens, *max_tokens));
  }
  if (min_tokens < 0 || min_tokens > kMaxMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("min_tokens must be in [0, %d], got %d", kMaxMaxTokens, min_tokens));
  }
  if (max_tokens.has_value() && min_tokens > *max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("min_tokens (%d) must be <= max_tokens (%d)", min_tokens, *max_tokens));
  }
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrFormat("stop_token_ids: at most %d ids, got %d",
                                                      kMaxStopTokenIds, stop_token_ids.size()));
  }
  for (int32_t id : stop_token_ids) {
    if (absl::Status s = CheckTokenId("stop_token_ids", id, vocab_size); !s.ok()) return s;
  }
  if (stop_strings.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrFormat("stop_strings: at most %d strings, got %d",
                                                      kMaxStopStrings, stop_strings.size()));
  }
  for (const std::string& stop : stop_strings) {
    if (stop.empty() || stop.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop_strings: each must be 1 to %d bytes, got %d", kMaxStopStringBytes, stop.size()));
    }
    // Valid UTF-8 also guarantees that a match never starts inside a code
    // point, so the StopChecker never splits one.
    if (!utf8::IsValidUtf8(stop)) {
      return absl::InvalidArgumentError("stop_strings: each must be valid UTF-8");
    }
  }
  return absl::OkStatus();
}

absl::Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!InRange(temperature, 0.0, kMaxTemperature)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be in [0, %g], got %g", kMaxTemperature, temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("top_k must be >= 0, got %d", top_k));
  }
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("top_p must be in (0, 1], got %g", top_p));
  }
  if (!InRange(min_p, 0.0, 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat("min_p must be in [0, 1], got %g", min_p));
  }
  if (!(repetition_penalty > 0.0 && repetition_penalty <= kMaxRepetitionPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("repetition_penalty must be in (0, %g], got %g", kMaxRepetitionPenalty,
                        repetition_penalty));
  }
  if (!InRange(presence_penalty, -kMaxAbsPenalty, kMaxAbsPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("presence_penalty must be in [-%g, %g], got %g", kMaxAbsPenalty,
                        kMaxAbsPenalty, presence_penalty));
  }
  if (!InRange(frequency_penalty, -kMaxAbsPenalty, kMaxAbsPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("frequency_penalty must be in [-%g, %g], got %g", kMaxAbsPenalty,
                        kMaxAbsPenalty, frequency_penalty));
  }
  if (logit_bias.size() > kMaxLogitBiasEntries) {
    return absl::InvalidArgumentError(absl::StrFormat("logit_bias: at most %d entries, got %d",
                                                      kMaxLogitBiasEntries, logit_bias.size()));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (absl::Status s = CheckTokenId("logit_bias", id, vocab_size); !s.ok()) return s;
    if (!InRange(bias, -kMaxAbsLogitBias, kMaxAbsLogitBias)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit_bias: bias for token %d must be in [-%g, %g], got %g", id,
                          kMaxAbsLogitBias, kMaxAbsLogitBias, bias));
    }
  }
  if (num_logprobs.has_value() && !(*num_logprobs >= 0 && *num_logprobs <= kMaxNumLogprobs)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_logprobs must be in [0, %d], got %d", kMaxNumLogprobs, *num_logprobs));
  }
  if (num_speculative_tokens.has_value() &&
      !(*num_speculative_tokens >= 0 && *num_speculative_tokens <= kMaxRequestSpecTokens)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_speculative_tokens must be in [0, %d], got %d", kMaxRequestSpecTokens,
                        *num_speculative_tokens));
  }
  return stop.Validate(vocab_size);
}

}  // namespace tandem::engine
