// `tandem perplexity` as a user runs it: PPL of the bundled model on the
// held-out text against llama.cpp's (tests/data/perplexity_*.json, made by
// tools/golden_perplexity.py), KLD of a run against its own base, and every
// mismatched or corrupted base refused with a clear error (exit 2).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_paths.h"

namespace tandem::testing {
namespace {

const char kGolden[] = "perplexity_SmolLM2-135M-Instruct.Q4_1_ctx512.json";

ProcessResult Tandem(std::vector<std::string> args) {
  args.insert(args.begin(), TandemBinary());
  return RunProcess(args);
}

std::string TextPath() { return TestDataPath("perplexity_text.txt"); }

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/ppl_" + std::to_string(getpid()) + "_" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LastLine(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

Json RunJson(std::vector<std::string> args) {
  args.insert(args.begin(), "perplexity");
  args.push_back("--json");
  ProcessResult r = Tandem(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return Json::Parse(r.out);
}

// Agreement with llama.cpp. Tolerances (natural log of the PPL ratio):
//  - fast (default, two-level int8 activations): measured 0.0065 from
//    llama.cpp, the same as our exact f32 path (reference, 0.0065): the gap is
//    llama.cpp's own one-level Q8_1 activation rounding, which the default
//    path does not have. Bound 0.01 (1.5x the measured gap), well inside the
//    text's statistical error (PPL +/- 7 %).
//  - fast-int8 (llama.cpp's activation precision): measured 0.0013; bound 0.005.
// Per chunk the running PPL covers fewer tokens (chunk 1: 0.011 measured for
// fast), so the bound there is 0.02.
TEST(PerplexityCliTest, AgreesWithLlamaCppOnTheBundledModel) {
  const Json golden = Json::Parse(ReadFile(TestDataPath(kGolden)));
  const std::string model = DefaultModelPath();
  if (model.size() < golden["model"].str.size() ||
      model.substr(model.size() - golden["model"].str.size()) != golden["model"].str) {
    GTEST_SKIP() << "the golden is for " << golden["model"].str << ", $TANDEM_MODEL is " << model;
  }
  const struct {
    const char* kernels;
    double final_tol;
  } modes[] = {{"fast", 0.01}, {"fast-int8", 0.005}};
  for (const auto& m : modes) {
    SCOPED_TRACE(m.kernels);
    const Json r = RunJson({"--file", TextPath(), "--ctx-size", "512", "--kernels", m.kernels});
    EXPECT_EQ(r["n_tokens"].number, golden["n_tokens"].number);  // same tokenizer, same BOS rule
    EXPECT_EQ(r["n_chunks"].number, golden["n_chunks"].number);
    EXPECT_EQ(r["scored_tokens"].number, golden["scored_tokens"].number);
    const double ppl = r["ppl"].number, ref = golden["ppl"].number;
    EXPECT_TRUE(std::isfinite(ppl));
    EXPECT_GT(ppl, 5.0);  // sane range for a 135M model on English prose
    EXPECT_LT(ppl, 100.0);
    EXPECT_LT(std::fabs(std::log(ppl / ref)), m.final_tol) << ppl << " vs llama.cpp " << ref;
    EXPECT_NEAR(r["ppl_error"].number / ppl, golden["ppl_error"].number / ref, 0.005);
    const std::vector<double> chunks = r["chunk_ppl"].As<double>();
    const std::vector<double> ref_chunks = golden["chunk_ppl"].As<double>();
    ASSERT_EQ(chunks.size(), ref_chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      EXPECT_LT(std::fabs(std::log(chunks[i] / ref_chunks[i])), 0.02) << "chunk " << i + 1;
    }
    EXPECT_DOUBLE_EQ(chunks.back(), ppl);
  }
}

// The human output: running PPL per chunk and llama-perplexity's final line.
TEST(PerplexityCliTest, PrintsRunningPplAndFinalEstimate) {
  ProcessResult r =
      Tandem({"perplexity", "--file", TextPath(), "--ctx-size", "128", "--chunks", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("[1]", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(",[2]"), std::string::npos) << r.out;
  EXPECT_EQ(LastLine(r.out).rfind("Final estimate: PPL = ", 0), 0u) << r.out;
  EXPECT_NE(LastLine(r.out).find(" +/- "), std::string::npos);
  EXPECT_NE(r.err.find("chunk 2/2"), std::string::npos);  // progress on stderr
}

// Chunks run in several forward steps through the paged KV cache give the
// same logits as one step (the engine's chunking determinism).
TEST(PerplexityCliTest, BatchSizeDoesNotChangeTheResult) {
  const Json whole = RunJson({"--file", TextPath(), "--chunks", "1"});
  const Json steps = RunJson({"--file", TextPath(), "--chunks", "1", "--batch-size", "100"});
  EXPECT_EQ(steps["batch_size"].number, 100);
  EXPECT_EQ(whole["ppl"].number, steps["ppl"].number);
}

TEST(PerplexityCliTest, KlDivergenceOfARunAgainstItsOwnBaseIsZero) {
  const std::string base = TempPath("self.kld");
  const Json written = RunJson({"--file", TextPath(), "--ctx-size", "256", "--chunks", "2",
                                "--kl-divergence-base", base, "--kl-top-k", "256"});
  ASSERT_GT(ReadFile(base).size(), 0u);
  // n_ctx and the chunk count come from the base.
  const Json cmp = RunJson({"--file", TextPath(), "--kl-divergence", "--kl-divergence-base", base});
  ASSERT_TRUE(cmp.has("kl_divergence")) << "no kl_divergence object";
  const Json& k = cmp["kl_divergence"];
  EXPECT_EQ(cmp["n_chunks"].number, 2);
  EXPECT_EQ(cmp["n_ctx"].number, 256);
  EXPECT_LT(k["kld_mean"]["mean"].number, 1e-6);
  EXPECT_LT(k["kld_max"].number, 1e-5);
  EXPECT_EQ(k["same_top_p"]["mean"].number, 1.0);
  EXPECT_NEAR(k["ppl"].number, k["ppl_base"].number, 1e-4 * k["ppl"].number);
  EXPECT_NEAR(k["ppl"].number, written["ppl"].number, 1e-9 * written["ppl"].number);
  EXPECT_EQ(k["base_top_k"].number, 256);

  // Another kernel mode differs measurably, within what the modes promise
  // (fast-int8 vs fast: mean KL about 3e-3, engine/llama_model.h).
  const Json other = RunJson({"--file", TextPath(), "--kl-divergence", "--kl-divergence-base", base,
                              "--kernels", "fast-int8"});
  const Json& o = other["kl_divergence"];
  EXPECT_GT(o["kld_mean"]["mean"].number, 1e-5);
  EXPECT_LT(o["kld_mean"]["mean"].number, 2e-2);
  EXPECT_GE(o["kld_p99"].number, o["kld_median"].number);
  EXPECT_GT(o["same_top_p"]["mean"].number, 0.8);
  EXPECT_LT(o["same_top_p"]["mean"].number, 1.0);
  std::remove(base.c_str());
}

TEST(PerplexityCliTest, MismatchedOrCorruptedBaseIsRefused) {
  const std::string base = TempPath("mismatch.kld");
  ASSERT_EQ(Tandem({"perplexity", "--file", TextPath(), "--ctx-size", "128", "--chunks", "2",
                    "--kl-divergence-base", base, "--kl-top-k", "16"})
                .exit_code,
            0);
  const std::string other_text = TempPath("other.txt");
  WriteFile(other_text, "A different text. " + ReadFile(TextPath()));
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--ctx-size", "256"}, "differs from the base's n_ctx 128"},
      {{"--chunks", "3"}, "differs from the base's 2 chunks"},
      {{"--file", other_text}, "different text"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"perplexity", "--kl-divergence", "--kl-divergence-base", base};
    if (c.args[0] != "--file") args.insert(args.end(), {"--file", TextPath()});
    args.insert(args.end(), c.args.begin(), c.args.end());
    ProcessResult r = Tandem(args);
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.err;
    EXPECT_NE(LastLine(r.err).find(c.message), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // Truncated, padded, and garbage bases: one clear line, exit 2, no crash.
  const std::string good = ReadFile(base);
  const struct {
    std::string bytes;
    std::string message;
  } files[] = {
      {good.substr(0, good.size() - 3), "truncated"},
      {good.substr(0, 20), "truncated"},
      {good + "junk", "trailing bytes"},
      {std::string("not a base file at all, just some text") + std::string(80, '.'), "wrong magic"},
      {"", "truncated"},
  };
  const std::string bad = TempPath("bad.kld");
  for (const auto& f : files) {
    WriteFile(bad, f.bytes);
    ProcessResult r = Tandem(
        {"perplexity", "--file", TextPath(), "--kl-divergence", "--kl-divergence-base", bad});
    EXPECT_EQ(r.exit_code, 2) << f.message << "\n" << r.err;
    EXPECT_NE(r.err.find(f.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  }
  // A record corrupted in the middle: found while reading, still exit 2.
  std::string flipped = good;
  const float nan = std::nanf("");
  flipped.replace(good.size() - 8 * 16 - 4, 4, reinterpret_cast<const char*>(&nan), 4);
  WriteFile(bad, flipped);
  ProcessResult r =
      Tandem({"perplexity", "--file", TextPath(), "--kl-divergence", "--kl-divergence-base", bad});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("corrupted KLD base"), std::string::npos) << r.err;
  std::remove(base.c_str());
  std::remove(bad.c_str());
  std::remove(other_text.c_str());
}

TEST(PerplexityCliTest, UsageErrorsExitTwoWithOneLine) {
  const std::string tiny = TempPath("tiny.txt");
  WriteFile(tiny, "Too short to score.");
  const std::vector<std::vector<std::string>> cases = {
      {"perplexity"},
      {"perplexity", "--file", "/nonexistent/text.txt"},
      {"perplexity", "--file", TextPath(), "--kl-divergence"},
      {"perplexity", "--file", TextPath(), "--ctx-size", "4"},
      {"perplexity", "--file", TextPath(), "--kernels", "turbo"},
      {"perplexity", "--file", TextPath(), "--kl-divergence", "--kl-divergence-base", "/x",
       "--kl-top-k", "8"},
      {"perplexity", "--file", TextPath(), "--kl-divergence", "--kl-divergence-base",
       "/nonexistent/base.kld"},
  };
  for (const auto& args : cases) {
    ProcessResult r = Tandem(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << joined << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << joined;
  }
  // After the model loads: too few tokens for two chunks.
  ProcessResult r = Tandem({"perplexity", "--file", tiny});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(LastLine(r.err).find("you need at least 1024 tokens"), std::string::npos) << r.err;
  std::remove(tiny.c_str());
}

}  // namespace
}  // namespace tandem::testing
