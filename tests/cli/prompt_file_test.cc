#include "services/cli/prompt_file.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

engine::SamplingParams Defaults() {
  engine::SamplingParams p;
  p.stop.max_tokens = 32;
  p.seed = 5;
  return p;
}

TEST(PromptFileTest, PlainLinesAndJsonlWithOverrides) {
  const std::string contents =
      "first prompt\n"
      "\n"
      "   \n"
      "{\"prompt\": \"second\", \"max_tokens\": 7, \"temperature\": 0.5, \"seed\": 9, "
      "\"stop\": [\"\\n\\n\"], \"ignore_eos\": true}\r\n"
      "{\"prompt\": \"third \\u00e9\", \"top_k\": 3, \"top_p\": 0.9, \"min_p\": 0.1}\n"
      "not json {\"prompt\": 1}\n";
  auto specs = ParsePrompts(contents, "p.txt", Defaults());
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 4u);
  EXPECT_EQ((*specs)[0].text, "first prompt");
  EXPECT_EQ((*specs)[0].line, 1);
  EXPECT_EQ((*specs)[0].params.stop.max_tokens, 32);
  EXPECT_EQ((*specs)[0].params.seed, 5u);
  const PromptSpec& s = (*specs)[1];
  EXPECT_EQ(s.text, "second");
  EXPECT_EQ(s.line, 4);
  EXPECT_EQ(s.params.stop.max_tokens, 7);
  EXPECT_DOUBLE_EQ(s.params.temperature, 0.5);
  EXPECT_EQ(s.params.seed, 9u);
  EXPECT_EQ(s.params.stop.stop_strings, std::vector<std::string>{"\n\n"});
  EXPECT_TRUE(s.params.stop.ignore_eos);
  EXPECT_EQ((*specs)[2].text, "third \xC3\xA9");
  EXPECT_EQ((*specs)[2].params.top_k, 3);
  EXPECT_EQ((*specs)[2].params.seed, 5u);  // default kept
  EXPECT_EQ((*specs)[3].text, "not json {\"prompt\": 1}");
}

TEST(PromptFileTest, MalformedLinesNameFileAndLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ok\n{\"prompt\": \"x\",}\n", "p.txt:2: json:"},
      {"{\"text\": \"x\"}\n", "p.txt:1: unknown field \"text\""},
      {"{\"max_tokens\": 3}\n", "\"prompt\" (a string) is required"},
      {"{\"prompt\": 5}\n", "\"prompt\" (a string) is required"},
      {"{\"prompt\": \"x\", \"max_tokens\": 2.5}\n", "\"max_tokens\" must be an integer"},
      {"{\"prompt\": \"x\", \"max_tokens\": 0}\n", "max_tokens"},
      {"{\"prompt\": \"x\", \"temperature\": -1}\n", "temperature"},
      {"{\"prompt\": \"x\", \"temperature\": \"hot\"}\n", "\"temperature\" must be a number"},
      {"{\"prompt\": \"x\", \"top_p\": 2}\n", "top_p"},
      {"{\"prompt\": \"x\", \"seed\": -1}\n", "seed"},
      {"{\"prompt\": \"x\", \"stop\": \"a\"}\n", "\"stop\" must be an array"},
      {"{\"prompt\": \"x\", \"stop\": [1]}\n", "\"stop\" must be an array"},
      {"{\"prompt\": \"x\", \"ignore_eos\": 1}\n", "\"ignore_eos\" must be a bool"},
      {"{\"prompt\": \"\\ud800\"}\n", "surrogate"},
      {"\n\n", "no prompts"},
  };
  for (const auto& [contents, fragment] : cases) {
    auto specs = ParsePrompts(contents, "p.txt", Defaults());
    ASSERT_FALSE(specs.ok()) << contents;
    EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(specs.status().message().find(fragment), std::string::npos)
        << contents << " -> " << specs.status();
  }
}

TEST(PromptFileTest, MissingOrSpecialFileIsAnError) {
  EXPECT_EQ(ReadPromptsFile("/nonexistent/prompts.txt", Defaults()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadPromptsFile("/dev/zero", Defaults()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadPromptsFile("/tmp", Defaults()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::cli
