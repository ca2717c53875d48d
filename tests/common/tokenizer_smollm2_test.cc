// SmolLM2 (byte-level BPE, pre-tokenizer "smollm") against goldens from
// llama.cpp and HF transformers (tools/golden_tokenizer.py).
#include <chrono>
#include <filesystem>
#include <random>

#include "common/gguf/gguf.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "common/utf8.h"
#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/test_paths.h"

namespace tandem::tokenizer {
namespace {

using ::tandem::testing::Json;
using ::tandem::utf8::IsValidUtf8;

// `s` without the bytes this byte-level vocab has no token for.
std::string EncodableBytes(const Tokenizer& tok, std::string_view s) {
  std::string out;
  for (char c : s) {
    if (tok.FindToken(BytesToByteLevel(std::string_view(&c, 1)))) out.push_back(c);
  }
  return out;
}

class SmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = ::tandem::testing::DefaultModelPath();
    if (!std::filesystem::exists(path)) return;
    auto file = gguf::GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto vocab = VocabFromGguf(**file);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    auto tok = Tokenizer::Create(*std::move(vocab));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(tok).value().release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << "default model not found (scripts/fetch_model.sh)";
  }
  static const Tokenizer* tok_;
};
const Tokenizer* SmolLM2Test::tok_ = nullptr;

TEST_F(SmolLM2Test, VocabMetadata) {
  const Vocab& v = tok_->vocab();
  EXPECT_EQ(v.kind, VocabKind::kBpe);
  EXPECT_EQ(v.pre, "smollm");
  EXPECT_EQ(v.size(), 49152);
  EXPECT_EQ(v.merges.size(), 48900u);
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_EQ(v.pad_id, 2);
  EXPECT_FALSE(v.add_bos);
  EXPECT_FALSE(v.add_space_prefix);
  EXPECT_NE(v.chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(tok_->IsEog(2));  // <|im_end|>
  EXPECT_TRUE(tok_->IsEog(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->IsEog(1));
  EXPECT_EQ(tok_->FindToken("<|im_start|>"), 1);
  EXPECT_EQ(tok_->FindToken("no such token"), std::nullopt);
}

TEST_F(SmolLM2Test, MatchesReferenceIdsOnEveryGoldenString) {
  const auto rows =
      ::tandem::testing::ReadJsonl(::tandem::testing::TestDataPath("tokenizer_smollm2.jsonl"));
  ASSERT_GE(rows.size(), 300u);
  int num_mismatch = 0, num_disagreements = 0, num_lossy = 0;
  for (const Json& row : rows) {
    const std::string& text = row["text"].str;
    const std::vector<int32_t> want = row["ids"].ints();
    const std::vector<int32_t> got = tok_->Encode(text, /*add_special=*/false,
                                                  /*parse_special=*/true);
    if (got != want) {
      ++num_mismatch;
      ADD_FAILURE() << "ids differ for " << ::testing::PrintToString(text);
    }
    // decode(encode(s)) == s, except for the few bytes the vocab lacks.
    EXPECT_EQ(tok_->Decode(got), EncodableBytes(*tok_, text)) << ::testing::PrintToString(text);
    if (EncodableBytes(*tok_, text) != text) ++num_lossy;
    if (row.has("chosen")) {
      ++num_disagreements;
      // The references disagree only where HF's GGUF rebuild lost SmolLM2's
      // digit splitting; llama.cpp follows the original tokenizer there.
      EXPECT_EQ(row["chosen"].str, "llama_cpp");
      EXPECT_NE(row["hf_gguf"].ints(), got);
    }
  }
  EXPECT_EQ(num_mismatch, 0);
  EXPECT_GT(num_disagreements, 0) << "goldens should record the digit-split disagreements";
  EXPECT_LE(num_lossy, 8) << "only the strings made to hit missing byte tokens are lossy";
}

TEST_F(SmolLM2Test, SpecialTokens) {
  EXPECT_EQ(tok_->Encode("<|im_start|>user\nhi<|im_end|>", false, true),
            (std::vector<int32_t>{1, 4093, 198, 6004, 2}));
  // Without parse_special the text is ordinary characters.
  const auto plain = tok_->Encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_NE(id, 1);
  EXPECT_EQ(tok_->Decode(plain), "<|im_start|>");
  // A partial marker stays text.
  for (int32_t id : tok_->Encode("<|im_sta", false, true)) EXPECT_NE(id, 1);
  // SmolLM2 does not add BOS even when asked for the model's special tokens.
  EXPECT_EQ(tok_->Encode("hi", true, true), tok_->Encode("hi", false, true));
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{1, 6004, 2}, /*skip_special=*/true), "hi");
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{1, 6004, 2}), "<|im_start|>hi<|im_end|>");
}

