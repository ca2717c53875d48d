// `tandem generate --prompts-file` through the engine: results come in input
// order and each equals the same prompt run alone (determinism across
// batching), greedy and sampled.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_paths.h"

namespace tandem::testing {
namespace {

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = std::string(::testing::TempDir()) + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

std::vector<Json> JsonLines(const std::string& out) {
  std::vector<Json> rows;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    if (end > start) rows.push_back(Json::Parse(out.substr(start, end - start)));
    start = end + 1;
  }
  return rows;
}

TEST(GenerateBatchTest, BatchedOutputsEqualSingleRunsInInputOrder) {
  const std::vector<std::string> prompts = {
      "The capital of France is",
      "def fibonacci(n):",
      "{\"prompt\": \"Once upon a time\", \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": 3}",
      "A list of colors: red,",
      "{\"prompt\": \"The best way to learn\", \"max_tokens\": 5}",
      "Water boils at",
  };
  std::string contents;
  for (const auto& p : prompts) contents += p + "\n";
  const std::string file = WriteTemp("batch_prompts.txt", contents);
  ProcessResult batch = RunProcess({TandemBinary(), "generate", "--json", "--prompts-file", file,
                                    "--concurrency", "4", "--max-tokens", "24"});
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  std::vector<Json> rows = JsonLines(batch.out);
  ASSERT_EQ(rows.size(), prompts.size()) << batch.out;
  EXPECT_NE(batch.err.find("requests in"), std::string::npos) << batch.err;
  EXPECT_NE(batch.err.find("TTFT"), std::string::npos);

  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<std::string> args = {TandemBinary(), "generate", "--json", "--max-tokens", "24"};
    if (prompts[i][0] == '{') {
      Json spec = Json::Parse(prompts[i]);
      args.insert(args.end(), {"--prompt", spec["prompt"].str});
      if (spec.has("temperature")) {
        args.insert(args.end(), {"--temperature", "0.8", "--top-p", "0.9", "--seed", "3"});
      }
      if (spec.has("max_tokens")) args.insert(args.end(), {"--max-tokens", "5"});
    } else {
      args.insert(args.end(), {"--prompt", prompts[i]});
    }
    ProcessResult single = RunProcess(args);
    ASSERT_EQ(single.exit_code, 0) << single.err;
    Json one = Json::Parse(single.out);
    EXPECT_EQ(rows[i]["prompt_token_ids"].As<int>(), one["prompt_token_ids"].As<int>()) << i;
    EXPECT_EQ(rows[i]["token_ids"].As<int>(), one["token_ids"].As<int>()) << prompts[i];
    EXPECT_EQ(rows[i]["text"].str, one["text"].str) << i;
    EXPECT_EQ(rows[i]["finish_reason"].str, one["finish_reason"].str) << i;
  }
  EXPECT_EQ(rows[4]["token_ids"].size(), 5u);
  EXPECT_EQ(rows[4]["finish_reason"].str, "length");
}

TEST(GenerateBatchTest, BadPromptsFileIsAUsageErrorNamingTheLine) {
  const std::string file =
      WriteTemp("bad_prompts.txt", "fine\n{\"prompt\": \"x\", \"top_p\": 7}\n");
  ProcessResult r = RunProcess({TandemBinary(), "generate", "--prompts-file", file});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad_prompts.txt:2:"), std::string::npos) << r.err;
  ProcessResult both =
      RunProcess({TandemBinary(), "generate", "--prompt", "a", "--prompts-file", file});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("exactly one"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace tandem::testing
