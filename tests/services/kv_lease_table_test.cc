// KvLeaseTable: reserve -> commit -> claim / release / expiry, and releases
// that overtake the push they abort (tombstones).
#include "services/transfer/kv_lease_table.h"

#include <memory>

#include "gtest/gtest.h"

namespace tandem::transfer {
namespace {

std::shared_ptr<const engine::KvExport> Kv(int tokens, int bytes_per_token) {
  auto kv = std::make_shared<engine::KvExport>();
  kv->token_ids.assign(tokens, 7);
  kv->bytes_per_token = bytes_per_token;
  kv->bytes.resize(static_cast<size_t>(tokens) * bytes_per_token);
  return kv;
}

TEST(KvLeaseTableTest, ReserveCommitClaimIsOneShot) {
  KvLeaseTable t(absl::Seconds(10), 16);
  ASSERT_TRUE(t.Reserve("a", 40 * 8, 1 << 20).ok());
  EXPECT_EQ(t.Stats().num_reserved, 1);
  EXPECT_EQ(t.Reserve("a", 8, 1 << 20).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(t.Commit("a", Kv(40, 8)));
  EXPECT_EQ(t.Stats().num_leases, 1);
  EXPECT_EQ(t.num_leased_blocks(), 3);  // ceil(40 / 16)
  auto kv = t.Claim("a");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ((*kv)->num_tokens(), 40);
  EXPECT_EQ(t.Claim("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Stats().num_bytes, 0);
  EXPECT_FALSE(t.Release("a"));  // idempotent
}

TEST(KvLeaseTableTest, CapacityCountsReservations) {
  KvLeaseTable t(absl::Seconds(10), 16);
  ASSERT_TRUE(t.Reserve("a", 600, 1000).ok());
  EXPECT_EQ(t.Reserve("b", 600, 1000).code(), absl::StatusCode::kResourceExhausted);
  t.Abort("a");
  EXPECT_TRUE(t.Reserve("b", 600, 1000).ok());
}

TEST(KvLeaseTableTest, ReleaseBeforeThePushRefusesIt) {
  KvLeaseTable t(absl::Seconds(10), 16);
  const absl::Time now = absl::Now();
  EXPECT_FALSE(t.Release("late", now));
  EXPECT_EQ(t.Reserve("late", 64, 1 << 20).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(t.Stats().num_bytes, 0);
  // The tombstone goes after one lease period.
  t.ReapExpired(now + absl::Seconds(11));
  EXPECT_TRUE(t.Reserve("late", 64, 1 << 20).ok());
}

TEST(KvLeaseTableTest, ReleaseDuringThePushDropsItAtCommit) {
  KvLeaseTable t(absl::Seconds(10), 16);
  ASSERT_TRUE(t.Reserve("mid", 8 * 5, 1 << 20).ok());
  EXPECT_FALSE(t.Release("mid"));  // nothing leased yet
  EXPECT_FALSE(t.Commit("mid", Kv(5, 8)));
  const KvLeaseStats s = t.Stats();
  EXPECT_EQ(s.num_leases, 0);
  EXPECT_EQ(s.num_reserved, 0);
  EXPECT_EQ(s.num_bytes, 0);
  EXPECT_EQ(t.Claim("mid").status().code(), absl::StatusCode::kNotFound);
}

TEST(KvLeaseTableTest, ReleaseOfALeaseFreesIt) {
  KvLeaseTable t(absl::Seconds(10), 16);
  ASSERT_TRUE(t.Reserve("x", 8, 1 << 20).ok());
  ASSERT_TRUE(t.Commit("x", Kv(1, 8)));
  EXPECT_TRUE(t.Release("x"));
  EXPECT_FALSE(t.Release("x"));
  EXPECT_EQ(t.Stats().num_leases, 0);
  EXPECT_EQ(t.Stats().num_bytes, 0);
}

TEST(KvLeaseTableTest, ExpiredLeasesAreReaped) {
  KvLeaseTable t(absl::Seconds(2), 16);
  const absl::Time now = absl::Now();
  ASSERT_TRUE(t.Reserve("e", 8, 1 << 20).ok());
  ASSERT_TRUE(t.Commit("e", Kv(1, 8), now));
  EXPECT_EQ(t.ReapExpired(now + absl::Seconds(1)), 0);
  EXPECT_EQ(t.ReapExpired(now + absl::Seconds(3)), 1);
  EXPECT_EQ(t.Stats().num_leases, 0);
  EXPECT_EQ(t.Stats().num_expired, 1);
  EXPECT_EQ(t.Claim("e").status().code(), absl::StatusCode::kNotFound);
}

TEST(KvLeaseTableTest, TombstonesStayBounded) {
  KvLeaseTable t(absl::Hours(1), 16);
  for (int i = 0; i < (1 << 16) + 10; ++i) t.Release("h" + std::to_string(i));
  // Still working, and the latest release still refuses its push.
  EXPECT_EQ(t.Reserve("h" + std::to_string((1 << 16) + 9), 8, 1 << 20).code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(t.Reserve("fresh", 8, 1 << 20).ok());
}

}  // namespace
}  // namespace tandem::transfer