TEST_F(SmolLM2Test, DigitsAreSplitIndividually) {
  const auto ids = tok_->Encode("12345", false, true);
  ASSERT_EQ(ids.size(), 5u);
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(tok_->TokenToPiece(ids[i]), std::string(1, '1' + i));
}

TEST_F(SmolLM2Test, BytesWithoutTokensAreDropped) {
  EXPECT_FALSE(tok_->FindToken(BytesToByteLevel("\x04")).has_value());
  // The control byte still separates words, as in both references.
  EXPECT_EQ(tok_->Encode("a\x04"
                         "b",
                         false, true),
            (std::vector<int32_t>{81, 82}));
  EXPECT_EQ(tok_->Decode(tok_->Encode("a\xFF"
                                      "b",
                                      false, true)),
            "ab");
}

TEST_F(SmolLM2Test, ArbitraryBytesRoundTrip) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    if (iter % 3 == 0) s = "ok \xE4\xB8 mid\xFF\xFE" + s + "\xF0\x9F\x98";  // truncated sequences
    const auto ids = tok_->Encode(s, false, false);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok_->vocab_size());
    EXPECT_EQ(tok_->Decode(ids), EncodableBytes(*tok_, s));
  }
}

TEST_F(SmolLM2Test, StreamingDetokenizerNeverSplitsCodePoints) {
  const auto rows =
      ::tandem::testing::ReadJsonl(::tandem::testing::TestDataPath("tokenizer_smollm2.jsonl"));
  int num_held_back = 0;
  for (const Json& row : rows) {
    const std::vector<int32_t> ids = row["ids"].ints();
    StreamingDetokenizer detok(*tok_);
    std::string all;
    for (int32_t id : ids) {
      const std::string delta = detok.Push(id);
      ASSERT_TRUE(IsValidUtf8(delta)) << ::testing::PrintToString(row["text"].str);
      if (detok.num_pending_bytes() > 0) ++num_held_back;
      all += delta;
    }
    all += detok.Flush();
    ASSERT_TRUE(IsValidUtf8(all));
    const std::string decoded = tok_->Decode(ids);
    if (IsValidUtf8(decoded)) {
      EXPECT_EQ(all, decoded);
    }
  }
  EXPECT_GT(num_held_back, 0) << "goldens should include tokens that end mid-character";
}

TEST_F(SmolLM2Test, StreamingDetokenizerFlushesInvalidBytesAsReplacement) {
  StreamingDetokenizer detok(*tok_);
  // "😀" is F0 9F 98 80; push only the byte tokens of its first three bytes.
  const auto ids = tok_->Encode("\xF0\x9F\x98", false, false);
  std::string out;
  for (int32_t id : ids) out += detok.Push(id);
  EXPECT_EQ(out, "");
  EXPECT_EQ(detok.Flush(), "\xEF\xBF\xBD");
  // A stray byte in the middle is replaced at once.
  std::string s;
  for (int32_t id : tok_->Encode("a\x80"
                                 "b",
                                 false, false))
    s += detok.Push(id);
  EXPECT_EQ(s + detok.Flush(),
            "a\xEF\xBF\xBD"
            "b");
}

TEST_F(SmolLM2Test, EncodesAMegabyteQuickly) {
  std::string text;
  while (text.size() < (1 << 20)) {
    text +=
        "The quick brown fox jumps over the lazy dog 1234567890. 你好，世界！ 😀 def f(x): return "
        "x\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->Encode(text, false, true);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok_->Decode(ids), text);
  EXPECT_LT(secs, 10.0) << "encoding 1 MiB took " << secs << " s";
  std::printf("encode: %.1f MB/s, %zu tokens\n", text.size() / secs / 1e6, ids.size());
}

}  // namespace
}  // namespace tandem::tokenizer
