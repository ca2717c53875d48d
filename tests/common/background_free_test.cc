// FreeInBackground: releases run on one other thread, in order, each once,
// and WaitForBackgroundFrees returns only after those queued before it ran.
#include "common/background_free.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(BackgroundFreeTest, RunsEveryReleaseOnceInOrderOffTheCallersThread) {
  std::mutex mu;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  const std::thread::id caller = std::this_thread::get_id();
  for (int i = 0; i < 200; ++i) {
    FreeInBackground([&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      threads.insert(std::this_thread::get_id());
    });
  }
  FreeInBackground(nullptr);  // ignored
  WaitForBackgroundFrees();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), caller);
}

TEST(BackgroundFreeTest, ManyPostersAndAWaiterEach) {
  std::atomic<int> ran{0};
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < 100; ++i) FreeInBackground([&] { ran.fetch_add(1); });
      WaitForBackgroundFrees();
      EXPECT_GE(ran.load(), 100);  // at least this poster's own
    });
  }
  for (std::thread& p : posters) p.join();
  WaitForBackgroundFrees();
  EXPECT_EQ(ran.load(), 400);
}

}  // namespace
}  // namespace tandem
