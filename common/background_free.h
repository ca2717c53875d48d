// FreeInBackground: runs a release (typically a cudaFree) on a background
// thread instead of the caller's. cudaFree synchronizes its device: called on
// an engine thread it would wait for every kernel in flight there, including
// an NCCL receive of another transfer that may wait seconds for its peer. The
// GPU-resident KV handoff's buffers (engine::KvDeviceBytes) are released this
// way, so the engine thread that drops the last reference never blocks.
//
// One process-wide thread, started at the first call, runs the releases in
// order. WaitForBackgroundFrees() returns once every release queued before
// it has run (tests, orderly shutdown).
//
// Thread safety: both functions are thread-safe.
#ifndef TANDEM_COMMON_BACKGROUND_FREE_H_
#define TANDEM_COMMON_BACKGROUND_FREE_H_

#include <functional>

namespace tandem {

void FreeInBackground(std::function<void()> release);
void WaitForBackgroundFrees();

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKGROUND_FREE_H_
