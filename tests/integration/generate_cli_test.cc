// Drives the real `tandem` binary as a user would: exit codes, one-line
// errors, --json output, and greedy tokens equal to the HF transformers golden.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_paths.h"

namespace tandem::testing {
namespace {

ProcessResult Tandem(std::vector<std::string> args) {
  args.insert(args.begin(), TandemBinary());
  return RunProcess(args);
}

int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(GenerateCliTest, UsageErrorsExitTwoWithOneLine) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"generate"},  // --prompt missing
      {"generate", "--prompt", "hi", "--bogus"},
      {"generate", "--prompt", "hi", "--max-tokens", "zero"},
      {"generate", "--prompt", "hi", "--max-tokens", "0"},
      {"generate", "--prompt", "hi", "--temperature", "-0.5"},
      {"generate", "--prompt", "hi", "--top-p", "1.5"},
      {"generate", "--prompt", "hi", "--model", "/nonexistent/model.gguf"},
      {"generate", "--prompt", "hi", "--model", TestDataPath("tokenizer_smollm2.jsonl")},
      {"generate", "--prompt", "hi", "--system", "be brief"},  // --system without --chat
  };
  for (const auto& args : cases) {
    ProcessResult r = Tandem(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_TRUE(r.out.empty() || args.empty()) << joined;
    if (args.size() > 1) {
      EXPECT_EQ(CountLines(r.err), 1) << joined << "\n" << r.err;
    }
  }
}

// --device: an unknown name and a CUDA device this machine lacks are one
// error line and exit 2 from every command that runs an engine, before any
// model is loaded. (On a GPU machine the CUDA case runs instead: skipped.)
TEST(GenerateCliTest, DeviceFlagErrorsExitTwoWithOneLine) {
  ProcessResult bad = Tandem({"generate", "--prompt", "hi", "--device", "tpu"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "tandem generate: --device: unknown device 'tpu' (cpu or cuda)\n");
  ProcessResult probe =
      Tandem({"generate", "--prompt", "hi", "--max-tokens", "1", "--device", "cuda"});
  if (probe.exit_code == 0) GTEST_SKIP() << "a CUDA device is visible here";
  const std::vector<std::vector<std::string>> cases = {
      {"generate", "--prompt", "hi"}, {"serve"}, {"prefill"}, {"decode"}, {"router", "--colocated"},
  };
  for (std::vector<std::string> args : cases) {
    const std::string cmd = args[0];
    args.push_back("--device");
    args.push_back("cuda");
    // The missing device is the error even with a bad --kv-cache-memory too.
    for (const char* kv : {"0.9", "1.5"}) {
      std::vector<std::string> with_kv = args;
      with_kv.push_back("--kv-cache-memory");
      with_kv.push_back(kv);
      ProcessResult r = Tandem(with_kv);
      EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
      EXPECT_EQ(CountLines(r.err), 1) << cmd << ": " << r.err;
      EXPECT_EQ(r.err.rfind("tandem " + cmd + ": --device cuda: ", 0), 0u) << r.err;
      EXPECT_TRUE(r.out.empty()) << cmd;
    }
  }
}

// --kv-cache-memory: junk, a zero size and a fraction outside (0, 1] are one
// error line naming the flag and exit 2 from every command that builds an
// engine (serve checks before it starts any worker).
TEST(GenerateCliTest, KvCacheMemoryErrorsExitTwoWithOneLine) {
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--prompt", "hi"}, {"serve"}, {"prefill"}, {"decode"}, {"router", "--colocated"},
  };
  const std::vector<std::pair<std::string, std::string>> values = {
      {"1.5", "memory fraction \"1.5\" must be in (0, 1]"},
      {"0", "memory fraction \"0\" must be in (0, 1]"},
      {"0.0", "memory fraction \"0.0\" must be in (0, 1]"},
      {"0GiB", "memory size \"0GiB\" is zero"},
      {"lots", "bad memory size \"lots\": want e.g. 2GiB, 512MiB, 1048576 or 0.5"},
  };
  for (const std::vector<std::string>& command : commands) {
    for (const auto& [value, message] : values) {
      std::vector<std::string> args = command;
      args.push_back("--kv-cache-memory");
      args.push_back(value);
      ProcessResult r = Tandem(args);
      EXPECT_EQ(r.exit_code, 2) << command[0] << " " << value << ": " << r.err;
      EXPECT_EQ(r.err, "tandem " + command[0] + ": --kv-cache-memory: " + message + "\n");
      EXPECT_TRUE(r.out.empty()) << command[0] << " " << value;
    }
  }
}

