#include "common/thread_pool.h"

#include <algorithm>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() \
  do {                     \
  } while (0)
#endif

namespace tandem {
namespace {

// Idle workers poll this many times before blocking: a decode step issues
// hundreds of short loops, and a futex wake per loop would dominate them.
constexpr int kSpinPolls = 4000;
// The smallest chunk is at least 1 / (kTailChunksPerThread * threads) of the
// loop (and at least min_range).
constexpr int64_t kTailChunksPerThread = 8;

// claim_ layout: generation (32 bits) | chunk count (16) | next chunk (16).
uint32_t GenOf(uint64_t claim) { return static_cast<uint32_t>(claim >> 32); }
int64_t ChunksOf(uint64_t claim) { return static_cast<int64_t>((claim >> 16) & 0xffff); }
int64_t NextOf(uint64_t claim) { return static_cast<int64_t>(claim & 0xffff); }
static_assert(ThreadPool::kMaxChunks <= 0xffff, "claim_ holds chunk counts in 16 bits");

}  // namespace

int64_t ThreadPool::PlanChunks(int64_t n, int64_t min_range) {
  const int64_t p = num_threads_;
  const int64_t smallest =
      std::max(min_range, (n + kTailChunksPerThread * p - 1) / (kTailChunksPerThread * p));
  int64_t chunks = 0;
  bounds_[0] = 0;
  for (int64_t begin = 0; begin < n; ++chunks) {
    const int64_t left = n - begin;
    int64_t size = std::max(smallest, (left + p - 1) / p);
    if (left - size < smallest || chunks + 1 == kMaxChunks) size = left;
    begin += size;
    bounds_[chunks + 1] = begin;
  }
  return chunks;
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint32_t gen) {
  uint64_t cur = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (GenOf(cur) != gen) return;
    const int64_t chunks = ChunksOf(cur);
    const int64_t i = NextOf(cur);
    if (i >= chunks) return;
    if (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
    // Chunk i of `gen` is ours, and `gen` cannot complete before we finish
    // it, so the job fields (written before `gen` was published) are still
    // its own: read them only now. Reading them before the claim let a late
    // worker pair an old generation's claim with a newer job's fields, run a
    // chunk that did not exist and overcount done_ (a hang).
    const RangeFn* fn = job_.load(std::memory_order_acquire);
    (*fn)(bounds_[i], bounds_[i + 1]);
    done_.fetch_add(1, std::memory_order_acq_rel);
    cur = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::ParallelFor(int64_t n, RangeFn fn, int64_t min_range) {
  if (n <= 0) return;
  min_range = std::max<int64_t>(1, min_range);
  if (num_threads_ == 1 || n / min_range < 2) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const int64_t chunks = PlanChunks(n, min_range);
  const uint32_t gen = GenOf(claim_.load(std::memory_order_relaxed)) + 1;
  job_.store(&fn, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    claim_.store((uint64_t{gen} << 32) | (static_cast<uint64_t>(chunks) << 16),
                 std::memory_order_release);
  }
  work_cv_.notify_all();
  RunChunks(gen);
  // Another thread is finishing its last chunk. Spin briefly (it is usually
  // microseconds away), then yield: when the cores are oversubscribed (a
  // prefill and a decode worker on one machine) that thread may be
  // descheduled, and spinning would only keep it off the core.
  for (int i = 0; done_.load(std::memory_order_acquire) != chunks; ++i) {
    if (i < kSpinPolls) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen = GenOf(claim_.load(std::memory_order_acquire));
    for (int i = 0; gen == seen && i < kSpinPolls; ++i) {
      TANDEM_CPU_RELAX();
      gen = GenOf(claim_.load(std::memory_order_acquire));
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock,
                    [&] { return stop_ || GenOf(claim_.load(std::memory_order_acquire)) != seen; });
      if (stop_) return;
      gen = GenOf(claim_.load(std::memory_order_acquire));
    }
    seen = gen;
    RunChunks(gen);
  }
}

}  // namespace tandem
