#include "engine/stop_checker.h"

#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/unicode.h"
#include "gtest/gtest.h"

namespace tandem::engine {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kText = 100;  // an ordinary token id

// Feeds `deltas` as ordinary tokens; returns the emitted text and the update
// of the last token fed.
struct FeedResult {
  std::string emitted;
  StopUpdate last;
};
FeedResult Feed(StopChecker& checker, const std::vector<std::string>& deltas) {
  FeedResult run;
  for (const std::string& delta : deltas) {
    run.last = checker.Update(kText, delta);
    run.emitted += run.last.text;
  }
  return run;
}

// Which rule ended the sequence, from the update's fields: "none", "eos",
// "stop_token", "stop_string" or "length".
std::string Why(const StopUpdate& u) {
  if (!u.finish.has_value()) return "none";
  switch (*u.finish) {
    case FinishReason::kEos:
      return u.stop_token_id >= 0 ? "eos" : "eos without its token";
    case FinishReason::kStop:
      if (u.stop_token_id >= 0 && u.stop_string.empty()) return "stop_token";
      if (u.stop_token_id < 0 && !u.stop_string.empty()) return "stop_string";
      return "stop with both or neither of token and string";
    case FinishReason::kLength:
      return "length";
    default:
      return std::string(FinishReasonName(*u.finish));
  }
}

StopChecker WithStops(std::vector<std::string> stops) {
  return StopChecker(StopParams{.stop_strings = std::move(stops)}, {kEos});
}

TEST(StopCheckerTest, EosFinishesWithoutItsTextAndReleasesHeldText) {
  StopChecker checker = WithStops({"STOP"});
  FeedResult run = Feed(checker, {"Hi ", "ST"});
  EXPECT_EQ(run.emitted, "Hi ");
  EXPECT_EQ(checker.num_held_bytes(), 2u);
  StopUpdate u = checker.Update(kEos, "</s>");
  EXPECT_EQ(Why(u), "eos");
  EXPECT_EQ(u.stop_token_id, kEos);
  EXPECT_EQ(u.text, "ST");
  EXPECT_TRUE(checker.finished());
  // Later calls change nothing.
  u = checker.Update(kText, "more");
  EXPECT_EQ(Why(u), "eos");
  EXPECT_EQ(u.text, "");
}

TEST(StopCheckerTest, IgnoreEosButMaxTokensStillApplies) {
  StopChecker checker(StopParams{.max_tokens = 3, .ignore_eos = true}, {kEos});
  EXPECT_EQ(Why(checker.Update(kEos, "")), "none");
  EXPECT_EQ(Why(checker.Update(kText, "a")), "none");
  StopUpdate u = checker.Update(kEos, "");
  EXPECT_EQ(Why(u), "length");
  EXPECT_EQ(checker.num_tokens(), 3);
}

TEST(StopCheckerTest, StopTokenIdFinishes) {
  StopChecker checker(StopParams{.stop_token_ids = {7}}, {kEos});
  EXPECT_EQ(checker.Update(kText, "x").text, "x");
  StopUpdate u = checker.Update(7, "<tool>");
  EXPECT_EQ(Why(u), "stop_token");
  EXPECT_EQ(u.stop_token_id, 7);
  EXPECT_EQ(u.text, "");
}

TEST(StopCheckerTest, MinTokensDefersTokenStops) {
  StopChecker checker(StopParams{.min_tokens = 2}, {kEos});
  // A token stop needs n > min_tokens (the sampler masks EOS until then).
  EXPECT_EQ(Why(checker.Update(kEos, "")), "none");
  EXPECT_EQ(Why(checker.Update(kEos, "")), "none");
  EXPECT_EQ(Why(checker.Update(kEos, "")), "eos");
}

TEST(StopCheckerTest, MinTokensDefersStopStrings) {
  StopChecker checker(StopParams{.min_tokens = 2, .stop_strings = {"!"}}, {kEos});
  // Token 1: "!" is plain text.
  StopUpdate u = checker.Update(kText, "a!");
  EXPECT_EQ(Why(u), "none");
  EXPECT_EQ(u.text, "a!");
  // Token 2: n >= min_tokens, a stop string may complete.
  u = checker.Update(kText, "b!c");
  EXPECT_EQ(Why(u), "stop_string");
  EXPECT_EQ(u.text, "b");
}

TEST(StopCheckerTest, StopStringSplitAcrossTwoTokens) {
  StopChecker checker = WithStops({"world"});
  FeedResult run = Feed(checker, {"Hello", " wor", "ld! more"});
  EXPECT_EQ(run.emitted, "Hello ");
  EXPECT_EQ(Why(run.last), "stop_string");
  EXPECT_EQ(run.last.stop_string, "world");
}

TEST(StopCheckerTest, StopStringSplitAcrossThreeTokens) {
  StopChecker checker = WithStops({"<|end|>"});
  StopUpdate u = checker.Update(kText, "done<|");
  EXPECT_EQ(u.text, "done");
  u = checker.Update(kText, "en");
  EXPECT_EQ(u.text, "");
  EXPECT_EQ(checker.num_held_bytes(), 4u);
  u = checker.Update(kText, "d|>tail");
  EXPECT_EQ(Why(u), "stop_string");
  EXPECT_EQ(u.text, "");
}

TEST(StopCheckerTest, StopStringThatIsAPrefixOfLaterText) {
  // "end" inside "endless": the match ends the text even mid-token.
  StopChecker checker = WithStops({"end"});
  FeedResult run = Feed(checker, {"The ", "endless", " story"});
  EXPECT_EQ(run.emitted, "The ");
  EXPECT_EQ(Why(run.last), "stop_string");
  EXPECT_EQ(checker.num_tokens(), 2);
}

TEST(StopCheckerTest, HeldTextReleasedWhenTheMatchFails) {
  StopChecker checker = WithStops({"stop!"});
  StopUpdate u = checker.Update(kText, "a sto");
  EXPECT_EQ(u.text, "a ");
  u = checker.Update(kText, "rm");
  EXPECT_EQ(Why(u), "none");
  EXPECT_EQ(u.text, "storm");
  EXPECT_EQ(checker.num_held_bytes(), 0u);
}

TEST(StopCheckerTest, OverlappingPartialMatchesAreNotLost) {
  // "aa" held; "aab" then starts one byte later than the held prefix.
  StopChecker checker = WithStops({"aab"});
  FeedResult run = Feed(checker, {"aa", "aab"});
  EXPECT_EQ(run.emitted, "aa");
  EXPECT_EQ(Why(run.last), "stop_string");
}

TEST(StopCheckerTest, EarliestOfSeveralStopStringsWins) {
  StopChecker checker = WithStops({"xyz", "b"});
  StopUpdate u = checker.Update(kText, "abxyz");
  EXPECT_EQ(u.text, "a");
  EXPECT_EQ(u.stop_string, "b");
}

TEST(StopCheckerTest, MultibyteTextAroundStopsNeverSplitsACodePoint) {
  StopChecker checker = WithStops({"終わり", "é!"});
  std::vector<std::string> deltas = {"こんにちは", "café", "?", "終", "わ", "り", "x"};
  std::string emitted;
  StopUpdate u;
  for (const std::string& delta : deltas) {
    u = checker.Update(kText, delta);
    // Every piece is whole code points.
    for (size_t pos = 0; pos < u.text.size();) {
      const size_t n = tokenizer::ValidUtf8Len(u.text, pos);
      ASSERT_GT(n, 0u) << "split code point in '" << u.text << "'";
      pos += n;
    }
    emitted += u.text;
    if (u.finish.has_value()) break;
  }
  EXPECT_EQ(Why(u), "stop_string");
  EXPECT_EQ(u.stop_string, "終わり");
  EXPECT_EQ(emitted, "こんにちはcafé?");
}

TEST(StopCheckerTest, MaxTokensReleasesHeldText) {
  StopChecker checker(StopParams{.max_tokens = 2, .stop_strings = {"abc"}}, {kEos});
  EXPECT_EQ(checker.Update(kText, "x").text, "x");
  StopUpdate u = checker.Update(kText, "ab");
  EXPECT_EQ(Why(u), "length");
  EXPECT_EQ(u.text, "ab");
}

TEST(StopCheckerTest, StopStringOnTheLastTokenBeatsLength) {
  StopChecker checker(StopParams{.max_tokens = 1, .stop_strings = {"."}}, {kEos});
  StopUpdate u = checker.Update(kText, "Hi. There");
  EXPECT_EQ(Why(u), "stop_string");
  EXPECT_EQ(u.text, "Hi");
}

TEST(StopCheckerTest, FlushReturnsHeldText) {
  StopChecker checker = WithStops({"###"});
  EXPECT_EQ(checker.Update(kText, "x##").text, "x");
  EXPECT_EQ(checker.Flush(), "##");
  EXPECT_EQ(checker.num_held_bytes(), 0u);
}

TEST(StopCheckerTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(FinishReason::kEos), "eos");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

}  // namespace
}  // namespace tandem::engine
