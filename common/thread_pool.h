// A persistent pool of worker threads for data-parallel loops.
//
// ParallelFor(n, fn) splits [0, n) into contiguous chunks by a fixed rule
// and runs fn(begin, end) on each. The chunks shrink (guided scheduling):
// each takes 1/threads of what is left, but never less than min_range or
// 1/(8 * threads) of n. The caller, there first, takes the first and
// largest; the loop ends on small chunks, so the threads finish close
// together after few claims (each claim moves a cache line between cores:
// 2 threads make 4 or 5 per loop of 36 or more).
// Chunks are claimed dynamically: the caller works too and never waits for a
// worker that has not started (on a busy machine a sleeping worker may take
// milliseconds to be scheduled), only for chunks already running. Which
// thread runs a chunk never changes what it computes: kernels built on this
// pool give every output element to exactly one fn call with a fixed
// reduction order, so results are bit-identical for any thread count.
//
// Thread safety: ParallelFor may be called from any thread; concurrent calls
// are serialized. fn must not call ParallelFor on the same pool (deadlock).
// Workers are created once in the constructor and joined in the destructor.
#ifndef TANDEM_COMMON_THREAD_POOL_H_
#define TANDEM_COMMON_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tandem {

class ThreadPool {
 public:
  using RangeFn = absl::FunctionRef<void(int64_t begin, int64_t end)>;

  // num_threads counts the caller: 1 means everything runs inline.
  // Values < 1 are treated as 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // The most chunks one loop is split into.
  static constexpr int64_t kMaxChunks = 256;

  // Runs fn over [0, n) split into ranges; returns when all are done.
  // min_range: ranges are never smaller than this (fewer threads are used).
  void ParallelFor(int64_t n, RangeFn fn, int64_t min_range = 1);

  // Runs on `pool` if non-null, else inline.
  static void Run(ThreadPool* pool, int64_t n, RangeFn fn, int64_t min_range = 1) {
    if (pool == nullptr) {
      if (n > 0) fn(0, n);
    } else {
      pool->ParallelFor(n, fn, min_range);
    }
  }

 private:
  void WorkerLoop();
  // Claims and runs chunks of generation `gen` until none are left.
  void RunChunks(uint32_t gen);
  // Fills bounds_ for a loop over [0, n); returns the chunk count.
  int64_t PlanChunks(int64_t n, int64_t min_range);

  const int num_threads_;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // serializes ParallelFor callers

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Job generation (32 bits) | chunk count (16) | next chunk to claim (16).
  // A claim is a CAS on all three, so a late worker can never take a chunk of
  // another job, and reads the job fields only after its claim succeeded.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // chunks finished in the current job
  std::atomic<const RangeFn*> job_{nullptr};
  // Chunk i of the current job is [bounds_[i], bounds_[i + 1]). Written
  // under call_mu_ before the job is published, read only after a claim.
  int64_t bounds_[kMaxChunks + 1] = {};
  bool stop_ = false;  // guarded by mu_
};

}  // namespace tandem

#endif  // TANDEM_COMMON_THREAD_POOL_H_
