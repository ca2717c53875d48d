// Chat formats against text rendered by jinja2 from the real templates
// (tests/data/chat_templates.json, written by tools/golden_tokenizer.py).
#include "common/tokenizer/chat_template.h"

#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/test_paths.h"

namespace tandem::tokenizer {
namespace {

using ::tandem::testing::Json;

constexpr const char* kSmolSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

Json LoadGoldens() {
  const std::string text =
      ::tandem::testing::ReadFileOrEmpty(::tandem::testing::TestDataPath("chat_templates.json"));
  return ::tandem::testing::Json::Parse(text);
}

TEST(ChatTemplateTest, DetectsFormatsOfRealTemplates) {
  const Json g = LoadGoldens();
  EXPECT_EQ(DetectChatFormat(g["templates"]["chatml"].str).value(), ChatFormat::kChatML);
  EXPECT_EQ(DetectChatFormat(g["templates"]["llama3"].str).value(), ChatFormat::kLlama3);
  EXPECT_EQ(DetectChatFormat(g["templates"]["llama2"].str).value(), ChatFormat::kLlama2);
  EXPECT_EQ(DetectChatFormat("").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DetectChatFormat("{{ messages }}").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ExtractsSmolLMDefaultSystemPrompt) {
  const Json g = LoadGoldens();
  EXPECT_EQ(ExtractDefaultSystem(g["templates"]["chatml"].str), kSmolSystem);
  EXPECT_EQ(ExtractDefaultSystem(g["templates"]["llama3"].str), "");
  // Escaped newlines (templates written as JSON-ish literals) work too.
  EXPECT_EQ(ExtractDefaultSystem("{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}"),
            "Be brief.");
  // A system turn built from a variable is not a default prompt.
  EXPECT_EQ(ExtractDefaultSystem("{{ '<|im_start|>system\\n' + message['content'] + "
                                 "'<|im_end|>' }}"),
            "");
}

TEST(ChatTemplateTest, MatchesJinjaRenderingOfEveryCase) {
  const Json g = LoadGoldens();
  ASSERT_GE(g["cases"].array.size(), 24u);
  for (const Json& c : g["cases"].array) {
    const std::string& name = c["format"].str;
    const std::string& tmpl = g["templates"][name].str;
    auto format = DetectChatFormat(tmpl);
    ASSERT_TRUE(format.ok()) << name;
    std::vector<ChatMessage> messages;
    for (const Json& m : c["messages"].array) messages.push_back({m["role"].str, m["content"].str});
    const std::string got = RenderChat(*format, messages, c["add_generation_prompt"].boolean,
                                       ExtractDefaultSystem(tmpl));
    EXPECT_EQ(got, c["text"].str) << name << " with " << messages.size() << " messages";
  }
}

TEST(ChatTemplateTest, ChatMLShape) {
  const std::string s = RenderChat(ChatFormat::kChatML, {{"user", "hi"}}, true, kSmolSystem);
  EXPECT_EQ(s, std::string("<|im_start|>system\n") + kSmolSystem +
                   "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, {{"system", "S"}, {"user", "hi"}}, false, kSmolSystem),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

}  // namespace
}  // namespace tandem::tokenizer
