// Drives the real `tandem plan` binary: the seed's 13B example as a table and
// as JSON, the SmolLM2 GGUF on a CPU, --measured, and hostile inputs (one
// error line, exit code 2).
#include <fstream>
#include <string>
#include <vector>

#include "common/gguf/gguf.h"
#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_paths.h"

namespace tandem::testing {
namespace {

ProcessResult Plan(std::vector<std::string> args) {
  args.insert(args.begin(), {TandemBinary(), "plan"});
  return RunProcess(args);
}

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/plan_cli_" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(PlanCliTest, DefaultIsTheSeedsThirteenBExample) {
  ProcessResult r = Plan({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("llama-2-13b on A100-80GB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("819,200 B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max concurrent sequences"), std::string::npos);
  EXPECT_NE(r.out.find("assumptions"), std::string::npos);
  EXPECT_NE(r.out.find("prefill:decode"), std::string::npos);
}

TEST(PlanCliTest, JsonPinsSeedNumbers) {
  ProcessResult r = Plan({"--json", "--model", "llama-2-13b", "--device", "A100-80GB", "--context",
                          "2048", "--usd-per-hour", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(CountLines(r.out), 1) << r.out;
  Json j = Json::Parse(r.out);
  EXPECT_EQ(j["kv_bytes_per_token"].number, 819200);
  EXPECT_NEAR(j["kv_budget_bytes"].number / 1e9, 50, 0.5);
  EXPECT_GE(j["decode_tokens_per_second"].number, 1500);
  EXPECT_LE(j["decode_tokens_per_second"].number, 1900);
  EXPECT_GE(j["usd_per_million_output_tokens"].number, 0.3);
  EXPECT_LE(j["usd_per_million_output_tokens"].number, 0.4);

  ProcessResult seven =
      Plan({"--json", "--model", "llama-2-7b", "--context", "4096", "--batch", "16"});
  ASSERT_EQ(seven.exit_code, 0) << seven.err;
  Json s = Json::Parse(seven.out);
  EXPECT_EQ(s["kv_bytes_per_token"].number, 524288);
  EXPECT_EQ(s["kv_bytes_per_sequence"].number, 2147483648.0);
  EXPECT_EQ(s["kv_bytes_for_batch"].number, 34359738368.0);
}

TEST(PlanCliTest, SmolLm2GgufOnCpu) {
  ProcessResult r = Plan({"--json", "--model", DefaultModelPath(), "--device", "cpu",
                          "--device-memory-gb", "16", "--device-bandwidth-gbs", "50",
                          "--device-tflops", "1", "--reserve-gb", "1", "--usd-per-hour", "0.1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json j = Json::Parse(r.out);
  EXPECT_EQ(j["kv_bytes_per_token"].number, 23040);  // f16 KV on the CPU by default
  EXPECT_EQ(j["kv_dtype"].str, "f16");
  EXPECT_EQ(j["num_layers"].number, 30);
  EXPECT_GT(j["max_concurrent_sequences"].number, 0);
  // Per dtype: the engine's bytes per token (tandem generate prints the same
  // in its model summary) and the sequences they leave room for.
  ASSERT_EQ(j["kv_dtypes"].array.size(), 5u);
  const char* names[] = {"f32", "f16", "bf16", "int8", "fp8"};
  const double bpt[] = {46080, 23040, 23040, 11700, 11700};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(j["kv_dtypes"][i]["dtype"].str, names[i]);
    EXPECT_EQ(j["kv_dtypes"][i]["kv_bytes_per_token"].number, bpt[i]);
  }
  EXPECT_EQ(j["kv_dtypes"][1]["max_concurrent_sequences"].number,
            j["max_concurrent_sequences"].number);
  ProcessResult i8 =
      Plan({"--json", "--model", DefaultModelPath(), "--device", "cpu", "--device-memory-gb", "16",
            "--device-bandwidth-gbs", "50", "--device-tflops", "1", "--kv-cache-dtype", "int8"});
  ASSERT_EQ(i8.exit_code, 0) << i8.err;
  EXPECT_EQ(Json::Parse(i8.out)["kv_bytes_per_token"].number, 11700);
  ProcessResult table =
      Plan({"--model", DefaultModelPath(), "--device", "cpu", "--device-memory-gb", "16",
            "--device-bandwidth-gbs", "50", "--device-tflops", "1", "--kv-cache-dtype", "fp8"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("with --kv-cache-dtype int8"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("11,700 B/token"), std::string::npos) << table.out;
  ProcessResult bad = Plan({"--model", DefaultModelPath(), "--kv-cache-dtype", "int4"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--kv-cache-dtype"), std::string::npos) << bad.err;
}

TEST(PlanCliTest, MeasuredReportsFractionOfBandwidthLimit) {
  const std::string bench =
      WriteTemp("bench.json",
                R"({"schema":"tandem.bench.v1","output_tokens_per_second":1100,"mean_tpot_ms":26.4,
          "mean_ttft_ms":140,"concurrency":29,"prompt_tokens_mean":512,
          "output_tokens_mean":256,"model":"llama-2-13b","device":"A100-80GB"})");
  ProcessResult r = Plan({"--json", "--measured", bench});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json j = Json::Parse(r.out);
  const double fraction = j["bandwidth_fraction_of_limit"].number;
  EXPECT_GT(fraction, 0.1);
  EXPECT_LT(fraction, 1.0);
  EXPECT_EQ(j["measured_output_tokens_per_second"].number, 1100);
  EXPECT_TRUE(j["measured_warnings"].array.empty());
  ProcessResult table = Plan({"--measured", bench});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("of the memory-bandwidth limit"), std::string::npos) << table.out;
}

TEST(PlanCliTest, HostileInputsExitTwoWithOneLine) {
  gguf::GgufWriter w;  // GGUF magic, but no llama.block_count
  w.Add("general.architecture", gguf::Value::String("llama"));
  const std::string no_layers = WriteTemp("no_layers.gguf", w.Serialize());
  const std::string truncated = WriteTemp("truncated.gguf", std::string("GGUF\x03\x00\x00", 7));
  const std::string config = WriteTemp(
      "config.json", R"({"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 1,
                        "num_attention_heads": 32, "num_key_value_heads": 0, "vocab_size": 1})");
  const std::string garbage = WriteTemp("garbage.bin", std::string("\x01\x02\x03{{{", 6));
  const std::string bad_bench = WriteTemp("bad_bench.json", R"({"output_tokens_per_second": -1})");
  const std::vector<std::vector<std::string>> cases = {
      {"--model", no_layers},
      {"--model", truncated},
      {"--model", config},
      {"--model", garbage},
      {"--model", "/nonexistent/model.gguf"},
      {"--model", "gpt-5"},
      {"--device", "tpu-v9"},
      {"--device", "cpu"},  // numbers missing
      {"--weight-bits", "0"},
      {"--context", "-5"},
      {"--bandwidth-efficiency", "2"},
      {"--measured", bad_bench},
      {"--measured", "/nonexistent/bench.json"},
      {"--bogus"},
  };
  for (const auto& args : cases) {
    ProcessResult r = Plan(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << joined << "\n" << r.out;
    EXPECT_EQ(CountLines(r.err), 1) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("tandem plan: ", 0), 0u) << joined << "\n" << r.err;
  }
}

TEST(PlanCliTest, HelpListsFlags) {
  ProcessResult r = Plan({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--model", "--device", "--weight-bits", "--kv-bytes", "--measured",
                           "--json", "--request-rate"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace tandem::testing
