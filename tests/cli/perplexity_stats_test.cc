// The arithmetic of `tandem perplexity` on hand-checkable distributions, and
// the KLD base file: round trip, and every corruption refused with an error.
#include "services/cli/perplexity_stats.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/cli/kld_base.h"

namespace tandem::cli {
namespace {

TEST(PerplexityStatsTest, ScoreTokenOnUniformAndSkewedRows) {
  // Uniform over 4: nll = log 4, p = 1/4, argmax the first of the ties.
  const std::vector<float> uniform = {2, 2, 2, 2};
  TokenScore s = ScoreToken(uniform, 3);
  EXPECT_NEAR(s.nll, std::log(4.0), 1e-12);
  EXPECT_NEAR(s.p, 0.25, 1e-12);
  EXPECT_EQ(s.argmax, 0);
  // logits log(1), log(2), log(5): p = 1/8, 2/8, 5/8.
  const std::vector<float> skewed = {0.0f, std::log(2.0f), std::log(5.0f)};
  s = ScoreToken(skewed, 1);
  EXPECT_NEAR(s.nll, std::log(4.0), 1e-6);
  EXPECT_NEAR(s.p, 0.25, 1e-6);
  EXPECT_EQ(s.argmax, 2);
  // Large logits do not overflow.
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_NEAR(ScoreToken(big, 0).nll, std::log(2.0), 1e-9);
}

TEST(PerplexityStatsTest, PplAndErrorAsLlamaCpp) {
  PplAccumulator acc;
  // NLLs 1, 2, 3: mean 2, E[x^2] = 14/3, var = 2/3, se = sqrt(2/3 / 2).
  acc.Add(1);
  acc.Add(2);
  acc.Add(3);
  EXPECT_EQ(acc.count(), 3);
  EXPECT_NEAR(acc.Ppl(), std::exp(2.0), 1e-12);
  EXPECT_NEAR(acc.PplError(), std::exp(2.0) * std::sqrt((2.0 / 3.0) / 2.0), 1e-12);
  PplAccumulator constant;
  constant.Add(0.5);
  constant.Add(0.5);
  EXPECT_NEAR(constant.Ppl(), std::exp(0.5), 1e-12);
  EXPECT_EQ(constant.PplError(), 0.0);  // zero variance
  PplAccumulator one;
  one.Add(1.0);
  EXPECT_EQ(one.PplError(), 0.0);  // fewer than 2 tokens
}

TEST(PerplexityStatsTest, PercentileInterpolatesLikeLlamaCpp) {
  const std::vector<double> v = {0, 10, 20, 30, 40};
  EXPECT_EQ(Percentile(v, 0.0), 0);
  EXPECT_EQ(Percentile(v, 1.0), 40);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 20);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.99), 39.6);  // 0.99 * 4 = 3.96
  EXPECT_DOUBLE_EQ(Percentile(v, 0.1), 4);
  EXPECT_EQ(Percentile(std::vector<double>{}, 0.5), 0);
}

TEST(PerplexityStatsTest, TopKOrdersByProbabilityThenId) {
  const std::vector<double> lp = {std::log(0.1), std::log(0.4), std::log(0.1), std::log(0.4)};
  const std::vector<TopEntry> top = TopK(lp, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 3);
  EXPECT_EQ(top[2].id, 0);
  EXPECT_EQ(TopK(lp, 99).size(), 4u);  // clamped
}

