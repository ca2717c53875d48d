// OpenAI body -> GenerateRequest, field by field (the HTTP front door's
// parsing without a server; tests/integration/openai_http_test.cc runs the
// same bodies through a live router).
#include "services/http/openai_protocol.h"

#include <string>

#include "gtest/gtest.h"
#include "services/router/validate.h"

namespace tandem::http {
namespace {

constexpr char kModel[] = "m";

absl::StatusOr<OpenAiRequest> Completion(const std::string& body) {
  return ParseOpenAiRequest(Endpoint::kCompletions, body, kModel);
}

TEST(OpenAiProtocolTest, SamplingAndStopFieldsMapToTheGrpcRequest) {
  auto r = Completion(R"({"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5,
                          "top_p": 0.9, "top_k": 40, "seed": 11, "stop": ["x", "y"],
                          "ignore_eos": true, "stream": true,
                          "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const tandem::v1::GenerateRequest& g = r->request;
  EXPECT_EQ(g.text(), "hi");
  EXPECT_EQ(g.stop().max_tokens(), 7);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_EQ(g.sampling().seed(), 11u);
  ASSERT_EQ(g.stop().stop_size(), 2);
  EXPECT_EQ(g.stop().stop(1), "y");
  EXPECT_TRUE(g.stop().ignore_eos());
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_FALSE(g.has_speculative());
}

TEST(OpenAiProtocolTest, NumSpeculativeTokensIsThePerRequestSpeculationOption) {
  for (int k : {0, 3, 16}) {
    auto r = Completion(R"({"prompt": "hi", "num_speculative_tokens": )" + std::to_string(k) + "}");
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->request.speculative().has_num_speculative_tokens());
    EXPECT_EQ(r->request.speculative().num_speculative_tokens(), k);
  }
  auto chat =
      ParseOpenAiRequest(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "hi"}],
                          "num_speculative_tokens": 2})",
                         kModel);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->request.speculative().num_speculative_tokens(), 2);
  for (const char* bad : {R"({"prompt": "hi", "num_speculative_tokens": 17})",
                          R"({"prompt": "hi", "num_speculative_tokens": -1})",
                          R"({"prompt": "hi", "num_speculative_tokens": "4"})",
                          R"({"prompt": "hi", "num_speculative_tokens": 1.5})"}) {
    auto r = Completion(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ApiErrorFrom(r.status()).param, "num_speculative_tokens") << r.status();
    EXPECT_EQ(ApiErrorFrom(r.status()).http_status, 400);
  }
}

TEST(OpenAiProtocolTest, IntegerFieldsSayWhetherTheValueIsOutOfRangeOrNotAnInteger) {
  struct Case {
    const char* body;
    const char* message;
  };
  for (const Case& c : {
           Case{R"({"prompt": "hi", "max_tokens": 99999999999999999999})", "must be in ["},
           Case{R"({"prompt": "hi", "max_tokens": -99999999999999999999})", "must be in ["},
           Case{R"({"prompt": "hi", "max_tokens": 1e300})", "must be in ["},
           Case{R"({"prompt": "hi", "max_tokens": 0})", "must be in ["},
           Case{R"({"prompt": "hi", "max_tokens": 3.5})", "must be an integer"},
           Case{R"({"prompt": "hi", "max_tokens": "3"})", "must be an integer"},
           Case{R"({"prompt": "hi", "max_tokens": true})", "must be an integer"},
       }) {
    auto r = Completion(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(ApiErrorFrom(r.status()).param, "max_tokens") << r.status();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
  }
  auto whole = Completion(R"({"prompt": "hi", "max_tokens": 7.0})");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->request.stop().max_tokens(), 7);
}

TEST(OpenAiProtocolTest, WrongModelIsNotFound) {
  auto r = Completion(R"({"model": "other", "prompt": "hi"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ApiErrorFrom(r.status()).http_status, 404);
}

// A body that parses but fails the router's validation (PrepareRequest, what
// Admit runs): the error names the OpenAI parameter, not the gRPC field.
TEST(OpenAiProtocolTest, RouterValidationErrorsNameTheOpenAiParameter) {
  router::ModelLimits limits;
  limits.context_length = 64;
  limits.vocab_size = 100;
  limits.max_tokens_limit = 63;
  struct Case {
    Endpoint endpoint;
    const char* body;
    const char* param;
    const char* message_start;
  };
  for (const Case& c : {
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "presence_penalty": 3})",
                "presence_penalty", "presence_penalty must be in [-2, 2]"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "frequency_penalty": -2.5})",
                "frequency_penalty", "frequency_penalty must be in"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "top_p": 0})", "top_p",
                "top_p must be in"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "logit_bias": {"100": 1}})",
                "logit_bias", "logit_bias: token id 100 is outside the vocabulary"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "max_tokens": 64})", "max_tokens",
                "max_tokens must be in [1, 63]"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "max_tokens": 63})", "max_tokens",
                "max_tokens: prompt (2 tokens) + max_tokens 63 exceeds the context length 64"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "min_tokens": 9, "max_tokens": 4})",
                "min_tokens", "min_tokens must be in [0, max_tokens = 4]"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "stop_token_ids": [100]})",
                "stop_token_ids", "stop_token_ids"},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "stop": [""]})", "stop",
                "stop[0] must be 1.."},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 2], "logprobs": 99})", "logprobs",
                "logprobs must be in [0, "},
           Case{Endpoint::kCompletions, R"({"prompt": [1, 200]})", "prompt",
                "prompt[1]: token id 200 is outside the vocabulary"},
           // The router validates both endpoints' requests alike (a chat
           // body would need a tokenizer here); where the names differ, the
           // chat endpoint's own name comes back.
           Case{Endpoint::kChat, R"({"prompt": [1, 2], "logprobs": 99})", "top_logprobs",
                "top_logprobs must be in [0, "},
           Case{Endpoint::kChat, R"({"prompt": [1, 200]})", "messages",
                "messages[1]: token id 200"},
           Case{Endpoint::kChat, R"({"prompt": [1, 2], "temperature": 101})", "temperature",
                "temperature must be in"},
       }) {
    auto r = Completion(c.body);
    ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
    auto prepared = router::PrepareRequest(r->request, limits, /*tokenizer=*/nullptr);
    ASSERT_FALSE(prepared.ok()) << c.body;
    const absl::Status s = WithOpenAiParam(c.endpoint, prepared.status());
    const ApiError e = ApiErrorFrom(s);
    EXPECT_EQ(e.http_status, 400) << s;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << s;
    EXPECT_EQ(s.message().substr(0, std::string_view(c.message_start).size()), c.message_start)
        << c.body << ": " << s;
  }
  // Statuses that name no field, or are not validation errors, pass unchanged.
  const absl::Status busy = absl::ResourceExhaustedError("stop.max_tokens queue full");
  EXPECT_EQ(WithOpenAiParam(Endpoint::kCompletions, busy), busy);
  const absl::Status other = absl::InvalidArgumentError("stop.stopper is odd");
  EXPECT_EQ(WithOpenAiParam(Endpoint::kCompletions, other), other);
  EXPECT_EQ(ApiErrorFrom(WithOpenAiParam(Endpoint::kCompletions, other)).param, "");
}

}  // namespace
}  // namespace tandem::http
