// VocabFromGguf / Tokenizer::Create on hand-built and hostile vocabularies,
// plus the UTF-8 helpers and the streaming detokenizer on a tiny BPE vocab.
#include <random>

#include "common/gguf/gguf.h"
#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "common/tokenizer/vocab.h"
#include "common/utf8.h"
#include "gtest/gtest.h"

namespace tandem::tokenizer {
namespace {

using gguf::Value;

// A tiny byte-level BPE vocab: all 256 byte tokens, then merged tokens.
struct TinyBpe {
  std::vector<std::string> tokens;
  std::vector<std::string> merges;
  std::vector<int32_t> types;
  TinyBpe() {
    tokens.push_back("<|endoftext|>");
    types.push_back(3);
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
      types.push_back(1);
    }
    for (const char* m : {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"}) {
      merges.push_back(m);
      std::string joined(m);
      joined.erase(joined.find(' '), 1);
      tokens.push_back(joined);
      types.push_back(1);
    }
  }
  gguf::GgufWriter Writer() const {
    gguf::GgufWriter w;
    w.Add("general.architecture", Value::String("llama"));
    w.Add("tokenizer.ggml.model", Value::String("gpt2"));
    w.Add("tokenizer.ggml.pre", Value::String("gpt2"));
    w.Add("tokenizer.ggml.tokens", Value::StringArray(tokens));
    w.Add("tokenizer.ggml.token_type", Value::Int32Array(types));
    w.Add("tokenizer.ggml.merges", Value::StringArray(merges));
    w.Add("tokenizer.ggml.eos_token_id", Value::Uint32(0));
    return w;
  }
};

absl::StatusOr<Vocab> FromWriter(const gguf::GgufWriter& w) {
  auto file = gguf::GgufFile::FromBuffer(w.Serialize());
  if (!file.ok()) return file.status();
  return VocabFromGguf(**file);
}

TEST(VocabTest, TinyBpeEncodesWithMerges) {
  auto vocab = FromWriter(TinyBpe().Writer());
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->eog_ids, std::vector<int32_t>{0});
  EXPECT_FALSE(vocab->add_bos);
  auto tok = Tokenizer::Create(*std::move(vocab));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto ids = (*tok)->Encode("hello world", false, true);
  ASSERT_EQ(ids.size(), 4u);  // "hello" "Ġwor" "l" "d"
  EXPECT_EQ((*tok)->TokenToPiece(ids[0]), "hello");
  EXPECT_EQ((*tok)->TokenToPiece(ids[1]), " wor");
  EXPECT_EQ((*tok)->Decode(ids), "hello world");
  EXPECT_EQ((*tok)->Encode("<|endoftext|>", false, true), std::vector<int32_t>{0});
  EXPECT_GT((*tok)->Encode("<|endoftext|>", false, false).size(), 1u);
}

void ExpectError(const gguf::GgufWriter& w, std::string_view needle) {
  auto vocab = FromWriter(w);
  ASSERT_FALSE(vocab.ok());
  EXPECT_EQ(vocab.status().code(), absl::StatusCode::kInvalidArgument) << vocab.status();
  EXPECT_NE(std::string(vocab.status().message()).find(needle), std::string::npos)
      << vocab.status();
}

TEST(VocabTest, RejectsHostileFiles) {
  {
    auto w = TinyBpe().Writer();
    w.Add("tokenizer.ggml.model", Value::String("bert"));  // later key wins or dup: either errors
    auto v = FromWriter(w);
    EXPECT_FALSE(v.ok());
  }
  {
    gguf::GgufWriter w;
    w.Add("tokenizer.ggml.model", Value::String("t5"));
    w.Add("tokenizer.ggml.tokens", Value::StringArray({"a"}));
    ExpectError(w, "unsupported tokenizer model");
  }
  {
    gguf::GgufWriter w;
    w.Add("tokenizer.ggml.tokens", Value::StringArray({"a"}));
    ExpectError(w, "tokenizer.ggml.model");
  }
  TinyBpe t;
  {
    gguf::GgufWriter w;
    w.Add("tokenizer.ggml.model", Value::String("gpt2"));
    w.Add("tokenizer.ggml.merges", Value::StringArray(t.merges));
    ExpectError(w, "tokenizer.ggml.tokens");  // missing
  }
  {
    auto bad = t;
    bad.types.pop_back();  // one type fewer than tokens
    ExpectError(bad.Writer(), "token_type");
  }
  {
    auto bad = t;
    bad.types[5] = 99;
    ExpectError(bad.Writer(), "unknown type");
  }
  {
    auto bad = t;
    bad.merges.push_back("h zzz");  // names an unknown token
    ExpectError(bad.Writer(), "unknown token");
  }
  {
    auto bad = t;
    bad.merges.push_back("nospace");
    ExpectError(bad.Writer(), "malformed");
  }
  {
    auto w = t.Writer();
    w.Add("tokenizer.ggml.bos_token_id", Value::Uint32(1000000));
    ExpectError(w, "out of range");
  }
  {
    auto w = t.Writer();
    w.Add("tokenizer.ggml.scores", Value::Float32Array({1.0f, 2.0f}));
    ExpectError(w, "scores");
  }
  {
    gguf::GgufWriter w;
    w.Add("tokenizer.ggml.model", Value::String("gpt2"));
    w.Add("tokenizer.ggml.tokens", Value::Int32Array({1, 2, 3}));  // wrong element type
    ExpectError(w, "tokenizer.ggml.tokens");
  }
  {
    gguf::GgufWriter w;
    w.Add("tokenizer.ggml.model", Value::String("gpt2"));
    w.Add("tokenizer.ggml.tokens", Value::StringArray({}));
    ExpectError(w, "tokenizer.ggml.tokens");
  }
  {
    auto w = t.Writer();
    w.Add("tokenizer.ggml.add_bos_token", Value::String("yes"));  // wrong type
    ExpectError(w, "add_bos_token");
  }
}

TEST(VocabTest, UnknownPreTokenizerIsAnError) {
  auto w = TinyBpe().Writer();
  auto vocab = FromWriter(w);
  ASSERT_TRUE(vocab.ok());
  vocab->pre = "tekken-v99";
  auto tok = Tokenizer::Create(*vocab);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(std::string(tok.status().message()).find("tekken-v99"), std::string::npos);
  for (const char* pre : {"smollm", "gpt2", "llama-bpe", "qwen2", "default", ""}) {
    vocab->pre = pre;
    auto ok = Tokenizer::Create(*vocab);
    ASSERT_TRUE(ok.ok()) << pre << ": " << ok.status();
    EXPECT_EQ((*ok)->Decode((*ok)->Encode("Hi 12345 there!\n\n", false, true)),
              "Hi 12345 there!\n\n");
  }
}

TEST(VocabTest, CreateValidatesHandBuiltVocab) {
  auto vocab = FromWriter(TinyBpe().Writer());
  ASSERT_TRUE(vocab.ok());
  Vocab bad = *vocab;
  bad.eos_id = bad.size();
  EXPECT_FALSE(Tokenizer::Create(bad).ok());
  bad = *vocab;
  bad.scores.pop_back();
  EXPECT_FALSE(Tokenizer::Create(bad).ok());
  bad = *vocab;
  bad.add_bos = true;  // no bos id
  EXPECT_FALSE(Tokenizer::Create(bad).ok());
}

TEST(VocabTest, MutatedImagesNeverCrash) {
  const std::string image = TinyBpe().Writer().Serialize();
  std::mt19937 rng(42);
  int num_ok = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string m = image;
    const int flips = 1 + rng() % 4;
    for (int i = 0; i < flips; ++i) m[rng() % m.size()] = static_cast<char>(rng());
    auto file = gguf::GgufFile::FromBuffer(m);
    if (!file.ok()) continue;
    auto vocab = VocabFromGguf(**file);
    if (!vocab.ok()) continue;
    auto tok = Tokenizer::Create(*std::move(vocab));
    if (!tok.ok()) continue;
    ++num_ok;
    const auto ids = (*tok)->Encode("hello world <|endoftext|>", true, true);
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < (*tok)->vocab_size());
    (void)(*tok)->Decode(ids);
  }
  EXPECT_GT(num_ok, 0);  // many flips land in token text and stay valid
}

