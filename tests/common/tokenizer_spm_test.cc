// SentencePiece BPE with byte fallback, on tests/data/tiny_spm.gguf (trained
// and converted by tools/golden_tokenizer.py), against sentencepiece and
// llama.cpp.
#include "common/gguf/gguf.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "tests/util/json_reader.h"
#include "tests/util/test_paths.h"

namespace tandem::tokenizer {
namespace {

using ::tandem::testing::Json;

std::unique_ptr<Tokenizer> LoadTinySpm() {
  auto file = gguf::GgufFile::Open(::tandem::testing::TestDataPath("tiny_spm.gguf"));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  auto vocab = VocabFromGguf(**file);
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  if (!vocab.ok()) return nullptr;
  auto tok = Tokenizer::Create(*std::move(vocab));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

TEST(TinySpmTest, VocabMetadata) {
  auto tok = LoadTinySpm();
  ASSERT_NE(tok, nullptr);
  const Vocab& v = tok->vocab();
  EXPECT_EQ(v.kind, VocabKind::kSpm);
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_TRUE(v.add_bos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_TRUE(tok->IsEog(2));
  EXPECT_EQ(v.token_types[0], TokenType::kUnknown);
  EXPECT_EQ(v.token_types[1], TokenType::kControl);
  int num_byte = 0;
  for (TokenType t : v.token_types) num_byte += t == TokenType::kByte;
  EXPECT_EQ(num_byte, 256);
}

TEST(TinySpmTest, MatchesReferenceIdsOnEveryGoldenString) {
  auto tok = LoadTinySpm();
  ASSERT_NE(tok, nullptr);
  const auto rows =
      ::tandem::testing::ReadJsonl(::tandem::testing::TestDataPath("tokenizer_tiny_spm.jsonl"));
  ASSERT_GE(rows.size(), 300u);
  int num_mismatch = 0, num_byte_fallback = 0;
  for (const Json& row : rows) {
    const std::string& text = row["text"].str;
    const std::vector<int32_t> got = tok->Encode(text, /*add_special=*/false,
                                                 /*parse_special=*/true);
    if (got != row["ids"].ints()) {
      ++num_mismatch;
      ADD_FAILURE() << "ids differ for " << ::testing::PrintToString(text);
    }
    for (int32_t id : got) {
      if (tok->vocab().token_types[id] == TokenType::kByte) {
        ++num_byte_fallback;
        break;
      }
    }
    if (!row.has("chosen")) {  // no special-token text
      EXPECT_EQ(tok->Decode(got), text) << ::testing::PrintToString(text);
    }
  }
  EXPECT_EQ(num_mismatch, 0);
  EXPECT_GT(num_byte_fallback, 50) << "goldens should exercise byte fallback";
}

TEST(TinySpmTest, BosSpacePrefixAndByteFallback) {
  auto tok = LoadTinySpm();
  ASSERT_NE(tok, nullptr);
  const auto with_bos = tok->Encode("hello", /*add_special=*/true, true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()),
            tok->Encode("hello", false, true));
  EXPECT_EQ(tok->Decode(with_bos, /*skip_special=*/true), "hello");
  // The space prefix: "hello" encodes as "▁hello" pieces.
  EXPECT_EQ(tok->TokenToPiece(tok->Encode("hello", false, true)[0])[0], ' ');
  // A character outside the vocab becomes its UTF-8 bytes.
  const auto ids = tok->Encode("\xF0\x9F\xA7\xAC", false, true);  // 🧬
  ASSERT_GE(ids.size(), 4u);
  for (size_t i = ids.size() - 4; i < ids.size(); ++i) {
    EXPECT_EQ(tok->vocab().token_types[ids[i]], TokenType::kByte);
  }
  EXPECT_EQ(tok->Decode(ids), "\xF0\x9F\xA7\xAC");
  // Streaming holds the first three bytes back.
  StreamingDetokenizer detok(*tok);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) out += detok.Push(ids[i]);
  EXPECT_EQ(out.find('\xF0'), std::string::npos);
  out += detok.Push(ids.back());
  EXPECT_EQ(out + detok.Flush(), "\xF0\x9F\xA7\xAC");
}

TEST(TinySpmTest, InvalidUtf8RoundTrips) {
  auto tok = LoadTinySpm();
  ASSERT_NE(tok, nullptr);
  for (std::string s : {std::string("a\xFF"
                                    "b"),
                        std::string("\xE4\xB8"), std::string("\x80x"), std::string("ok \xC3")}) {
    EXPECT_EQ(tok->Decode(tok->Encode(s, false, false)), s);
  }
}

TEST(TinySpmTest, StreamingMatchesDecode) {
  auto tok = LoadTinySpm();
  ASSERT_NE(tok, nullptr);
  const auto rows =
      ::tandem::testing::ReadJsonl(::tandem::testing::TestDataPath("tokenizer_tiny_spm.jsonl"));
  for (const Json& row : rows) {
    const auto ids = row["ids"].ints();
    StreamingDetokenizer detok(*tok);
    std::string all;
    for (int32_t id : ids) all += detok.Push(id);
    all += detok.Flush();
    EXPECT_EQ(all, tok->Decode(ids)) << ::testing::PrintToString(row["text"].str);
  }
  // A continuation keeps the leading space Decode drops.
  const auto ids = tok->Encode("hi", false, false);
  StreamingDetokenizer cont(*tok, {.continuation = true});
  std::string s;
  for (int32_t id : ids) s += cont.Push(id);
  EXPECT_EQ(s + cont.Flush(), " hi");
}

}  // namespace
}  // namespace tandem::tokenizer
