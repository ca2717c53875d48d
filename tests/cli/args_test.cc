#include "services/cli/args.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (auto& s : args) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

struct Flags {
  std::string model = "m.gguf";
  int64_t max_tokens = 16;
  double temperature = 0;
  bool json = false;
};

absl::Status ParseInto(Flags* f, std::vector<std::string> args, ArgParser* p) {
  p->AddString("model", &f->model, "model");
  p->AddInt("max-tokens", &f->max_tokens, 1, 1000, "n");
  p->AddDouble("temperature", &f->temperature, 0, 10, "t");
  p->AddBool("json", &f->json, "json");
  args.insert(args.begin(), {"tandem", "generate"});
  Argv a(args);
  return p->Parse(a.argc(), a.argv(), 2);
}

TEST(ArgParserTest, ParsesBothForms) {
  Flags f;
  ArgParser p("generate", "");
  ASSERT_TRUE(
      ParseInto(&f, {"--model", "x.gguf", "--max-tokens=5", "--temperature", "0.5", "--json"}, &p)
          .ok());
  EXPECT_EQ(f.model, "x.gguf");
  EXPECT_EQ(f.max_tokens, 5);
  EXPECT_DOUBLE_EQ(f.temperature, 0.5);
  EXPECT_TRUE(f.json);
  EXPECT_TRUE(p.WasSet("model"));
}

TEST(ArgParserTest, DefaultsStayWhenAbsent) {
  Flags f;
  ArgParser p("generate", "");
  ASSERT_TRUE(ParseInto(&f, {}, &p).ok());
  EXPECT_EQ(f.model, "m.gguf");
  EXPECT_EQ(f.max_tokens, 16);
  EXPECT_FALSE(p.WasSet("model"));
}

TEST(ArgParserTest, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus", "1"}, "--bogus"},
      {{"--max-tokens", "abc"}, "--max-tokens"},
      {{"--max-tokens", "0"}, "--max-tokens"},
      {{"--max-tokens", "5x"}, "--max-tokens"},
      {{"--max-tokens", "99999999999999999999"}, "--max-tokens"},
      {{"--temperature", "nan"}, "--temperature"},
      {{"--temperature", "-1"}, "--temperature"},
      {{"--model"}, "--model"},
      {{"--json=maybe"}, "--json"},
      {{"stray"}, "stray"},
      {{"--json", "stray"}, "stray"},
      {{"--model", "x", "-x"}, "-x"},
      {{"--max-tokens=3", "--max-tokens=0"}, "--max-tokens"},
  };
  for (const auto& [args, fragment] : cases) {
    Flags f;
    ArgParser p("generate", "");
    absl::Status s = ParseInto(&f, args, &p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << args[0];
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  }
}

TEST(ArgParserTest, LastValueWinsAndBoolsTakeExplicitValues) {
  Flags f;
  ArgParser p("generate", "");
  ASSERT_TRUE(ParseInto(&f,
                        {"--max-tokens", "3", "--max-tokens=7", "--json=true", "--json=false",
                         "--model=a=b.gguf"},
                        &p)
                  .ok());
  EXPECT_EQ(f.max_tokens, 7);
  EXPECT_FALSE(f.json);
  EXPECT_EQ(f.model, "a=b.gguf");
  EXPECT_TRUE(p.WasSet("json"));
  EXPECT_FALSE(p.WasSet("temperature"));
}

TEST(ArgParserTest, UnknownFlagIsNamed) {
  Flags f;
  ArgParser p("generate", "");
  absl::Status s = ParseInto(&f, {"--model", "x", "--bogus=1"}, &p);
  EXPECT_EQ(s.message(), "unknown flag --bogus (see tandem generate --help)");
}

TEST(ArgParserTest, HelpListsFlags) {
  Flags f;
  ArgParser p("generate", "Generates text.");
  ASSERT_TRUE(ParseInto(&f, {"--help"}, &p).ok());
  EXPECT_TRUE(p.help_requested());
  EXPECT_NE(p.Help().find("--max-tokens"), std::string::npos);
  EXPECT_NE(p.Help().find("default: 16"), std::string::npos);
}

}  // namespace
}  // namespace tandem::cli
