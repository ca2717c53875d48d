// CallQueue's notifier (services/router/backend.h): what the gRPC Generate
// reactor relies on to be woken instead of polling.
#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "services/router/backend.h"

namespace tandem::router {
namespace {

BackendEvent Token(int32_t id) {
  BackendEvent e;
  e.token_ids.push_back(id);
  return e;
}

TEST(CallQueueTest, NotifierSeesEventsPushedBeforeAndAfterItWasSet) {
  CallQueue q;
  q.Push(Token(1));
  std::vector<int32_t> seen;
  q.SetNotify([&] {
    while (std::optional<BackendEvent> e = q.TryPop()) seen.push_back(e->token_ids[0]);
  });
  EXPECT_EQ(seen, std::vector<int32_t>({1}));  // the one already queued
  q.Push(Token(2));
  q.Push(Token(3));
  EXPECT_EQ(seen, std::vector<int32_t>({1, 2, 3}));
  q.ClearNotify();
  q.Push(Token(4));  // no notifier: stays queued
  EXPECT_EQ(seen.size(), 3u);
  std::optional<BackendEvent> e = q.TryPop();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->token_ids[0], 4);
  EXPECT_FALSE(q.TryPop().has_value());
}

TEST(CallQueueTest, ClearNotifyWaitsForARunningNotification) {
  CallQueue q;
  absl::Notification entered, release;
  std::atomic<bool> returned{false};
  bool first = true;
  q.SetNotify([&] {
    if (first) {  // the call from SetNotify itself
      first = false;
      return;
    }
    entered.Notify();
    release.WaitForNotification();
    returned.store(true);
  });
  std::thread pusher([&] { q.Push(Token(1)); });
  entered.WaitForNotification();
  std::atomic<bool> cleared{false};
  std::thread clearer([&] {
    q.ClearNotify();
    // Whatever the notifier points to may go now: it has returned.
    EXPECT_TRUE(returned.load());
    cleared.store(true);
  });
  // ClearNotify cannot return while the notification runs.
  EXPECT_FALSE(cleared.load());
  release.Notify();
  clearer.join();
  pusher.join();
  EXPECT_TRUE(cleared.load());
}

}  // namespace
}  // namespace tandem::router
