#include "engine/sampling_params.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The error is InvalidArgument and names `field`.
void ExpectNames(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_NE(status.message().find(field), std::string::npos) << status.message();
}

TEST(SamplingParamsTest, DefaultsAndTypicalRequestsAreValid) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  SamplingParams p{.temperature = 0.7,
                   .top_k = 40,
                   .top_p = 0.9,
                   .min_p = 0.05,
                   .seed = 1,
                   .repetition_penalty = 1.1,
                   .presence_penalty = -2.0,
                   .frequency_penalty = 2.0};
  p.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  p.num_logprobs = 0;
  p.stop = {
      .max_tokens = 16, .min_tokens = 16, .stop_token_ids = {5}, .stop_strings = {"\n\n", "終"}};
  EXPECT_TRUE(p.Validate(100).ok()) << p.Validate(100);
  p.num_logprobs = kMaxNumLogprobs;
  EXPECT_TRUE(p.Validate().ok());
}

TEST(SamplingParamsTest, ScalarFieldsOutOfRange) {
  ExpectNames(SamplingParams{.temperature = kNaN}.Validate(), "temperature");
  ExpectNames(SamplingParams{.temperature = 1e9}.Validate(), "temperature");
  ExpectNames(SamplingParams{.top_p = kNaN}.Validate(), "top_p");
  ExpectNames(SamplingParams{.min_p = -0.1}.Validate(), "min_p");
  ExpectNames(SamplingParams{.repetition_penalty = 0.0}.Validate(), "repetition_penalty");
  ExpectNames(SamplingParams{.repetition_penalty = kNaN}.Validate(), "repetition_penalty");
  ExpectNames(SamplingParams{.repetition_penalty = 11}.Validate(), "repetition_penalty");
  ExpectNames(SamplingParams{.presence_penalty = 2.5}.Validate(), "presence_penalty");
  ExpectNames(SamplingParams{.frequency_penalty = kNaN}.Validate(), "frequency_penalty");
  ExpectNames(SamplingParams{.frequency_penalty = -3}.Validate(), "frequency_penalty");
  ExpectNames(SamplingParams{.num_logprobs = -1}.Validate(), "num_logprobs");
  ExpectNames(SamplingParams{.num_logprobs = kMaxNumLogprobs + 1}.Validate(), "num_logprobs");
}

TEST(SamplingParamsTest, LogitBiasIdsAndValues) {
  SamplingParams p;
  p.logit_bias = {{-1, 1.0f}};
  ExpectNames(p.Validate(), "logit_bias");
  p.logit_bias = {{100, 1.0f}};
  EXPECT_TRUE(p.Validate().ok());  // no vocabulary: only the sign is checked
  ExpectNames(p.Validate(100), "logit_bias");
  p.logit_bias = {{3, 100.5f}};
  ExpectNames(p.Validate(100), "logit_bias");
  p.logit_bias = {{3, std::nanf("")}};
  ExpectNames(p.Validate(100), "logit_bias");
  p.logit_bias.clear();
  for (int i = 0; i <= static_cast<int>(kMaxLogitBiasEntries); ++i) p.logit_bias[i] = 1.0f;
  ExpectNames(p.Validate(), "logit_bias");
}

TEST(SamplingParamsTest, StopFields) {
  auto with = [](StopParams stop) {
    SamplingParams p;
    p.stop = std::move(stop);
    return p.Validate(1000);
  };
  ExpectNames(with({.max_tokens = 0}), "max_tokens");
  ExpectNames(with({.max_tokens = kMaxMaxTokens + 1}), "max_tokens");
  ExpectNames(with({.min_tokens = -1}), "min_tokens");
  ExpectNames(with({.max_tokens = 4, .min_tokens = 5}), "min_tokens");
  EXPECT_TRUE(with({.min_tokens = 5}).ok());  // no max_tokens: the context bounds it
  ExpectNames(with({.stop_token_ids = {1000}}), "stop_token_ids");
  ExpectNames(with({.stop_token_ids = {-2}}), "stop_token_ids");
  ExpectNames(with({.stop_token_ids = std::vector<int32_t>(kMaxStopTokenIds + 1, 1)}),
              "stop_token_ids");
  ExpectNames(with({.stop_strings = {""}}), "stop_strings");
  ExpectNames(with({.stop_strings = {std::string(kMaxStopStringBytes + 1, 'a')}}), "stop_strings");
  ExpectNames(with({.stop_strings = std::vector<std::string>(kMaxStopStrings + 1, "x")}),
              "stop_strings");
  ExpectNames(with({.stop_strings = {"ok", "\xe7\xb5"}}), "stop_strings");  // truncated 終
  ExpectNames(with({.stop_strings = {"\x80"}}), "stop_strings");
}

}  // namespace
}  // namespace tandem::engine
