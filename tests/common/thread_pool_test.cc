#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Back-to-back jobs whose chunk counts alternate small/large, on more threads
// than cores: the pattern in which a late worker used to pair an old job's
// claim with the next job's fields, run a chunk that did not exist and hang
// the caller. Every index of every job must run exactly once.
TEST(ThreadPoolStressTest, AlternatingJobSizesRunEachIndexOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(4096);
  for (int iter = 0; iter < 100000; ++iter) {
    const int64_t n = (iter % 3 == 0) ? 2 : (iter % 3 == 1 ? 4096 : 37);
    for (int64_t i = 0; i < n; ++i) hits[i].store(0, std::memory_order_relaxed);
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[i].load(), 1) << "iteration " << iter << " index " << i;
    }
  }
}

// The guided split: ranges are contiguous, cover [0, n) once, never shorter
// than min_range, shrink, and stay few (each is a claim).
TEST(ThreadPoolTest, GuidedChunksShrinkAndRespectMinRange) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {2, 3, 36, 60, 192, 3072, 100000}) {
      for (int64_t min_range : {1, 4, 16}) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        pool.ParallelFor(
            n,
            [&](int64_t b, int64_t e) {
              std::lock_guard<std::mutex> lock(mu);
              ranges.emplace_back(b, e);
            },
            min_range);
        std::sort(ranges.begin(), ranges.end());
        const std::string where = "threads " + std::to_string(threads) + " n " + std::to_string(n) +
                                  " min_range " + std::to_string(min_range);
        ASSERT_FALSE(ranges.empty()) << where;
        EXPECT_EQ(ranges.front().first, 0) << where;
        EXPECT_EQ(ranges.back().second, n) << where;
        EXPECT_LE(int64_t(ranges.size()), ThreadPool::kMaxChunks) << where;
        if (n < 2 * min_range) {
          EXPECT_EQ(ranges.size(), 1u) << where;
          continue;
        }
        EXPECT_GE(ranges.size(), 2u) << where;
        EXPECT_GE(ranges.front().second, (n + threads - 1) / threads) << where;  // the largest
        for (size_t i = 0; i < ranges.size(); ++i) {
          EXPECT_GE(ranges[i].second - ranges[i].first, min_range) << where << " chunk " << i;
          if (i > 0) EXPECT_EQ(ranges[i].first, ranges[i - 1].second) << where;
          // Shrinking, except the last one, which takes the remainder.
          if (i > 0 && i + 1 < ranges.size()) {
            EXPECT_LE(ranges[i].second - ranges[i].first,
                      ranges[i - 1].second - ranges[i - 1].first)
                << where << " chunk " << i;
          }
        }
        // Few claims: 1/threads of what is left each time, down to n/(8 threads).
        EXPECT_LE(int64_t(ranges.size()), 8 * threads + 1) << where;
      }
    }
  }
}

TEST(ThreadPoolStressTest, MinRangeAndInlineCases) {
  ThreadPool pool(3);
  int64_t calls = 0;
  pool.ParallelFor(
      10, [&](int64_t b, int64_t e) { calls += (b == 0 && e == 10); }, 100);
  EXPECT_EQ(calls, 1);  // one chunk: runs inline
  pool.ParallelFor(0, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 1);
  ThreadPool::Run(nullptr, 5, [&](int64_t b, int64_t e) { calls += e - b; });
  EXPECT_EQ(calls, 6);
}

}  // namespace
}  // namespace tandem