// A fraction is resolved when the engine is built, against the memory free
// where the KV cache lives (the host here): the start-up line names it, and
// the blocks are that share of it.
TEST(GenerateCliTest, KvCacheMemoryFractionIsOfFreeMemory) {
  ProcessResult r =
      Tandem({"generate", "--prompt", "hi", "--max-tokens", "1", "--kv-cache-memory", "0.01"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find(", budget 0.01 of ");
  ASSERT_NE(at, std::string::npos) << r.err;
  double free_gib = 0;
  ASSERT_EQ(std::sscanf(r.err.c_str() + at, ", budget 0.01 of %lf GiB free on cpu", &free_gib), 1)
      << r.err;
  EXPECT_GT(free_gib, 0.0);
  // "<blocks> blocks x 16 tokens" at 23040 B/token (f16): 0.01 of the free
  // bytes, rounded down to whole blocks.
  const size_t line = r.err.rfind("KV cache: f16, 23040 B/token, ", at);
  ASSERT_NE(line, std::string::npos) << r.err;
  long long blocks = 0;
  ASSERT_EQ(std::sscanf(r.err.c_str() + line, "KV cache: f16, 23040 B/token, %lld blocks", &blocks),
            1);
  const double want = 0.01 * free_gib * (1 << 30) / (23040.0 * 16);
  EXPECT_NEAR(static_cast<double>(blocks), want, want * 0.01 + 1) << r.err;
}

TEST(GenerateCliTest, PromptPlusMaxTokensOverContextIsAUsageError) {
  // 1 prompt token + 8192 > the model's 8192-token context. The model loads
  // (its log lines come first), then exactly one error line ends stderr.
  ProcessResult r = Tandem({"generate", "--prompt", "hi", "--max-tokens", "8192"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("tandem generate: prompt (1 tokens) + --max-tokens 8192 exceeds the "
                       "model's context length 8192\n"),
            std::string::npos)
      << r.err;
}

// Speculative decoding from the command line: with n-gram drafts the greedy
// tokens of a batch of input-grounded prompts are the tokens without, drafts
// are accepted (the [spec] stats line), and bad flags are usage errors.
TEST(GenerateCliTest, SpeculativeNgramGivesTheSameTokens) {
  const std::string passage =
      "The river flows north through the valley, past the old mill and the stone bridge, "
      "until it reaches the lake where the fishermen keep their boats.";
  const std::string file = ::testing::TempDir() + "/spec_prompts.txt";
  {
    std::ofstream out(file);
    out << "Repeat this sentence exactly: " << passage << "\n";
    out << "Copy the text: " << passage << " " << passage << "\n";
    out << "def add(a, b):\n";  // one line per prompt; the rest of the file is prompts
    out << "List the colors: red, green, blue, red, green, blue, red, green,\n";
  }
  auto run = [&](const std::string& method) {
    return Tandem({"generate", "--prompts-file", file, "--max-tokens", "48", "--json",
                   "--ignore-eos", "--spec-method", method, "--spec-tokens", "5"});
  };
  ProcessResult off = run("off");
  ProcessResult ngram = run("ngram");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  ASSERT_EQ(ngram.exit_code, 0) << ngram.err;
  auto tokens = [](const std::string& out) {
    std::vector<std::vector<int32_t>> all;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) all.push_back(Json::Parse(line)["token_ids"].ints());
    }
    return all;
  };
  const std::vector<std::vector<int32_t>> a = tokens(off.out), b = tokens(ngram.out);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(off.err.find("[spec]"), std::string::npos);
  const size_t at = ngram.err.find("[spec] ");
  ASSERT_NE(at, std::string::npos) << ngram.err;
  EXPECT_EQ(ngram.err.find(" 0 accepted", at), std::string::npos) << ngram.err;

  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--spec-method", "draft"},
        std::vector<std::string>{"--spec-tokens", "0"},
        std::vector<std::string>{"--spec-ngram-min", "5", "--spec-ngram-max", "2"}}) {
    std::vector<std::string> args = {"generate", "--prompt", "hi"};
    args.insert(args.end(), bad.begin(), bad.end());
    ProcessResult r = Tandem(args);
    EXPECT_EQ(r.exit_code, 2) << bad[0] << ": " << r.err;
    EXPECT_EQ(CountLines(r.err), 1) << r.err;
  }
}