TEST(Utf8Test, Helpers) {
  EXPECT_EQ(ValidUtf8Len("a", 0), 1u);
  EXPECT_EQ(ValidUtf8Len("\xC3\xA9", 0), 2u);
  EXPECT_EQ(ValidUtf8Len("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(ValidUtf8Len("\xC0\x80", 0), 0u);          // overlong
  EXPECT_EQ(ValidUtf8Len("\xED\xA0\x80", 0), 0u);      // surrogate
  EXPECT_EQ(ValidUtf8Len("\xF4\x90\x80\x80", 0), 0u);  // > U+10FFFF
  EXPECT_EQ(ValidUtf8Len("\x80", 0), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xE4"), 1u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xFF"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xC0"), 0u);  // can never complete
  EXPECT_EQ(IncompleteUtf8Suffix("\x80\x80"), 0u);
  EXPECT_TRUE(utf8::IsValidUtf8(""));
  EXPECT_TRUE(utf8::IsValidUtf8("a\xC3\xA9\xF0\x9F\x98\x80z"));
  EXPECT_FALSE(utf8::IsValidUtf8("ab\xF0\x9F\x98"));  // truncated at the end
  EXPECT_FALSE(utf8::IsValidUtf8("a\xC0\x80 b"));     // overlong in the middle
  EXPECT_FALSE(utf8::IsValidUtf8("\xED\xA0\x80"));    // surrogate
  EXPECT_FALSE(utf8::IsValidUtf8("a\x80"));           // stray continuation byte
  EXPECT_EQ(SanitizeUtf8("a\xFF\xFE"
                         "b\xE4"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(BytesToByteLevel(" \n"), "\xC4\xA0\xC4\x8A");  // "ĠĊ"
  for (int b = 0; b < 256; ++b) {
    const std::string raw(1, static_cast<char>(b));
    EXPECT_EQ(ByteLevelToBytes(BytesToByteLevel(raw)), raw);
  }
}

TEST(DetokenizerTest, HoldsBackSplitCharacters) {
  auto vocab = FromWriter(TinyBpe().Writer());
  ASSERT_TRUE(vocab.ok());
  auto tok = Tokenizer::Create(*std::move(vocab));
  ASSERT_TRUE(tok.ok());
  const std::string text = "h\xE4\xB8\xAD\xF0\x9F\x98\x80!";  // h 中 😀 !
  const auto ids = (*tok)->Encode(text, false, true);
  StreamingDetokenizer detok(**tok);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(detok.Push(id));
  deltas.push_back(detok.Flush());
  // Byte tokens: h, E4, B8, AD, F0, 9F, 98, 80, !
  const std::vector<std::string> want = {
      "h", "", "", "\xE4\xB8\xAD", "", "", "", "\xF0\x9F\x98\x80", "!", ""};
  EXPECT_EQ(deltas, want);
  // Control tokens can be skipped; the detokenizer is reusable after Flush.
  StreamingDetokenizer skip(**tok, {.skip_special = true});
  EXPECT_EQ(skip.Push(0), "");
  EXPECT_EQ(detok.Push(0), "<|endoftext|>");
  EXPECT_EQ(detok.Push(-5), "");
  EXPECT_EQ(detok.Push(1 << 30), "");
}

}  // namespace
}  // namespace tandem::tokenizer
