#include "common/background_free.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace tandem {
namespace {

class Releaser {
 public:
  Releaser() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Post(std::function<void()> release) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(release));
      ++posted_;
    }
    cv_.notify_all();
  }

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = posted_;
    cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return !queue_.empty(); });
      std::function<void()> release = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      release();
      release = nullptr;
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t posted_ = 0;
  uint64_t done_ = 0;
  std::thread thread_;
};

// Never destroyed: releases may be posted from static destructors, and the
// detached thread uses it until the process ends.
Releaser& TheReleaser() {
  static Releaser* r = new Releaser();
  return *r;
}

}  // namespace

void FreeInBackground(std::function<void()> release) {
  if (release) TheReleaser().Post(std::move(release));
}

void WaitForBackgroundFrees() { TheReleaser().Wait(); }

}  // namespace tandem