// --spec-method draft with the bundled model as its own draft on fast-int8
// kernels: the greedy tokens of the golden prompts equal the references,
// alone and as a batch (--prompts-file), drafts are accepted, and every bad
// draft setup is one error line with exit 2 (generate, decode, serve).
TEST(GenerateCliTest, SpeculativeDraftModelGivesTheGoldenTokens) {
  Json golden = Json::Parse(ReadFileOrEmpty(TestDataPath("logits_smollm2.json")));
  const std::string file = ::testing::TempDir() + "/spec_draft_prompts.jsonl";
  std::vector<std::vector<int>> expected;
  {
    std::ofstream out(file);
    for (const Json& c : golden["cases"].array) {
      if (c["text"].str.find('\n') != std::string::npos) continue;  // one prompt per line
      out << c["text"].str << "\n";
      expected.push_back(c["greedy"].As<int>());
      std::vector<int> first32(
          expected.back().begin(),
          expected.back().begin() + std::min<size_t>(32, expected.back().size()));
      expected.back() = first32;
    }
  }
  ASSERT_GE(expected.size(), 2u);
  const std::vector<std::string> draft = {"--spec-method",        "draft",
                                          "--spec-draft-model",   DefaultModelPath(),
                                          "--spec-draft-kernels", "fast-int8"};
  std::vector<std::string> args = {"generate", "--prompts-file", file,           "--max-tokens",
                                   "32",       "--json",         "--ignore-eos", "--concurrency",
                                   "4"};
  args.insert(args.end(), draft.begin(), draft.end());
  ProcessResult batch = Tandem(args);
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  std::vector<std::vector<int>> got;
  std::istringstream lines(batch.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) got.push_back(Json::Parse(line)["token_ids"].As<int>());
  }
  EXPECT_EQ(got, expected);
  const size_t at = batch.err.find("[spec] ");
  ASSERT_NE(at, std::string::npos) << batch.err;
  EXPECT_EQ(batch.err.find(" 0 accepted", at), std::string::npos) << batch.err;
  EXPECT_NE(batch.err.find("[engine] draft model"), std::string::npos) << batch.err;

  const std::string other_vocab = TestDataPath("tiny_spm.gguf");
  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {{"--spec-method", "draft"}, "--spec-draft-model"},
      {{"--spec-method", "draft", "--spec-draft-model", "/nonexistent/draft.gguf"},
       "/nonexistent/draft.gguf"},
      {{"--spec-method", "ngram", "--spec-draft-model", DefaultModelPath()}, "--spec-method draft"},
      {{"--spec-method", "draft", "--spec-draft-model", DefaultModelPath(), "--spec-draft-kernels",
        "turbo"},
       "--spec-draft-kernels"},
      {{"--spec-method", "draft", "--spec-draft-model", other_vocab}, "vocabulary"},
  };
  for (const std::string cmd : {"generate", "decode", "serve"}) {
    for (const Bad& b : bad) {
      std::vector<std::string> a = {cmd};
      if (cmd == "generate") a.insert(a.end(), {"--prompt", "hi"});
      a.insert(a.end(), b.args.begin(), b.args.end());
      ProcessResult r = Tandem(a);
      EXPECT_EQ(r.exit_code, 2) << cmd << " " << b.says << ": " << r.err;
      EXPECT_EQ(CountLines(r.err), 1) << cmd << ": " << r.err;
      EXPECT_NE(r.err.find(b.says), std::string::npos) << cmd << ": " << r.err;
    }
  }
}

