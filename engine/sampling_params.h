// Per-request sampling and stop parameters, as native engine types.
//
// services/* parse the wire format into these structs at the edge and call
// Validate(vocab_size) before a request reaches the engine; the Sampler and
// StopChecker then assume valid params (REQUIRES: Validate() is OK).
//
// Defaults are "off": greedy, no truncation, no penalties, no bias, no
// logprobs, no stop conditions besides EOS.
#ifndef TANDEM_ENGINE_SAMPLING_PARAMS_H_
#define TANDEM_ENGINE_SAMPLING_PARAMS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::engine {

// Bounds checked by Validate(); requests beyond them are rejected, not clamped.
inline constexpr double kMaxTemperature = 100.0;
inline constexpr double kMaxRepetitionPenalty = 10.0;
inline constexpr double kMaxAbsPenalty = 2.0;      // presence / frequency (OpenAI)
inline constexpr double kMaxAbsLogitBias = 100.0;  // OpenAI
inline constexpr size_t kMaxLogitBiasEntries = 1024;
inline constexpr int kMaxNumLogprobs = 20;
inline constexpr int64_t kMaxMaxTokens = int64_t{1} << 20;
inline constexpr size_t kMaxStopTokenIds = 64;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 128;
inline constexpr int64_t kMaxRequestSpecTokens = 16;  // engine::kMaxSpeculativeTokens

// When a sequence stops. Enforced by StopChecker (stop_checker.h), except
// min_tokens, which the Sampler also enforces by masking EOS / stop tokens.
struct StopParams {
  // Output tokens at most; nullopt = no request limit (the engine still stops
  // at the model's context length). The stop / EOS token counts as a token.
  std::optional<int64_t> max_tokens = std::nullopt;
  // EOS and stop_token_ids cannot end the sequence (the sampler gives them
  // probability 0) and stop strings are not matched until this many output
  // tokens exist. 0 = off. Must be <= max_tokens.
  int64_t min_tokens = 0;
  // EOS is an ordinary token (max_tokens and other stops still apply).
  bool ignore_eos = false;
  // Token ids that end the sequence (besides EOS); their text is not emitted.
  std::vector<int32_t> stop_token_ids = {};
  // Strings that end the sequence, matched on the decoded output text across
  // token boundaries; the match and everything after it is not emitted.
  // Non-empty, valid UTF-8, at most kMaxStopStringBytes each.
  std::vector<std::string> stop_strings = {};

  // InvalidArgument naming the field; vocab_size < 0 skips the id upper bound.
  absl::Status Validate(int64_t vocab_size = -1) const;
};

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy; [0, kMaxTemperature]
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // (0, 1]; 1 = off
  double min_p = 0.0;        // [0, 1]; 0 = off
  uint64_t seed = 0;

  // Penalties, applied to the logits before bias, truncation and temperature.
  // repetition_penalty (HF / llama.cpp): for every distinct token in prompt +
  // output, a positive logit is divided by it, a negative one multiplied.
  // (0, kMaxRepetitionPenalty]; 1 = off.
  double repetition_penalty = 1.0;
  // OpenAI: logit -= frequency_penalty * count + presence_penalty * (count > 0)
  // where count is the token's number of occurrences in the output (not the
  // prompt). Each in [-2, 2]; 0 = off.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // Added to the token's logit after the penalties. Values in [-100, 100];
  // +100 all but forces a token, -100 all but bans it. Ordered, so the
  // processing order is fixed.
  std::map<int32_t, float> logit_bias = {};

  // nullopt = no logprobs. N >= 0 = the sampled token's logprob plus the N
  // most likely alternatives (see SampleResult for the distribution).
  std::optional<int> num_logprobs = std::nullopt;

  StopParams stop = {};

  // Speculative decoding for this request (docs/speculative.md): draft
  // tokens per step at most; 0 turns speculation off for the request, a
  // value above the server's --spec-tokens is capped to it. nullopt = the
  // server's setting. [0, kMaxRequestSpecTokens].
  std::optional<int64_t> num_speculative_tokens = std::nullopt;

  // InvalidArgument naming the field for every out-of-range value (NaN,
  // negatives, top_p outside (0, 1], oversized lists). Token ids (logit_bias,
  // stop_token_ids) must be in [0, vocab_size); vocab_size < 0 checks only
  // that they are non-negative.
  absl::Status Validate(int64_t vocab_size = -1) const;
};

}  // namespace tandem::engine

#endif  // TANDEM_ENGINE_SAMPLING_PARAMS_H_