TEST(PerplexityStatsTest, TopKKldExactWithFullVocabAndCoarsenedOtherwise) {
  // P = (1/2, 1/4, 1/4), Q = (1/4, 1/4, 1/2):
  // KL = 1/2 log 2 + 0 + 1/4 log(1/2) = 1/4 log 2.
  const std::vector<double> p = {std::log(0.5), std::log(0.25), std::log(0.25)};
  const std::vector<double> q = {std::log(0.25), std::log(0.25), std::log(0.5)};
  EXPECT_NEAR(TopKKld(TopK(p, 3), q), 0.25 * std::log(2.0), 1e-7);
  // Top-1 of P (token 0) + tail {1, 2}: P' = (1/2, 1/2), Q' = (1/4, 3/4):
  // KL = 1/2 log 2 + 1/2 log(2/3).
  const double coarse = 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0);
  EXPECT_NEAR(TopKKld(TopK(p, 1), q), coarse, 1e-7);
  EXPECT_LE(coarse, 0.25 * std::log(2.0));  // a lower bound of the full KL
  // A distribution against itself: 0 at any K.
  for (int k = 1; k <= 3; ++k) EXPECT_NEAR(TopKKld(TopK(p, k), p), 0, 1e-7) << k;
}

TEST(PerplexityStatsTest, LogSoftmaxNormalizes) {
  const std::vector<float> logits = {1, 2, 3, -50};
  std::vector<double> lp;
  LogSoftmax(logits, &lp);
  double sum = 0;
  for (double v : lp) sum += std::exp(v);
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_NEAR(lp[2] - lp[1], 1.0, 1e-12);
}

TEST(PerplexityStatsTest, KldSummaryOfIdenticalRunsIsZeroAndOfKnownRuns) {
  KldAccumulator same;
  const std::vector<float> a = {0.0f, std::log(2.0f), std::log(5.0f)};
  std::vector<double> lp;
  LogSoftmax(a, &lp);
  for (int32_t t = 0; t < 3; ++t) {
    const TokenScore s = ScoreToken(a, t);
    same.Add(s, s.nll, TopK(lp, 1)[0].id, TopKKld(TopK(lp, 3), lp));
  }
  KldSummary s = same.Summarize();
  EXPECT_EQ(s.count, 3);
  EXPECT_NEAR(s.kld.mean, 0, 1e-7);  // log-probs are stored as f32
  EXPECT_NEAR(s.kld_max, 0, 1e-7);
  EXPECT_DOUBLE_EQ(s.same_top.mean, 1.0);
  EXPECT_NEAR(s.ppl, s.ppl_base, 1e-12);
  EXPECT_NEAR(s.ln_ppl_ratio.mean, 0, 1e-12);
  EXPECT_NEAR(s.cor_ln_ppl, 1.0, 1e-9);
  EXPECT_NEAR(s.delta_p.mean, 0, 1e-12);

  // Two tokens: KLD 0.1 and 0.3, top-1 matching once, p 0.5 vs base 0.25.
  KldAccumulator two;
  TokenScore cur;
  cur.nll = std::log(2.0);
  cur.p = 0.5;
  cur.argmax = 7;
  two.Add(cur, std::log(4.0), 7, 0.1);
  two.Add(cur, std::log(4.0), 8, 0.3);
  s = two.Summarize();
  EXPECT_NEAR(s.kld.mean, 0.2, 1e-12);
  EXPECT_NEAR(s.kld.error, 0.1, 1e-12);  // sqrt(var 0.01 / 1)
  EXPECT_NEAR(s.kld_median, 0.2, 1e-12);
  EXPECT_NEAR(s.kld_p99, 0.298, 1e-12);
  EXPECT_NEAR(s.kld_max, 0.3, 1e-12);
  EXPECT_NEAR(s.same_top.mean, 0.5, 1e-12);
  EXPECT_NEAR(s.delta_p.mean, 0.25, 1e-12);
  EXPECT_NEAR(s.ppl, 2.0, 1e-12);
  EXPECT_NEAR(s.ppl_base, 4.0, 1e-12);
  EXPECT_NEAR(s.ln_ppl_ratio.mean, -std::log(2.0), 1e-12);
  EXPECT_NEAR(two.LnPplRatio().mean, -std::log(2.0), 1e-12);
}

// ---------------------------------------------------------------- base file

class KldBaseFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/kld_base_test_" + std::to_string(getpid()) + ".kld";
    header_.model_fingerprint = 0x1234;
    header_.vocab_fingerprint = HashVocab(std::vector<std::string>{"a", "b", "c", "d", "e"});
    header_.tokens_hash = HashTokens(std::vector<int32_t>{1, 2, 3});
    header_.n_vocab = 5;
    header_.n_ctx = 8;
    header_.n_chunks = 2;
    header_.scored_per_chunk = 3;
    header_.top_k = 2;
    header_.model_name = "tiny.gguf";
  }
  void TearDown() override { std::remove(path_.c_str()); }

  KldBaseRecord Record(int i) const {
    KldBaseRecord r;
    r.nll = 0.5f + i;
    r.top = {{i % 5, std::log(0.5f)}, {(i + 1) % 5, std::log(0.25f)}};
    return r;
  }

  void WriteGood() {
    auto w = KldBaseWriter::Create(path_, header_);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int i = 0; i < 6; ++i) ASSERT_TRUE((*w)->Append(Record(i)).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }

  std::string Bytes() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void SetBytes(const std::string& b) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  }

  // Opens and reads every record; the first error.
  absl::Status ReadAll() const {
    auto r = KldBaseReader::Open(path_);
    if (!r.ok()) return r.status();
    KldBaseRecord rec;
    const uint64_t n = uint64_t{(*r)->header().n_chunks} * (*r)->header().scored_per_chunk;
    for (uint64_t i = 0; i < n; ++i) {
      if (absl::Status s = (*r)->Next(&rec); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::string path_;
  KldBaseHeader header_;
};

TEST_F(KldBaseFileTest, RoundTrip) {
  WriteGood();
  EXPECT_EQ(Bytes().size(), header_.HeaderBytes() + 6 * header_.RecordBytes());
  auto r = KldBaseReader::Open(path_);
  ASSERT_TRUE(r.ok()) << r.status();
  const KldBaseHeader& h = (*r)->header();
  EXPECT_EQ(h.model_fingerprint, header_.model_fingerprint);
  EXPECT_EQ(h.vocab_fingerprint, header_.vocab_fingerprint);
  EXPECT_EQ(h.tokens_hash, header_.tokens_hash);
  EXPECT_EQ(h.n_vocab, 5u);
  EXPECT_EQ(h.n_ctx, 8u);
  EXPECT_EQ(h.n_chunks, 2u);
  EXPECT_EQ(h.scored_per_chunk, 3u);
  EXPECT_EQ(h.top_k, 2u);
  EXPECT_EQ(h.model_name, "tiny.gguf");
  for (int i = 0; i < 6; ++i) {
    KldBaseRecord rec;
    ASSERT_TRUE((*r)->Next(&rec).ok());
    EXPECT_EQ(rec.nll, Record(i).nll);
    ASSERT_EQ(rec.top.size(), 2u);
    EXPECT_EQ(rec.top[0].id, Record(i).top[0].id);
    EXPECT_EQ(rec.top[1].logprob, Record(i).top[1].logprob);
  }
  KldBaseRecord extra;
  EXPECT_FALSE((*r)->Next(&extra).ok());
}

TEST_F(KldBaseFileTest, WriterRefusesIncompleteAndWrongRecords) {
  auto w = KldBaseWriter::Create(path_, header_);
  ASSERT_TRUE(w.ok());
  KldBaseRecord wrong = Record(0);
  wrong.top.pop_back();
  EXPECT_FALSE((*w)->Append(wrong).ok());
  ASSERT_TRUE((*w)->Append(Record(0)).ok());
  const absl::Status s = (*w)->Finish();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("incomplete"), std::string::npos) << s;
  // Nothing that looks like a base is left behind, finished or abandoned.
  EXPECT_FALSE(KldBaseReader::Open(path_).ok());
  EXPECT_FALSE(std::ifstream(path_ + ".partial").good());
  {
    auto abandoned = KldBaseWriter::Create(path_, header_);
    ASSERT_TRUE(abandoned.ok());
    ASSERT_TRUE((*abandoned)->Append(Record(0)).ok());
  }
  EXPECT_FALSE(std::ifstream(path_).good());
  EXPECT_FALSE(std::ifstream(path_ + ".partial").good());
  KldBaseHeader bad = header_;
  bad.top_k = 6;  // above the vocab
  EXPECT_FALSE(KldBaseWriter::Create(path_, bad).ok());
}

TEST_F(KldBaseFileTest, EveryTruncationIsAClearError) {
  WriteGood();
  const std::string good = Bytes();
  for (size_t len = 0; len < good.size(); ++len) {
    SetBytes(good.substr(0, len));
    const absl::Status s = ReadAll();
    ASSERT_FALSE(s.ok()) << "truncated to " << len;
    EXPECT_NE(s.message().find(path_), std::string::npos) << s;
  }
  SetBytes(good + "x");
  const absl::Status trailing = ReadAll();
  EXPECT_FALSE(trailing.ok());
  EXPECT_NE(trailing.message().find("trailing"), std::string::npos) << trailing;
}

TEST_F(KldBaseFileTest, CorruptedFieldsAreRefused) {
  WriteGood();
  const std::string good = Bytes();
  const size_t rec0 = header_.HeaderBytes();
  auto patch = [&](size_t at, const void* v, size_t n) {
    std::string b = good;
    b.replace(at, n, static_cast<const char*>(v), n);
    SetBytes(b);
    return ReadAll();
  };
  const uint32_t big = 0xFFFFFFFFu, zero = 0, two = 2;
  const float nan = std::nanf(""), positive = 1.0f, neg = -1.0f, lower = -5.0f;
  struct Case {
    const char* what;
    size_t at;
    const void* v;
    size_t n;
  };
  const Case cases[] = {
      {"magic", 0, "XXXXXXXX", 8},
      {"version", 8, &two, 4},
      {"header size", 12, &big, 4},
      {"n_vocab 0", 40, &zero, 4},
      {"n_vocab huge", 40, &big, 4},
      {"n_ctx huge", 44, &big, 4},
      {"n_chunks huge", 48, &big, 4},  // size no longer matches
      {"n_chunks 0", 48, &zero, 4},
      {"scored 0", 52, &zero, 4},
      {"top_k 0", 56, &zero, 4},
      {"top_k huge", 56, &big, 4},
      {"name length", 60, &big, 4},
      {"nll NaN", rec0, &nan, 4},
      {"nll negative", rec0, &neg, 4},
      {"id outside vocab", rec0 + 4, &big, 4},
      {"log-prob NaN", rec0 + 8, &nan, 4},
      {"log-prob above 0", rec0 + 8, &positive, 4},
      {"log-probs unsorted", rec0 + 8, &lower, 4},
  };
  for (const Case& c : cases) {
    const absl::Status s = patch(c.at, c.v, c.n);
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
  }
  // Probability mass above 1: two entries of log(0.9).
  std::string b = good;
  const float lp = std::log(0.9f);
  b.replace(rec0 + 8, 4, reinterpret_cast<const char*>(&lp), 4);
  b.replace(rec0 + 16, 4, reinterpret_cast<const char*>(&lp), 4);
  SetBytes(b);
  EXPECT_FALSE(ReadAll().ok());
  // A missing file and a directory.
  EXPECT_FALSE(KldBaseReader::Open(path_ + ".missing").ok());
  EXPECT_FALSE(KldBaseReader::Open(::testing::TempDir()).ok());
}

// Random byte flips anywhere never crash: every outcome is OK or an error.
TEST_F(KldBaseFileTest, RandomCorruptionNeverCrashes) {
  WriteGood();
  const std::string good = Bytes();
  uint64_t state = 88172645463325252ull;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string b = good;
    const int flips = 1 + iter % 4;
    for (int f = 0; f < flips; ++f) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      b[state % b.size()] = static_cast<char>(state >> 32);
    }
    SetBytes(b);
    (void)ReadAll();
  }
}

}  // namespace
}  // namespace tandem::cli
