// `tandem quantize` as a user runs it: bad input is one line on stderr and
// exit 2 with no output file; a quantized bundled model loads and
// generates; --report prints one line per linear input.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/gguf/types.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_paths.h"
#include "tests/util/tiny_llama.h"

namespace tandem::testing {
namespace {

ProcessResult Tandem(std::vector<std::string> args) {
  args.insert(args.begin(), TandemBinary());
  return RunProcess(args);
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/quant_" + std::to_string(getpid()) + "_" + name;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(QuantizeCliTest, BadInputIsOneLineAndExit2) {
  const std::string out = TempPath("bad.gguf");
  const std::string not_gguf = TempPath("not.gguf");
  WriteFile(not_gguf, "this is not a GGUF file at all\n");
  const std::string big = TempPath("big.txt");
  WriteFile(big, std::string((8 << 20) + 1, 'a'));
  const std::string calib = TestDataPath("calibration_text.txt");
  const std::vector<std::vector<std::string>> cases = {
      {"quantize", "--type", "q4_0", "--out", out, "--model", "/nonexistent/model.gguf"},
      {"quantize", "--type", "q4_0", "--out", out, "--model", not_gguf},
      {"quantize", "--type", "q3_x", "--out", out},
      {"quantize", "--type", "q4_0", "--out", out, "--method", "fp4"},
      // SmoothQuant: int8 weights only, alpha in [0, 1], --alpha only with it.
      {"quantize", "--type", "q4_0", "--out", out, "--method", "smoothquant", "--calibration",
       calib},
      {"quantize", "--out", out, "--method", "smoothquant", "--alpha", "1.5", "--calibration",
       calib},
      {"quantize", "--out", out, "--method", "smoothquant", "--alpha", "-0.1", "--calibration",
       calib},
      {"quantize", "--type", "q8_0", "--out", out, "--alpha", "0.5"},
      {"quantize", "--out", out, "--method", "smoothquant"},            // no --calibration
      {"quantize", "--type", "q4_0"},                                   // no --out
      {"quantize", "--out", out},                                       // no --type
      {"quantize", "--type", "q4_0", "--out", out, "--method", "awq"},  // no --calibration
      {"quantize", "--type", "q4_0", "--out", out, "--method", "gptq", "--calibration", big},
      {"quantize", "--type", "q4_0", "--out", out, "--method", "gptq", "--calibration",
       "/nonexistent.txt"},
      {"quantize", "--report"},  // no --calibration
      {"quantize", "--type", "q4_0", "--out", out, "--calibration-tokens", "0"},
      // act-order is a GPTQ option.
      {"quantize", "--type", "q4_0", "--out", out, "--gptq-act-order"},
      {"quantize", "--type", "q4_0", "--out", out, "--method", "awq", "--calibration", calib,
       "--gptq-act-order"},
      {"quantize", "--report", "--calibration", calib, "--gptq-act-order"},
      // An --out that cannot be written is refused before quantizing (one
      // line: no progress bar first).
      {"quantize", "--type", "q4_0", "--out", "/nonexistent-dir/x.gguf"},
      {"quantize", "--type", "q4_0", "--out", ::testing::TempDir()},
  };
  for (const auto& args : cases) {
    ProcessResult r = Tandem(args);
    SCOPED_TRACE(args[args.size() - 1]);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("tandem quantize: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(Exists(out));
  }
  unlink(not_gguf.c_str());
  unlink(big.c_str());
}

// A tokenizer-less tiny f32 model quantizes with rtn; a GGUF that is not a
// model (a tokenizer-only file) is refused with exit 2.
TEST(QuantizeCliTest, TinyModelAndNonModelGguf) {
  TinyLlamaShape shape;
  shape.matrix_type = gguf::TensorType::kF32;
  shape.embd_type = gguf::TensorType::kF32;
  const std::string in = TempPath("tiny_f32.gguf");
  WriteFile(in, MakeRandomLlamaGguf(shape, 1));
  const std::string out = TempPath("tiny_q4_1.gguf");
  ProcessResult r = Tandem({"quantize", "--model", in, "--type", "q4_1", "--out", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Q4_1 x14"), std::string::npos) << r.out;  // 7 matrices x 2 layers
  r = Tandem({"quantize", "--model", TestDataPath("tiny_spm.gguf"), "--type", "q4_0", "--out",
              out + ".2"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(Exists(out + ".2"));
  unlink(in.c_str());
  unlink(out.c_str());
}

TEST(QuantizeCliTest, QuantizedModelGenerates) {
  for (const char* type : {"q8_0", "q4_k_m"}) {
    const std::string out = TempPath(std::string(type) + ".gguf");
    ProcessResult q = Tandem({"quantize", "--type", type, "--out", out, "--threads", "2"});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_NE(q.out.find("wrote " + out + " (" + type + ", rtn)"), std::string::npos) << q.out;
    ProcessResult g = Tandem({"generate", "--model", out, "--prompt", "The capital of France is",
                              "--max-tokens", "8", "--threads", "2"});
    EXPECT_EQ(g.exit_code, 0) << g.err;
    EXPECT_FALSE(g.out.empty());
    unlink(out.c_str());
  }
}

TEST(QuantizeCliTest, GptqAndAwqOnTheBundledModelGenerate) {
  const std::string calib = TestDataPath("calibration_text.txt");
  for (const auto& [method, act_order] :
       std::vector<std::pair<std::string, bool>>{{"gptq", false}, {"gptq", true}, {"awq", false}}) {
    const std::string out = TempPath(method + (act_order ? "-act" : "") + ".gguf");
    std::vector<std::string> args = {"quantize", "--type",        "q4_0", "--method",
                                     method,     "--calibration", calib,  "--calibration-tokens",
                                     "64",       "--awq-grid",    "4",    "--awq-clip-grid",
                                     "2",        "--out",         out,    "--threads",
                                     "2"};
    if (act_order) args.push_back("--gptq-act-order");
    ProcessResult q = Tandem(args);
    ASSERT_EQ(q.exit_code, 0) << q.err;
    // Progress: the last update of the method's stage is "<method> 30 / 30".
    const size_t stage = q.err.rfind(std::string("\r") + method);
    ASSERT_NE(stage, std::string::npos) << q.err;
    EXPECT_NE(q.err.find("30 / 30", stage), std::string::npos) << q.err;
    if (method == "gptq") {  // the file says how it was made
      auto file = gguf::GgufFile::Open(out);
      ASSERT_TRUE(file.ok()) << file.status();
      const gguf::Value* v = (*file)->Find("tandem.quantize.gptq_act_order");
      ASSERT_NE(v, nullptr);
      ASSERT_TRUE(v->AsBool().ok());
      EXPECT_EQ(*v->AsBool(), act_order);
    }
    ProcessResult g = Tandem({"generate", "--model", out, "--prompt", "The capital of France is",
                              "--max-tokens", "8", "--threads", "2"});
    EXPECT_EQ(g.exit_code, 0) << g.err;
    unlink(out.c_str());
  }
}

// A SmoothQuant file (--type defaults to q8_0) runs with per-token int8
// activations unless --kernels says otherwise, and generates.
TEST(QuantizeCliTest, SmoothQuantFileRunsWithPerTokenKernels) {
  const std::string calib = TestDataPath("calibration_text.txt");
  const std::string out = TempPath("smoothquant.gguf");
  ProcessResult q =
      Tandem({"quantize", "--method", "smoothquant", "--alpha", "0.6", "--calibration", calib,
              "--calibration-tokens", "64", "--out", out, "--threads", "2"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_NE(q.out.find("wrote " + out + " (q8_0, smoothquant)"), std::string::npos) << q.out;
  const std::vector<std::string> ppl = {"perplexity", "--model",    out,  "--file",
                                        calib,        "--ctx-size", "64", "--chunks",
                                        "1",          "--threads",  "2",  "--json"};
  ProcessResult p = Tandem(ppl);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("\"kernels\":\"fast-int8-token\""), std::string::npos) << p.out;
  std::vector<std::string> explicit_fast = ppl;
  explicit_fast.insert(explicit_fast.end(), {"--kernels", "fast"});
  p = Tandem(explicit_fast);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("\"kernels\":\"fast\""), std::string::npos) << p.out;
  ProcessResult g = Tandem({"generate", "--model", out, "--prompt", "The capital of France is",
                            "--max-tokens", "8", "--threads", "2"});
  EXPECT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.err.find("fast-int8-token"), std::string::npos) << g.err;
  unlink(out.c_str());
}

TEST(QuantizeCliTest, ReportListsEveryLinearInput) {
  ProcessResult r =
      Tandem({"quantize", "--report", "--calibration", TestDataPath("calibration_text.txt"),
              "--calibration-tokens", "64", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Header, 30 layers x 4 inputs, summary.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1 + 120 + 1) << r.out;
  EXPECT_NE(r.out.find("linear inputs have channels above 6.0"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem::testing
