#include "common/thread_pool.h"

#include <atomic>
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