TEST(GenerateCliTest, NotAGgufFileNamesTheProblem) {
  ProcessResult r =
      Tandem({"generate", "--prompt", "hi", "--model", TestDataPath("tokenizer_smollm2.jsonl")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("magic"), std::string::npos) << r.err;
}

TEST(GenerateCliTest, TandemModelEnvOverridesDefault) {
  ProcessResult r = RunProcess({TandemBinary(), "generate", "--prompt", "hi"},
                               {"TANDEM_MODEL=/nonexistent/env-model.gguf"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("$TANDEM_MODEL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/env-model.gguf"), std::string::npos) << r.err;
  // --model wins over the environment.
  ProcessResult ok = RunProcess({TandemBinary(), "generate", "--prompt", "hi", "--max-tokens", "1",
                                 "--model", DefaultModelPath()},
                                {"TANDEM_MODEL=/nonexistent/env-model.gguf"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// With --ignore-eos the CLI runs all 64 tokens; they equal the reference's
// 64-token greedy continuation, which also runs past <|im_end|>.
TEST(GenerateCliTest, IgnoreEosMatchesFull64TokenGolden) {
  Json golden = Json::Parse(ReadFileOrEmpty(TestDataPath("logits_smollm2.json")));
  for (const Json& c : golden["cases"].array) {
    if (c["name"].str != "capital" && c["name"].str != "code") continue;
    ProcessResult r = Tandem(
        {"generate", "--json", "--ignore-eos", "--prompt", c["text"].str, "--max-tokens", "64"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Json out = Json::Parse(r.out);
    EXPECT_EQ(out["prompt_token_ids"].As<int>(), c["token_ids"].As<int>()) << c["name"].str;
    EXPECT_EQ(out["token_ids"].As<int>(), c["greedy"].As<int>()) << c["name"].str;
    EXPECT_EQ(out["finish_reason"].str, "length");
  }
}

TEST(GenerateCliTest, VersionAndHelp) {
  ProcessResult v = Tandem({"version"});
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.out.rfind("tandem ", 0), 0u) << v.out;
  ProcessResult h = Tandem({"generate", "--help"});
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.out.find("--max-tokens"), std::string::npos);
  EXPECT_NE(h.out.find("--chat"), std::string::npos);
}

// Greedy tokens from the CLI equal the reference continuation (HF transformers
// on the same GGUF, tests/data/logits_smollm2.json) up to the first
// end-of-generation token, where the CLI stops.
TEST(GenerateCliTest, GreedyJsonMatchesReferenceGolden) {
  Json golden = Json::Parse(ReadFileOrEmpty(TestDataPath("logits_smollm2.json")));
  const Json* capital = nullptr;
  for (const Json& c : golden["cases"].array) {
    if (c["name"].str == "capital") capital = &c;
  }
  ASSERT_NE(capital, nullptr);
  ProcessResult r = Tandem(
      {"generate", "--json", "--prompt", capital->operator[]("text").str, "--max-tokens", "64"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(CountLines(r.out), 1) << r.out;
  Json out = Json::Parse(r.out);
  EXPECT_EQ(out["prompt_token_ids"].As<int>(), (*capital)["token_ids"].As<int>());
  std::vector<int> ids = out["token_ids"].As<int>();
  std::vector<int> ref = (*capital)["greedy"].As<int>();
  ASSERT_FALSE(ids.empty());
  ASSERT_LE(ids.size(), ref.size());
  EXPECT_EQ(ids, std::vector<int>(ref.begin(), ref.begin() + ids.size()));
  const std::string reason = out["finish_reason"].str;
  EXPECT_TRUE(reason == "eos" || reason == "length") << reason;
  if (reason == "length") {
    EXPECT_EQ(ids.size(), 64u);
  }
  // The golden text starts with the same words; the CLI's text omits the EOG token.
  EXPECT_EQ((*capital)["greedy_text"].str.rfind(out["text"].str, 0), 0u) << out["text"].str;
  EXPECT_GT(out["ttft_ms"].number, 0.0);
  EXPECT_GE(out["tpot_ms"].number, 0.0);
}

TEST(GenerateCliTest, ChatWrapsPromptInTemplateAndStopsAtImEnd) {
  ProcessResult r =
      Tandem({"generate", "--json", "--chat", "--prompt", "What is 2+2?", "--max-tokens", "48"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json out = Json::Parse(r.out);
  std::vector<int> prompt = out["prompt_token_ids"].As<int>();
  ASSERT_GT(prompt.size(), 10u);
  // <|im_start|> (id 1) and <|im_end|> (id 2) are single special tokens, not
  // text: default system turn + user turn + the assistant header.
  EXPECT_EQ(prompt.front(), 1);
  EXPECT_EQ(std::count(prompt.begin(), prompt.end(), 1), 3);
  EXPECT_EQ(std::count(prompt.begin(), prompt.end(), 2), 2);
  EXPECT_EQ(prompt.back(), 198);  // "\n" after "assistant"
  EXPECT_EQ(out["text"].str.find("<|im_end|>"), std::string::npos);
}

TEST(GenerateCliTest, SamplingIsReproducibleBySeed) {
  auto run = [](const std::string& seed) {
    ProcessResult r =
        Tandem({"generate", "--json", "--prompt", "Once upon a time", "--temperature", "0.9",
                "--top-k", "50", "--top-p", "0.95", "--seed", seed, "--max-tokens", "24"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Json::Parse(r.out)["token_ids"].As<int>();
  };
  std::vector<int> a = run("7"), b = run("7"), c = run("8");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(GenerateCliTest, PlainModePrintsTextAndStatsOnStderr) {
  ProcessResult r =
      Tandem({"generate", "--prompt", "The capital of France is", "--max-tokens", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("KV cache bytes/token: f32 46080, f16 23040"), std::string::npos) << r.err;
  // The default KV dtype on the CPU is f16 (docs/kv_cache.md).
  EXPECT_NE(r.err.find("[engine] KV cache: f16, 23040 B/token"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("loading model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

// --kv-cache-dtype: the engine's start-up line names the dtype and its bytes
// per token; an unknown dtype is one line and exit 2, on every command that
// builds an engine.
TEST(GenerateCliTest, KvCacheDtypeFlag) {
  ProcessResult r = Tandem({"generate", "--prompt", "The capital of France is", "--max-tokens", "4",
                            "--kv-cache-dtype", "int8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[engine] KV cache: int8, 11700 B/token"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("KV cache int8 in host memory"), std::string::npos) << r.err;
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--prompt", "x"}, {"serve"}, {"prefill"}, {"decode"}, {"router", "--colocated"}};
  for (std::vector<std::string> args : commands) {
    const std::string cmd = args[0];
    args.push_back("--kv-cache-dtype");
    args.push_back("int4");
    ProcessResult bad = Tandem(args);
    EXPECT_EQ(bad.exit_code, 2) << cmd << ": " << bad.err;
    EXPECT_NE(bad.err.find("--kv-cache-dtype: unknown dtype 'int4' (f32|f16|bf16|int8|fp8)"),
              std::string::npos)
        << cmd << ": " << bad.err;
  }
}

}  // namespace
}  // namespace tandem::testing
